"""Typed values in a log line: what an operator's exact answer is copied from.

Owns the value kinds and their extraction (`values_of`: each value with its span, so `text[start:end]` is the value
as the line writes it), a value's lookup key (`key_of`) and the suffix stemmer questions and lines are matched with
(`stem`). Runs once per line in the ingest actor (pipeline/stream/archive.py stores the values), so every pattern is
compiled once and a line costs a handful of regex scans, each linear in the line (no pattern backtracks over a run
from each of its starts; a span taken is checked by its characters: tests/pipeline/test_patterns_linear.py). Never
touches SQLite, the ring or a model.

Kinds: `time` (the line's first timestamp: ISO with a zone, 2024/02/16 06:05:22.113, syslog, ctime, an access
log's, epoch seconds...), `clock` (its time of day, when the timestamp has a date too: "19:18:14,511" of "2015-07-29
19:18:14,511"), `alarm` (a TEP line's whole alarm type: "H", "HH NR"), `addr` (IPv4:port), `ip`, `port`
("10.0.0.1:22", "host:8030", "port 22"), `path` (/unix/like, C:\\windows\\like, a URL: hdfs://host:9000,
file:/D:/x.jar, a bare file name: chrome.exe, machine.inf; a URL's host and port are read too, as `host` or `ip` and
`port`), `host` (a host name before ":port", a name ending in a top-level domain: ns.example.com), `size` (a number
with a byte unit: "1024 kB", "28.0 KB"), `number` (any other number, decimals kept: "28.0", "0.32285523", "1000 ms"
with its unit), `id` (block, task, attempt, container ids, hex ids, TEP tags, anything of letters, digits, `_`, `-`,
`.`, `:` holding a letter and a digit: "broadcast_3", "FIR123", "blk_-1608999687919862906"), `user` (the name after
"user", quoted or not, or after "for" in a line about logins), `status` (a level or outcome word: ERROR, failed,
closed; on a TEP alarm line its type H/HH/L/LL and NR; Android logcat's level letter; PostgreSQL's LOG, PANIC,
DEBUG1-5 before its ":  "; an access log's HTTP status after its request, whose byte count is a `size`; a code in
capitals with an underscore: E_FAIL, SCREEN_OFF; a state in capitals a transition enters: UNASSIGNED of "from NEW to
UNASSIGNED"), `field:NAME` (the value written after "NAME=" or "NAME = ", quotes left out: "rhost=10.0.0.1",
'tag="View Lock"', "ConfigFlags = 0x0"; or quoted right after the word NAME: 'version "SSH-2.0-Go"'; read beside the
value's own kind). A span taken by a stronger kind (time, addr, ip, path, size) is not read again as a weaker one
(id, number). A positional row's cells, named by its header, are pipeline/stream/columns.py's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.stream.identifiers import TAG
from pipeline.stream.words import LEVEL_LETTERS, LEVEL_WORDS, OTHER_LEVELS, OUTCOME_WORDS


@dataclass(frozen=True)
class Value:
    kind: str
    text: str          # exactly text[start:end] of the line it came from
    start: int
    end: int


_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T-]\d{2}[:.]\d{2}[:.]\d{2}(?:[.,]\d+)?(?: ?(?:UTC|GMT|Z|[+-]\d{2}:?\d{2})\b)?"
    #   2015-10-18 18:01:47,978 / BGL's 15.42.50.67 / PostgreSQL's 2026-04-13 19:38:44.684 UTC
    r"|\b\d{4}/\d{2}/\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"                # 2024/02/16 06:05:22.113
    r"|\b\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2}(?: [+-]\d{4})?"       # an access log's 22/Jan/2019:03:56:14 +0330
    r"|\b\d{6} \d{6}\b"                                                 # HDFS: 081109 203615
    r"|\b\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}"                              # Spark: 17/06/09 20:10:46
    r"|\b\d{8}-\d{1,2}:\d{1,2}:\d{1,2}(?::\d{1,3})?"                    # HealthApp: 20171223-22:15:29:606
    r"|\b[A-Z][a-z]{2} [A-Z][a-z]{2} {1,2}\d{1,2} \d{2}:\d{2}:\d{2} \d{4}"  # ctime: Sun Dec 04 04:47:44 2005
    r"|\b[A-Z][a-z]{2} {1,2}\d{1,2} \d{2}:\d{2}:\d{2}"                  # syslog: Jun 14 15:16:01
    r"|\b\d{2}\.\d{2} \d{2}:\d{2}:\d{2}"                                # month.day: 10.30 16:49:06
    r"|\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"                       # Android: 03-17 16:13:38.811
    r"|\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?")                                # a clock: 01:32:20 (TEP)
_EPOCH = re.compile(r"(?<![\w.-])1\d{9}(?:\.\d{1,6})?(?![\w.-])")   # seconds since 1970 (2001-2033): 1320279566.452687,
#                                                                    the line's time only when it writes no other
_URL = re.compile(r"(?<![A-Za-z0-9+.-])(?>[A-Za-z0-9+.-]*?\b(?=[A-Za-z]))"
                  r"([A-Za-z][A-Za-z0-9+.-]*+:/{1,2}[^\s\]\)'\",;+]+?)(?=:\d+\+|[.:]?(?:[\s\]\)'\",;+]|$))")
#   scheme:/... (hdfs://host:9000/x, file:/D:/x.jar: group 1), a trailing "." or ":" and an ":offset+length" left out.
#   Linear: tried once per run of scheme characters, from its first word start (every start of a run ends the scheme
#   at the same ":", so the first decides; the old `\b[A-Za-z][A-Za-z0-9+.-]*:` rescanned the run from each: quadratic)
_SPLIT = re.compile(r":(\d+)\+(\d+)\b")
_AUTHORITY = re.compile(r"//(?:[^@/\s]*@)?([A-Za-z0-9][\w.-]*)(?::(\d{1,5}))?(?![\w.-])")   # after a scheme's ":"
_ADDR = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})\b")
_IP = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w.])")
_HOST_PORT = re.compile(r"(?<![\w.:/-])([A-Za-z0-9](?=[\w.-]*?[A-Za-z])[\w.-]*+):(\d{2,5})\b(?![.:]\d)")
#   a name holding a letter after its first character, then ":port"; the name is its whole run of [\w.-] (":" ends it),
#   taken once (`[\w.-]*[A-Za-z][\w.-]*` backtracked over the run for its last letter at every try: quadratic)
_FQDN = re.compile(r"(?<![\w.@/-])[A-Za-z0-9][\w-]*(?:\.[\w-]+)*\.(?:com|net|org|edu|gov|mil|int|io|info|biz|hk|cn|br|"
                   r"de|uk|jp|kr|ru|fr|nl|in|au|ca|us|local|lan|internal)(?![\w.-])")   # a host name: ns.example.com
_PORT = re.compile(r"\bport[ =:#]?(\d{1,5})\b", re.IGNORECASE)
_PATH = re.compile(r"(?<![\w/.:-])(?:/[\w.~+@$%-]*[\w~+@$%-])+/?|\b[A-Za-z]:\\[^\s,;\]\)'\"]*[^\s,;\]\)'\".:]"
                   r"|(?<![\w./\\-])[A-Za-z][\w-]*\.(?:exe|dll|sys|so|jar|sh|py|bin|conf|cfg|ini|xml|json|properties"
                   r"|log|txt|inf|msi|cab|bat|cmd|ps1)\b(?![.\w/\\-])")       # and a bare file name: chrome.exe
_SIZE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:[kKMGT]i?B|[kKMGT]b|bytes?|B)\b")
_NUMBER = re.compile(r"(?<![\w.:/@-])-?\d+(?:\.\d+)?(?:\s?(?:ms|us|ns|s|sec|secs|seconds|%))?(?![\w.])")
_ID = re.compile(r"(?<![\w.:-])[A-Za-z0-9_][\w.:-]*[\w]|(?<![\w.:-])[A-Za-z]\d(?![\w.:-])")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_USER = re.compile(r"\buser[ =:]+\"?(?!unknown\b)([\w.@$-]*[\w$])", re.IGNORECASE)
_FOR_USER = re.compile(r"\bfor (?:invalid user |illegal user )?([\w.@$-]*[\w$])(?= from\b| port\b|\s*$)",
                       re.IGNORECASE)
_LOGIN_WORDS = re.compile(r"password|login|logon|authenticat|session|ssh", re.IGNORECASE)
_STATUS = re.compile(r"\b(?:" + "|".join((*LEVEL_WORDS, *OUTCOME_WORDS)) + r")\b", re.IGNORECASE)
_PG_LEVEL = re.compile(r"\b(?:" + "|".join(OTHER_LEVELS) + r")(?=:  )")    # PostgreSQL's: "LOG:  connection ..."
_TEP = re.compile(rf"^\d{{2}}:\d{{2}}:\d{{2}} {TAG.pattern} (HH|H|LL|L)( NR)?\b")
_LOGCAT = re.compile(rf"^\d{{2}}-\d{{2}} \d{{2}}:\d{{2}}:\d{{2}}\.\d+\s+\d+\s+\d+ ([{LEVEL_LETTERS}]) ")   # logcat's level
_FIELD = re.compile(r"(?<![\w.])([A-Za-z][\w.]*)(?:=| = )(?:\"([^\"]*)\"|([^\s,;\"\])]+))")  # name=value, name = "a b"
_QUOTED = re.compile(r"(?<![\w.])([A-Za-z][\w.]*):? \"([^\"\\]{1,200})\"")     # name "value": user "admin"
_CLOCK = re.compile(r"(?<!\d)\d{2}[:.]\d{2}[:.]\d{2}(?:[.,:]\d+)?")
_REQUEST = re.compile(r'"(?:GET|POST|HEAD|PUT|DELETE|PATCH|OPTIONS|CONNECT) [^"]*" ([1-5]\d\d) (\d+)\b')
#   an access log's request, then its HTTP status and the bytes sent: "GET /x HTTP/1.1" 200 5667
_CODE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")             # a code: CBS_E_INVALID_PACKAGE, E_FAIL
_STATE = re.compile(r"\bto ([A-Z][A-Z_]{2,})\b")                      # a state entered: "from NEW to RUNNING"
_DIGIT = re.compile(r"\d")
_LETTER = re.compile(r"[A-Za-z]")


class _Taken:
    """The characters of a line the strong kinds took: a span is free when it holds none of them. A mark a character
    (a span checked costs its length, not the number of spans taken before it: a 4 KB line of a thousand values
    checked each against all the others was quadratic)."""

    def __init__(self, n: int):
        self.marks = bytearray(n)

    def free(self, start: int, end: int) -> bool:
        return self.marks.find(1, start, end) < 0

    def take(self, start: int, end: int) -> None:
        self.marks[start:end] = b"\x01" * (end - start)


def values_of(text: str) -> list[Value]:
    """Every typed value of a line, each with its span (see the module docstring for the kinds)."""
    out: list[Value] = []
    taken = _Taken(len(text))                     # spans of the strong kinds, not read again as ids or numbers

    def add(kind: str, start: int, end: int, strong: bool = False) -> None:
        out.append(Value(kind, text[start:end], start, end))
        if strong:
            taken.take(start, end)

    m = _TIME.search(text) or _EPOCH.search(text)
    if m:
        add("time", m.start(), m.end(), True)
        clock = _CLOCK.search(text, m.start(), m.end())
        if clock and clock.span() != m.span():    # the time of day alone, as an operator says it
            add("clock", clock.start(), clock.end())
    if m := _TEP.match(text):                     # a TEP alarm line: its type, and NR for a recovery
        add("status", m.start(1), m.end(1))
        add("alarm", m.start(1), m.end(2) if m[2] else m.end(1))
        if m[2]:
            add("status", m.start(2) + 1, m.end(2))
    if m := _LOGCAT.match(text):
        add("status", m.start(1), m.end(1))
    if '" ' in text and (m := _REQUEST.search(text)):
        add("status", m.start(1), m.end(1), True)
        add("size", m.start(2), m.end(2), True)
    if "=" in text:                               # a field's value under its name's kind, beside its own kind
        for m in _FIELD.finditer(text):
            group = 2 if m[2] is not None else 3
            if m.end(group) > m.start(group):
                add(f"field:{m[1].casefold()}", m.start(group), m.end(group))
    if '"' in text:                               # a quoted value under the word before it
        for m in _QUOTED.finditer(text):
            add(f"field:{m[1].casefold()}", m.start(2), m.end(2))
    if ":/" in text:
        for m in _URL.finditer(text):
            start, end = m.span(1)
            if taken.free(start, end):
                add("path", start, end, True)
                scheme = text.index(":", start)              # the scheme's ":" (none of its characters is one)
                if (at := _AUTHORITY.match(text, scheme + 1, end)) and at[1]:   # its host and port, read too
                    add("ip" if _IP.fullmatch(at[1]) else "host", at.start(1), at.end(1))
                    if at[2]:
                        add("port", at.start(2), at.end(2))
                if span := _SPLIT.match(text, end):              # "...2kSOSP.log:29168+7292": offset and length
                    add("number", span.start(1), span.end(1), True)
                    add("number", span.start(2), span.end(2), True)
    for m in _ADDR.finditer(text):
        if taken.free(m.start(), m.end()):
            add("addr", m.start(), m.end(), True)
            add("ip", m.start(1), m.end(1))
            add("port", m.start(2), m.end(2))
    for m in _IP.finditer(text):
        if taken.free(m.start(), m.end()):
            add("ip", m.start(), m.end(), True)
    if ":" in text:
        for m in _HOST_PORT.finditer(text):
            if taken.free(m.start(), m.end()):
                add("host", m.start(1), m.end(1), True)
                add("port", m.start(2), m.end(2))
                taken.take(m.start(2) - 1, m.end(2))
    if "." in text:
        for m in _FQDN.finditer(text):
            if taken.free(m.start(), m.end()):
                add("host", m.start(), m.end(), True)
    for m in _PORT.finditer(text):
        if taken.free(m.start(1), m.end(1)):
            add("port", m.start(1), m.end(1), True)
    if "/" in text or "\\" in text or "." in text:
        for m in _PATH.finditer(text):
            if taken.free(m.start(), m.end()) and (m[0][0] != "/" or _LETTER.search(m[0])):
                add("path", m.start(), m.end(), True)
    for m in _SIZE.finditer(text):
        if taken.free(m.start(), m.end()):
            add("size", m.start(), m.end(), True)
    for m in _HEX.finditer(text):
        if taken.free(m.start(), m.end()):
            add("id", m.start(), m.end(), True)
    for m in _ID.finditer(text):
        word = m[0].rstrip(".:-")
        if _DIGIT.search(word) and (_LETTER.search(word) or "_" in word) and taken.free(m.start(), m.start() + len(word)):
            add("id", m.start(), m.start() + len(word), True)
    for m in _NUMBER.finditer(text):
        if taken.free(m.start(), m.end()):
            add("number", m.start(), m.end())
    lowered = text.lower()
    users: list[tuple[int, int]] = []
    if "user" in lowered:
        users += [m.span(1) for m in _USER.finditer(text)]
    if "for " in lowered and _LOGIN_WORDS.search(text):
        users += [m.span(1) for m in _FOR_USER.finditer(text) if m.span(1) not in users]
    for start, end in users:
        add("user", start, end)
    for m in _STATUS.finditer(text):
        if taken.free(m.start(), m.end()):
            add("status", m.start(), m.end())
    for m in _PG_LEVEL.finditer(text):
        add("status", m.start(), m.end())
    for m in _CODE.finditer(text):
        if taken.free(m.start(), m.end()):
            add("status", m.start(), m.end())
    for m in _STATE.finditer(text):
        if taken.free(m.start(1), m.end(1)) and not _CODE.fullmatch(m[1]) and not _STATUS.fullmatch(m[1]):
            add("status", m.start(1), m.end(1))
    return out


def key_of(value: str) -> str:
    """How values are looked up: case folded (an operator writes fir123 for FIR123)."""
    return value.casefold()


_SUFFIXES = ("ational", "ations", "ation", "ements", "ement", "ments", "ment", "ness", "ions", "ion", "ures", "ure",
             "ings", "ing", "edly", "ed", "ers", "er", "ies", "es", "s", "ly")


def stem(word: str) -> str:
    """A word's root for prefix matching ("failure", "failed", "fails" -> "fail"): the longest known suffix is cut
    when at least 3 letters stay. Matching is by prefix (a line's word starting with the root), so cutting too much
    only widens a match, and no stemmed form needs to be stored (after the suffix-stripping idea of Lovins 1968 and
    Porter 1980; not their rule sets)."""
    w = word.casefold()
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            return w[:-len(suffix)]
    return w

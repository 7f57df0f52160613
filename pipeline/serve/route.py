"""An operator's question, routed by rules: a lookup (copy a span of one line), an aggregate (computed over the
archive) or other (the model writes, over retrieved lines).

Owns `route`: the question's own values (pipeline/stream/values.py: ids, IPs, ports, paths, user names, sizes) are
the keys a line must hold; its type nouns say what kind of span is wanted ("port" -> a port, "when" -> the line's
time); its remaining words, stemmed, rank lines. Rules, in order:
  aggregate  "how many" (not "how many kB"/"how many bytes": a size lookup), "how often", "count", "number of"
             -> count; "most frequent|common|often", "which ... the most" -> most; "first"/"earliest" -> first; "last"/"latest"/
             "most recent" -> last; "which|what <plural type noun>" ("which ports") -> distinct;
  lookup     the question names a value (an id, an address, a path, a user, a size, a time, a number of 3 or more
             digits, a code in capitals with an underscore) and a wanted kind (a type noun, "when", "where", or a word
             the line writes as "NAME=value"); or it names no value but asks "which|what <type noun>" with words
             to find the line by ("which file pattern did SQM queue for upload?": the cited reader asks a line to
             hold every one of them);
  other      everything else.
The noun asked is the type noun right after "which|what" (one word may come between: "which screen action"), else
the question's first; the words after "which|what" are the `subject` a line may name just before the value asked. A short number after a noun
("slot 9", "stage 1.0", "TID 56") is a key written with its noun (`pairs`); an address is its IP and its port; a
quoted phrase is held by the line as written; a value after "apart from", "besides", "except" or "other than" is
left out of the answers, not looked up. Asked "how many bytes", a size's number is the answer ("301" of "301 bytes");
asked "how many ms|seconds|...", a duration's number in that unit ("1938" of "1938 ms"), not a count. A lookup may
offer its answers ("did en0 go Up or Down?", "which action (boot, wait, halt, ...)"): the line's word among them.
No model is asked to route: where these rules find no aggregate and no named value, the question is "other", and the
free reader (the model over retrieved lines) answers it, as before issue 47. On a TEP alarm log a question naming a
tag asks an alarm type too ("high high" -> HH, "low" -> L, "recovered" -> NR), and its state is the line's whole alarm
type ("H NR"); without a tag, only "high high"/"low low", HH/LL written in capitals or "type X" name one ("HIGH HIGH or
LOW LOW": either). Verbs saying only that a line holds something ("lines that report X", "contain", "say") are not
words to find lines by. Never reads the archive.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.stream.identifiers import TAG
from pipeline.stream.values import stem, values_of
from pipeline.stream.words import QUESTION_STOP

KEY_KINDS = ("id", "ip", "addr", "port", "path", "host", "user", "size", "time", "clock")
KEY_DIGITS = 3                      # a plain number the question names is a key from this many digits on ("pid 2227")
# a type noun -> the value kinds it wants, best first
WANTS = {
    "port": ("port",), "ip": ("ip", "addr"), "address": ("ip", "addr", "path"), "host": ("host", "ip", "id"),
    "client": ("ip", "addr"), "source": ("ip", "addr"), "remote": ("ip", "addr"),
    "node": ("addr", "ip", "host", "id"), "server": ("addr", "ip", "host", "id"),
    "datanode": ("addr", "ip", "host", "id"), "machine": ("host", "ip", "id"), "hostname": ("host",),
    "program": ("path", "id"), "code": ("status", "number", "id"),
    "size": ("size", "number"), "bytes": ("size", "number"), "memory": ("size", "number"),
    "path": ("path",), "file": ("path",), "directory": ("path",), "dir": ("path",), "folder": ("path",),
    "user": ("user",), "username": ("user",), "account": ("user",), "who": ("user",), "login": ("user",),
    "block": ("id",), "id": ("id", "number"), "container": ("id",), "task": ("id",), "attempt": ("id",), "job": ("id",),
    "session": ("id",), "tag": ("id",), "application": ("id",), "identifier": ("id",),
    "pid": ("number",), "uid": ("number",), "count": ("number",), "number": ("number", "size"), "value": ("number", "size"), "progress": ("number",),
    "duration": ("number",), "long": ("number",),
    "type": ("alarm", "status"), "status": ("status",), "state": ("status",), "level": ("status",), "severity": ("status",),
    "result": ("status",), "outcome": ("status",),
    "when": ("time",), "time": ("time",), "timestamp": ("time",), "date": ("time",),
    "where": ("path", "addr", "ip"), "url": ("path",), "uri": ("path",),
}
PLURALS = {"ports": "port", "ips": "ip", "addresses": "address", "hosts": "host", "clients": "client",
           "nodes": "node", "servers": "server", "sizes": "size", "paths": "path", "files": "file",
           "users": "user", "usernames": "username", "accounts": "account", "blocks": "block", "ids": "id",
           "containers": "container", "tasks": "task", "attempts": "attempt", "jobs": "job", "sessions": "session",
           "tags": "tag", "statuses": "status", "states": "state", "levels": "level", "values": "value",
           "times": "time", "machines": "machine", "programs": "program", "codes": "code",
           "hostnames": "hostname", "directories": "directory", "dirs": "dir", "folders": "folder"}
UNITS = {"kb": "kb", "kib": "kib", "mb": "mb", "mib": "mib", "gb": "gb", "gib": "gib", "bytes": "b", "byte": "b",
         "b": "b"}
# a duration's unit, as a question or a line writes it -> one name: "how many ms?" asks the number of "1938 ms"
DURATIONS = {"ms": "ms", "msec": "ms", "msecs": "ms", "millisecond": "ms", "milliseconds": "ms", "us": "us",
             "microsecond": "us", "microseconds": "us", "ns": "ns", "s": "s", "sec": "s", "secs": "s", "second": "s",
             "seconds": "s", "min": "min", "mins": "min", "minute": "min", "minutes": "min"}
# verbs saying only that a line holds something, after "lines|that|which": "lines that report X" ("the report
# receiver" keeps its word)
HOLDING = frozenset("""report reports reported reporting contain contains contained containing say says said include
    includes included including print prints printed write writes wrote written show shows showed""".split())
HOLDERS = frozenset("line lines entry entries message messages event events record records that which".split())
ALARM_WORDS = {"hh": "HH", "ll": "LL", "h": "H", "l": "L", "nr": "NR", "high": "H", "low": "L", "recover": "NR",
               "recovers": "NR", "recovered": "NR", "recovery": "NR", "normal": "NR"}
NOT_USERS = frozenset("failed failure logged connected tried attempted login logins logon name names account accounts "
                      "did was is has had that who which with fail fails succeeded attempt attempts session sessions "
                      "from for on at in by to of".split())
_PAIRED = re.compile(r"(?<!\w)[^\WA-Za-z]*+([A-Za-z]\w*+) (\d{1,2}(?:\.\d+)?)(?![\w.]|:\d)")   # "slot 9", "TID 56"
#   the word from its first letter, tried once a word (not from every letter of a long one: quadratic)
_BESIDES = re.compile(r"\b(?:apart from|besides|except|other than)\s+$", re.IGNORECASE)
_QUOTED = re.compile(r"'([^']{3,})'|\"([^\"]{3,})\"")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Route:
    kind: str                       # lookup | aggregate | other
    op: str = ""                    # lookup: "span"; aggregate: count | first | last | most | distinct
    keys: tuple[str, ...] = ()      # values the question names (as written): a line must hold every one
    roots: tuple[str, ...] = ()     # stemmed content words: they rank lines (and narrow an aggregate's lines)
    want: tuple[str, ...] = ()      # value kinds the answer is, best first (empty: the whole line, or a count)
    unit: str = ""                  # a size unit the question names ("kb"), lower case, or a duration's ("ms", "s")
    alarm: str = ""                 # a TEP alarm type asked of a named tag (H, HH, L, LL, NR)
    type_noun: str = ""             # the noun `want` came from ("port")
    pairs: tuple[tuple[str, str], ...] = ()   # (noun root, value) a line writes together: "slot 9" (both keys too)
    phrases: tuple[str, ...] = ()   # quoted in the question, case folded: a line holds each as written
    besides: tuple[str, ...] = ()   # values named after "apart from|besides|except|other than": never the answer, and
                                    # no key
    subject: tuple[str, ...] = ()   # the words after "which|what", stemmed ("screen", "action"): a line names the
                                    # value asked right after one of them ("action: ...SCREEN_OFF")
    nouns: tuple[str, ...] = ()     # every type noun of the question, stemmed ("container", "id")
    alternatives: tuple[str, ...] = ()  # the answers the question offers, case folded: "Up or Down?", "(boot, wait,
                                        # halt, ...)": the line's word among them is the answer


def route(question: str) -> Route:
    q = question.casefold()
    found = values_of(question)
    vals = [v for v in found if (v.kind in KEY_KINDS or v.kind == "number" and
                                 v.text.lstrip("-").isdigit() and len(v.text) >= KEY_DIGITS + (v.text[0] == "-"))
            and not (v.kind == "user" and (v.text.casefold() in NOT_USERS or v.text.casefold() in QUESTION_STOP))]
    vals += [v for v in found if v.kind == "status" and "_" in v.text and v.text.isupper()]
    paired = [m for m in _PAIRED.finditer(question) if m[1].casefold() not in QUESTION_STOP]
    held = _covered(question, vals)                # a character of a value named (checked per place: linear)
    pairs = tuple((stem(m[1]), m[2]) for m in paired if not held[m.start(2)])
    numbered = {(m.start(2), m[2]) for m in paired}
    vals += [v for v in found if (v.start, v.text) in numbered]
    held = _covered(question, vals)
    besides = tuple(v.text for v in vals if _after_besides(question, v.start))
    left_out = set(besides)
    vals = [v for v in vals if v.text not in left_out]
    clock = any(c.kind == "clock" for c in vals)
    clocked = {(v.start, v.end) for v in vals if v.kind == "time" and clock}
    keys = tuple(dict.fromkeys(k for v in vals if (v.start, v.end) not in clocked for k in _keys(v, question)))
    words = [m[0].casefold() for m in _WORD.finditer(question) if not held[m.start()]]
    tagged = any(TAG.fullmatch(k) for k in keys)
    alarm = _alarm(words) if tagged else _alarm_named(question, words)
    naming = {w.casefold() for k in keys for w in _named_by(question, k)}
    nouns = {n for n, _ in pairs}
    paired = {w for w in naming if stem(w) in nouns}                       # "slot" of "slot 9": the key's, not a word
    noun, plural = _type_noun([w for w in words if w not in naming])     # "pid 23403" names a key, not the answer
    unit = next((UNITS[w] for w in words if w in UNITS and w != "b"), "")
    many = re.search(r"\bhow many (\w+)\b", q)
    duration = DURATIONS.get(many[1], "") if many and not unit else ""         # "how many ms": a duration's unit
    words = [w for i, w in enumerate(words) if not (w in HOLDING and i and words[i - 1] in HOLDERS)]
    alternatives = () if alarm else _alternatives(question)         # offered answers: not words to find lines by
    offered = set(alternatives)
    content = [w for w in words if w not in paired and w not in QUESTION_STOP and w not in WANTS and w not in PLURALS
               and w not in UNITS and not (alarm and w in ALARM_WORDS) and not (duration and DURATIONS.get(w) == duration)
               and len(w) > 1 and w not in offered]
    # the value a line writes after "NAME=" when the question names NAME (its type noun first), then the noun's kinds
    fields = tuple(dict.fromkeys(f"field:{w}" for w in ([noun] if noun else []) + content))
    want = ("size",) if unit else ("number",) if duration else fields + WANTS.get(noun, ())
    if tagged and noun in ("state", "status", "type"):           # a TEP line's state: its whole alarm type, "H NR"
        want = ("alarm",) + want
    roots = tuple(dict.fromkeys(stem(w) for w in content))
    asked = _asked(words)
    phrases = tuple(m[m.lastindex].casefold() for m in _QUOTED.finditer(question))
    base = dict(keys=keys, roots=roots, want=want, unit=unit or duration, alarm=alarm, type_noun=noun, pairs=pairs,
                phrases=phrases, besides=besides, alternatives=alternatives,
                subject=tuple(stem(w) for w in asked if w not in QUESTION_STOP), nouns=tuple(
                    dict.fromkeys(stem(PLURALS.get(w, w)) for w in words if w in WANTS or w in PLURALS)))
    timed = any(v.kind in ("time", "clock") for v in vals)      # one line's moment: a value of it, not a count
    op = _aggregate(q, words, plural, unit or duration, timed)
    if op:                                      # "which interfaces went up or down?" offers no answer
        return Route("aggregate", op, **{**base, "alternatives": ()})
    if want and (keys or asked and noun and roots) or alternatives and keys:
        return Route("lookup", "span", **base)
    return Route("other", **base)


def _aggregate(q: str, words: list[str], plural: bool, unit: str, timed: bool = False) -> str:
    if re.search(r"\bhow many\b", q) and not unit and not timed and not re.search(r"\bhow many (bytes|kb|mb|gb)\b", q):
        return "count"
    if re.search(r"\bhow often\b|\bcount\b|\bnumber of\b", q) and not timed:
        return "count"
    if re.search(r"\bmost (frequent|frequently|common|commonly|often)\b", q) or \
            re.search(r"\b(which|what|who)\b", q) and re.search(r"\bthe most\b(?!\s+recent)", q):
        return "most"
    if "first" in words or "earliest" in words:
        return "first"
    if "last" in words or "latest" in words or re.search(r"\bmost recent", q):
        return "last"
    if plural and re.search(r"\b(which|what)\b", q):
        return "distinct"
    return ""


_OR = re.compile(r"(?<![\w-])(?>[\w-]*?\b(?=[A-Za-z]))([A-Za-z][\w-]*+) or ([A-Za-z][\w-]*+)\s*\?")  # "go Up or Down?"
#   the first word start of a run of [\w-] decides for the run (every start ends at the run's end): tried once a run
_LISTED = re.compile(r"\(([A-Za-z][\w-]*(?:, [A-Za-z][\w-]*)+)(?:,? (?:\.\.\.|etc\.?|or \w+))?\)")  # "(boot, wait, ...)"


def _alternatives(question: str) -> tuple[str, ...]:
    """The answers a question offers itself: "X or Y?" at its end, or a list in parentheses."""
    if m := _OR.search(question):
        found = [m[1], m[2]]
    elif m := _LISTED.search(question):
        found = m[1].split(", ")
    else:
        return ()
    return tuple(w.casefold() for w in found if w.casefold() not in QUESTION_STOP)


def _keys(v, question: str) -> tuple[str, ...]:
    """The keys a named value gives: an address names its IP and its port (a line may write "ip port 22"); a time
    with a date is looked up by its time of day (its clock key: the line may write the date another way)."""
    if v.kind == "addr":
        ip, _, port = v.text.rpartition(":")
        return ip, port
    return (v.text,)


def _named_by(question: str, key: str) -> list[str]:
    """The words `(\\w+)[\\s:=#]*KEY` captures over the question, left to right ("pid" of "pid 23403"): the run of word
    characters before each place the key is written (blanks, ":", "=" or "#" between, or none: the key starting inside
    the run, the last place it does), from where the search stands. Found from the key's places and each run's two
    ends, once; that pattern backtracked over every start of a long word for each key: 1.1-1.7 s on a 339-token question
    (issue 55, finding 9). A key never starts with a blank, ":", "=" or "#" (a value's first character: a word's, "/",
    "-", a digit)."""
    found: list[str] = []
    pos, at = 0, question.find(key)
    while at >= 0 and key:
        q = at
        while q > pos and (question[q - 1].isspace() or question[q - 1] in ":=#"):
            q -= 1
        if q == pos or not _is_word(question[q - 1]):            # no word right before this place
            at = question.find(key, at + 1)
            continue
        start = q - 1
        while start > pos and _is_word(question[start - 1]):
            start -= 1
        end = q
        while end < len(question) and _is_word(question[end]):
            end += 1
        after = end
        while after < len(question) and (question[after].isspace() or question[after] in ":=#"):
            after += 1
        if question.startswith(key, after):                       # the whole run names it (greedy: the longest)
            found.append(question[start:end])
            pos = after + len(key)
        else:                                                    # the key starts inside the run: its last place
            inside = question.rfind(key, start + 1, end - 1 + len(key))
            found.append(question[start:inside])
            pos = inside + len(key)
        at = question.find(key, pos)
    return found


def _covered(question: str, vals) -> bytearray:
    """A mark on each character of the question inside one of `vals`' spans."""
    held = bytearray(len(question) + 1)
    for v in vals:
        held[v.start:v.end] = b"\x01" * (v.end - v.start)
    return held


def _after_besides(question: str, start: int) -> bool:
    """Whether "apart from", "besides", "except" or "other than" and blanks come right before question[start:]: the
    blanks walked back, then the phrase looked for in the 10 characters before them (not over the whole prefix: a
    search a value, quadratic in a question of many values)."""
    at = start
    while at > 0 and question[at - 1].isspace():
        at -= 1
    return at < start and bool(_BESIDES.search(question, max(0, at - 10), start))


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"                                  # re's \w on str


def _asked(words: list[str]) -> list[str]:
    """The two words after the first "which" or "what" ("which screen action" -> screen, action)."""
    at = next((i for i, w in enumerate(words) if w in ("which", "what")), None)
    return [] if at is None else words[at + 1:at + 3]


def _type_noun(words: list[str]) -> tuple[str, bool]:
    """The type noun asked (singular) and whether it was written as a plural: the one right after "which|what" (a word
    may come between), none when a word of no known kind is there ("which stage ..."), else the first; of two in a
    row, the second ("source port": a port)."""
    after = _asked(words)
    asked = [w for w in after if w in WANTS or w in PLURALS]
    if asked:
        words = words[words.index(asked[0]):]
    elif after and after[0] not in QUESTION_STOP:   # "which stage has the most tasks": a stage, of no kind known
        return "", len(after[0]) > 3 and after[0].endswith("s") and not after[0].endswith("ss")   # "which stages"
    for i, w in enumerate(words):
        if w in WANTS and i + 1 < len(words) and (words[i + 1] in WANTS or words[i + 1] in PLURALS) and \
                words[i + 1] not in ("time", "times", "when"):
            continue
        if w in WANTS and w not in ("time",):
            return w, False
        if w in PLURALS and w != "times":
            return PLURALS[w], True
    return ("time", False) if "time" in words else ("", False)


def _alarm(words: list[str]) -> str:
    """The alarm type a TEP question asks: "high high" -> HH, "low low" -> LL, else the first alarm word."""
    for a, b in zip(words, words[1:]):
        if a == b and a in ("high", "low"):
            return "HH" if a == "high" else "LL"
    if any(w in ALARM_WORDS and ALARM_WORDS[w] == "NR" for w in words):
        return "NR"
    return next((ALARM_WORDS[w] for w in words if w in ALARM_WORDS), "")


def _alarm_named(question: str, words: list[str]) -> str:
    """The alarm types a question naming no tag asks, "|"-joined: "high high"/"low low", HH or LL in capitals, or
    "type X" or "X alarms" (X an alarm type in capitals); "" when none (a plain "high" or "low" is a word to find lines by)."""
    found = [t for t in ("HH", "LL") if re.search(rf"\b{t}\b", question)]
    found += [("HH" if a == "high" else "LL") for a, b in zip(words, words[1:]) if a == b and a in ("high", "low")]
    found += re.findall(r"\btype (HH|LL|H|L|NR)\b", question) + re.findall(r"\b(HH|LL|H|L|NR) alarms?\b", question)
    return "|".join(dict.fromkeys(found))

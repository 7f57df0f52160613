"""Span candidates any log has: what an exact answer may be copied from, on a line of a format never seen before.

Owns `candidates(text, header)`: every span of a line an operator's exact answer could be, each with where it came
from. Four sources, none naming a log format or a dataset (issue 59):
  - runs of atoms: an atom is a run of letters, digits, `_`, `.` or `-` (`[\\w.-]+`), any other visible character an
    atom of its own; a span is 1..`MAX_ATOMS` consecutive atoms that begins and ends with a word atom (a phrase, a
    value with its parts: "node-D2", "Jun 15 12:12:34", "10.0.0.1:22"), each word atom with its edge dots or dashes
    cut ("Resumed." -> "Resumed"), and a dotted or dashed atom's heads and tails ("action.SCREEN_OFF" -> "SCREEN_OFF");
  - value shapes, read whole however many atoms they hold: a URL, a path (unix or Windows), an IPv4 or IPv6 address,
    the port after an address or host, a time (ISO 8601, RFC 3164 syslog, ctime, Common Log Format, a date with a
    clock, a clock, epoch seconds), a number with its unit, a host name, an address or host with its port, a hex number, a UUID, a quoted or bracketed text, and the rest of the
    line after a label's ": ";
  - structure the line declares itself: a JSON object's scalar values named by their key path ("alert.signature"),
    `key=value` and `key: value` pairs named by their key, and a delimited row's cells named by the header in force
    (pipeline/stream/columns.py's `Header`, W3C, Zeek or a first line of names);
  - (the template miner's variable slots are runs of atoms already; the ranker reads them as a feature.)
Every span is exactly `text[start:end]`: what an answer copies is the line's own characters. Never ranks, never reads
a question, never touches SQLite or a model. Work is linear in the line times `MAX_ATOMS`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.stream.columns import Header, cells
from pipeline.stream.values import Value

MAX_ATOMS = 12              # a span holds at most this many atoms (the longest syslog/ctime time holds 9)
MAX_LINE = 8192             # characters of a line read (the stream cuts its lines at 4,096 bytes: this bounds others)

ATOM = re.compile(r"[\w.-]+|[^\s\w.-]")
_WORD = re.compile(r"[\w.-]+")
_INNER = re.compile(r"[.-]+")
_ALNUM = re.compile(r"[^\W_]")
_SHAPES = {                 # a value kind read whole; each pattern linear (no nested repetition over one run)
    "url": r"\b[A-Za-z][A-Za-z0-9+.-]{1,15}:/{1,2}[^\s\"'<>]*[^\s\"'<>.,;:)\]}]",
    "path": r"(?<![\w/.:-])/[^\s\"'<>|,;)\]}]*[^\s\"'<>|,;:.)\]}]|\b[A-Za-z]:\\[^\s,;\]\)'\"]*[^\s,;\]\)'\".:]",
    "ip": r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w.])",
    "ipv6": r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?![\w:])"             # full, or with "::"
            r"|(?<![\w:])(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)?::(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*)?(?![\w:])",
    "time": r"\b\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d{1,9})?)?(?:Z|[+-]\d\d:?\d\d| ?(?:UTC|GMT))?)?\b"
            r"|(?<![\w.])\d{1,4}[/.]\d{1,2}[/.]\d{1,4}(?:[ T,-]\d\d?:\d\d(?::\d\d(?:[.,]\d{1,9})?)?)?(?![\w.])"
            r"|\b(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? )?(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2},?"
            r"(?: \d{4})? \d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?: \d{4})?"
            r"|\b\d\d/(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)/\d{4}:\d\d:\d\d:\d\d(?: [+-]\d{4})?"
            r"|(?<![\d:.])\d{1,2}:\d\d:\d\d(?:[.,]\d{1,9})?"
            r"|(?<![\w.])1\d{9}(?:\.\d{1,6})?(?![\w.])"                       # epoch seconds, 2001-2033
            r"|(?<![\w.])\d{1,2}[./-]\d{1,2} \d{1,2}:\d\d:\d\d(?:[.,]\d{1,9})?"      # a month.day and a clock
            r"|(?<![\w.])\d{6}[ T-]\d{6}(?![\w.])",                              # compact: 081109 205931
    "number": r"(?<![\w.:/@-])-?\d+(?:\.\d+)?(?: ?(?:[kKMGT]i?B|bytes?|B|ms|us|µs|ns|s|sec|secs|seconds|min|h|%|V|A|W|kW|"
              r"kWh|Hz|°C|C|bar|rpm|days?|hours?|minutes?|mins?|weeks?))?(?![\w]|\.\d|[-:]\d)",
    "hex": r"\b0[xX][0-9A-Fa-f]+\b",
    "host": r"(?<![\w.-])[A-Za-z][\w-]*(?:\.[\w-]+)+(?=[^\w.-]|\.?$)(?<=[A-Za-z])",    # a dotted name ending in letters
    "hostport": r"(?<![\w.-])(?:\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w-]*(?:\.[\w-]+)*):\d{1,5}(?![\w.:])",
    "uuid": r"\b[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\b",
}
_SHAPE = tuple(re.compile(p) for p in _SHAPES.values())     # a tuple: tests/pipeline/test_patterns_linear.py reads it
_OFFSET = re.compile(r":\d+(?:\+\d+)?$")
NAMED = ("json:", "pair:", "column:")   # sources that name their span
MAX_LABELS = 8              # "label: rest of the line" candidates a line gives at most
_PORT = re.compile(r"(?<![\w.-])(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:]{2,39}\]|[A-Za-z][\w.-]*)"   # an address or
                   r":(\d{1,5})(?![\w.:])")                                              # a host, its port
_QUOTED = re.compile(r"\"([^\"\\\n]{1,400})\"|'([^'\\\n]{1,400})'")
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,200})\]|\(([^()\n]{1,200})\)|<([^<>\n]{1,200})>")
_PAIR = re.compile(r"(?<![\w.-])([A-Za-z_][\w.:/-]{0,63})=(?:\"((?:[^\"\\]|\\.){0,400})\"|'([^']{0,400})'"
                   r"|([^\s,;\"')\]}]+))")
_COLON = re.compile(r"(?<![\w.-])([A-Za-z_][\w-]{0,63}) *: +(?:\"([^\"\\]{1,400})\"|([\w./+-][^\s,;\"]*))")


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    text: str                  # exactly the line's text[start:end]
    sources: tuple[str, ...]   # "atoms", "shape:ip", "json:alert.signature", "pair:user", "column:c-ip", ...

    @property
    def names(self) -> tuple[str, ...]:
        """The keys or columns naming the span in its line ("alert.signature", "user", "c-ip")."""
        return tuple(s.split(":", 1)[1] for s in self.sources if s.startswith(NAMED))


def candidates(text: str, header: Header | None = None, named: tuple[Value, ...] = ()) -> list[Span]:
    """Every candidate span of the line, by position (first start, then the shorter first), each once with all its
    sources. `header`: the column layout in force for this line (columns.Headers), if any; `named`: its cells as the
    archive read them (evidence.ArchivedLine.cells, kind "col:NAME"), taken instead when given."""
    text = text[:MAX_LINE]
    found: dict[tuple[int, int], list[str]] = {}

    def add(start: int, end: int, source: str) -> None:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start and (_ALNUM.search(text, start, end) or source.startswith(NAMED)):   # "-", "()": no answer
            found.setdefault((start, end), []).append(source)

    _atoms(text, add)
    for kind, rx in zip(_SHAPES, _SHAPE):
        for m in rx.finditer(text):
            add(m.start(), m.end(), f"shape:{kind}")
            if kind in ("url", "path") and (tail := _OFFSET.search(m.group())):   # "x.log:29168+7292": the file
                add(m.start(), m.start() + tail.start(), f"shape:{kind}")
    for m in _PORT.finditer(text):
        add(m.start(1), m.end(1), "shape:port")
    for rx, kind in ((_QUOTED, "quoted"), (_BRACKETED, "bracketed")):
        for m in rx.finditer(text):
            g = next(i for i in range(1, rx.groups + 1) if m[i] is not None)
            add(m.start(g), m.end(g), f"shape:{kind}")
            if kind == "bracketed":
                add(m.start(), m.end(), f"shape:{kind}")           # "[local]", brackets and all
    at, labels = 0, 0
    while labels < MAX_LABELS and (at := text.find(": ", at) + 1) > 0:   # the rest of the line after a label's ":"
        add(at + 1, len(text), "shape:rest")
        labels += 1
    for m in _PAIR.finditer(text):
        g = next(i for i in (2, 3, 4) if m[i] is not None)
        add(m.start(g), m.end(g), f"pair:{m[1]}")
    for m in _COLON.finditer(text):
        g = 2 if m[2] is not None else 3
        add(m.start(g), m.end(g), f"pair:{m[1]}")
    for path, start, end in json_values(text):
        add(start, end, f"json:{path}")
    for cell in named or cells(text, header):
        add(cell.start, cell.end, f"column:{cell.kind[4:]}")
    return [Span(a, b, text[a:b], tuple(dict.fromkeys(src))) for (a, b), src in sorted(found.items())]


def _atoms(text: str, add) -> None:
    """Runs of 1..MAX_ATOMS atoms beginning and ending with a word atom; each word atom trimmed of edge dots/dashes."""
    atoms = [(m.start(), m.end(), bool(_WORD.match(m.group()))) for m in ATOM.finditer(text)]
    words = [i for i, (_, _, word) in enumerate(atoms) if word]
    for i in words:
        start, end, _ = atoms[i]
        raw = text[start:end]
        if core := raw.strip(".-"):
            a = start + len(raw) - len(raw.lstrip(".-"))
            b = a + len(core)
            add(a, b, "atoms")
            for m in _INNER.finditer(text, a, b):               # a dotted or dashed atom's heads and tails
                add(a, m.start(), "atoms")
                add(m.end(), b, "atoms")
        for j in range(i, min(i + MAX_ATOMS, len(atoms))):
            if atoms[j][2]:
                add(start, atoms[j][1], "atoms")


# ---- JSON: a scanner that keeps where each scalar is written (json.loads keeps no positions) ----

_WS = re.compile(r"\s*")
_STRING = re.compile(r'(?<!\\)"((?:[^"\\]|\\.)*+)"')   # possessive, never after a backslash: linear
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
MAX_DEPTH = 16             # nesting read at most
MAX_STARTS = 4             # "{" positions tried: each attempt reads the line once at most, so the scan stays linear


def json_values(text: str) -> list[tuple[str, int, int]]:
    """(key path, start, end) of every scalar of the first JSON object in the line (after any prefix: a syslog
    header before the object), a string's span inside its quotes as written (escapes kept); [] when none parses."""
    at, tries = text.find("{"), 0
    while at >= 0 and tries < MAX_STARTS:
        tries += 1
        out: list[tuple[str, int, int]] = []
        try:
            _value(text, at, "", out, 0)
            return out
        except ValueError:
            at = text.find("{", at + 1)
    return []


def _after_item(text: str, i: int, close: str) -> tuple[int, bool]:
    """After an object's or array's item: (the next item's index, False) past a comma, (the index after the
    container, True) at its `close`; else not JSON."""
    i = _WS.match(text, i).end()
    if text.startswith(",", i):
        return _WS.match(text, i + 1).end(), False
    if text.startswith(close, i):
        return i + 1, True
    raise ValueError("a comma")


def _value(text: str, i: int, path: str, out: list, depth: int) -> int:
    """Scan the JSON value at i (no leading space), recording its scalars under `path`; the index after it."""
    if depth > MAX_DEPTH or i >= len(text):
        raise ValueError("too deep or cut")
    c = text[i]
    if c == "{":
        i = _WS.match(text, i + 1).end()
        if text.startswith("}", i):
            return i + 1
        while True:
            m = _STRING.match(text, i)
            if not m:
                raise ValueError("a key")
            i = _WS.match(text, m.end()).end()
            if not text.startswith(":", i):
                raise ValueError("a colon")
            key = m[1]
            i = _value(text, _WS.match(text, i + 1).end(), f"{path}.{key}" if path else key, out, depth + 1)
            i, closed = _after_item(text, i, "}")
            if closed:
                return i
    if c == "[":
        i = _WS.match(text, i + 1).end()
        if text.startswith("]", i):
            return i + 1
        while True:
            i, closed = _after_item(text, _value(text, i, path, out, depth + 1), "]")
            if closed:
                return i
    if m := _STRING.match(text, i):
        out.append((path, m.start(1), m.end(1)))
        return m.end()
    if m := _SCALAR.match(text, i):
        out.append((path, m.start(), m.end()))
        return m.end()
    raise ValueError("a value")

"""The archive's lines as evidence: lines holding given values, matching given word roots, with their typed values.

Owns the cited reader's queries over the archive (pipeline/stream/archive.py owns the file and its schema): the lines
holding every given value key (exact match on `vals.key`), or matching any given word root (FTS5 prefix query), each
with its values (and a positional row's cells, apart) re-made from their spans; the archive's oldest line (the scope
an aggregate speaks for). Every line is a candidate, those still inside the model's window included. Never writes,
never ranks by meaning: the caller (pipeline/serve/cited.py) decides what a question wants.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from pipeline.stream.values import Value, key_of

_WORD = re.compile(r"\w+")
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")     # a word's parts at case changes and underscores


@dataclass(frozen=True)
class Line:
    seq: int
    offset: int
    time: str                    # the record's time as its source wrote it ("" when none)
    text: str
    values: tuple[Value, ...]
    template: int
    cells: tuple[Value, ...] = ()    # a positional row's cells, kind "col:NAME" (pipeline/stream/columns.py)

    @property
    def clock(self) -> str:
        """The line's time as its text writes it (its first `time` value), else the record's time."""
        return next((v.text for v in self.values if v.kind == "time"), self.time)

    @property
    def when(self) -> str:
        """The time a citation shows: the record's, else the one in the text."""
        return self.time or self.clock

    def has(self, kind: str, key: str) -> bool:
        return any(v.kind == kind and key_of(v.text) == key for v in self.values)

    def covers(self, roots) -> int:
        """How many of the word roots some word of the line starts with (case folded), a word's parts too
        ("Step_StandReportReceiver": step, stand, report, receiver); a root of 1 or 2 letters only as a whole word
        ("ll" is not "llama")."""
        words = {*_WORD.findall(self.text.casefold()), *(p.casefold() for p in _PART.findall(self.text))}
        return sum(any(w == r or len(r) > 2 and w.startswith(r) for w in words) for r in roots)


def _fts_prefix(roots) -> str:
    return " OR ".join('"' + r.replace('"', '""') + '"*' for r in roots)


def holding(con: sqlite3.Connection, keys=(), roots=()) -> list[Line]:
    """The lines holding every value key in `keys` (exact, case folded); with no keys, the lines matching any word
    root in `roots` (a word starting with it); with neither, every line. Newest first."""
    keys = sorted({key_of(k) for k in keys})
    if keys:
        marks = ",".join("?" * len(keys))
        seqs = [s for (s,) in con.execute(f"SELECT seq FROM vals WHERE key IN ({marks}) GROUP BY seq "
                                          f"HAVING count(DISTINCT key) = ? ORDER BY seq DESC", (*keys, len(keys)))]
    elif roots:
        seqs = [s for (s,) in con.execute("SELECT rowid FROM lines WHERE lines MATCH ? ORDER BY rowid DESC",
                                          (_fts_prefix(roots),))]
    else:
        seqs = [s for (s,) in con.execute("SELECT rowid FROM lines ORDER BY rowid DESC")]
    return lines(con, seqs)


def lines(con: sqlite3.Connection, seqs: list[int]) -> list[Line]:
    """The lines of `seqs` (in that order; those evicted meanwhile left out), with their values and templates."""
    out, chunk = [], 500
    for i in range(0, len(seqs), chunk):
        part = seqs[i:i + chunk]
        marks = ",".join("?" * len(part))
        rows = {s: (o, t, x) for s, o, t, x in con.execute(
            f"SELECT rowid, offset, time, text FROM lines WHERE rowid IN ({marks})", part)}
        spans: dict[int, list] = {}
        for s, kind, start, stop in con.execute(
                f"SELECT seq, kind, start, stop FROM vals WHERE seq IN ({marks}) ORDER BY seq, start", part):
            spans.setdefault(s, []).append((kind, start, stop))
        templates = dict(con.execute(f"SELECT seq, template FROM line_templates WHERE seq IN ({marks})", part))
        for s in part:
            if s in rows:
                offset, time, text = rows[s]
                found = [Value(k, text[a:b], a, b) for k, a, b in spans.get(s, ())]
                out.append(Line(s, int(offset), time, text, tuple(v for v in found if not v.kind.startswith("col:")),
                                templates.get(s, 0), tuple(v for v in found if v.kind.startswith("col:"))))
    return out


def oldest(con: sqlite3.Connection) -> Line | None:
    """The archive's oldest line: an aggregate counts from there (serve.archive_max_lines bounds the history)."""
    row = con.execute("SELECT rowid FROM lines ORDER BY rowid LIMIT 1").fetchone()
    found = lines(con, [row[0]]) if row else []
    return found[0] if found else None

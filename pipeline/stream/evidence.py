"""The archive's lines as evidence: lines holding given values, matching given word roots, with their typed values.

Owns the cited reader's queries over the archive (pipeline/stream/archive.py owns the file and its schema): the lines
holding every given value key (exact match on `vals.key`), or matching any given word root (FTS5 prefix query), each
with its values (and a positional row's cells, apart) re-made from their spans; the archive's oldest line (the scope
an aggregate speaks for). Every line is a candidate, those still inside the model's window included. Never writes,
never ranks by meaning: the caller (pipeline/serve/cited.py) decides what a question wants.

Bounded (issue 55): a question's reads go through its `Budget`, at most `max_lines` lines read and built (the newest
candidates, or the oldest for a question about the first: LIMIT in SQL, the seqs streamed off the indexes, never every
match) and at most `seconds` of work (SQLite's progress handler aborts a query past the deadline; the lines are built
in chunks, the clock looked at between them, within the first half of the time: the rest is the caller's to weigh them
in); `cut` says why a read stopped short ("lines", "time"), for the answer to say its bound.
"""
from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass

from pipeline.stream.values import Value, key_of

_WORD = re.compile(r"\w+")
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")     # a word's parts at case changes and underscores
STEPS = 1000            # SQLite VM instructions between two looks at a question's clock (~0.1 ms here)
CHUNK = 500             # lines built at once (one query per table for the chunk)
READ_SHARE = 0.5        # of a question's time, what building its lines may take (the rest: weighing them)
MIN_WEIGHED = 32        # lines a loop of the reader weighs whatever the budget says: lines read get an answer


class Budget:
    """One question's bound on its work over the archive: at most `max_lines` lines read and built (over every read
    of the question), until `seconds` from now, and, when given, at most `max_steps` SQLite VM instructions (a bound
    in work rather than time: the fuzz target's). `cut` says why a read stopped short: "" (every candidate read),
    "lines" (more candidates than the lines left), "time" (the deadline, or the steps)."""

    def __init__(self, seconds: float, max_lines: int, max_steps: int | None = None, clock=time.monotonic):
        self.seconds, self.max_lines, self.max_steps, self.clock = seconds, max_lines, max_steps, clock
        self.deadline = clock() + seconds
        self.read_until = clock() + seconds * READ_SHARE
        self.examined = 0                # lines read and built
        self.steps = 0                   # SQLite VM instructions run (in STEPS)
        self.cut = ""

    @property
    def left(self) -> int:
        return max(self.max_lines - self.examined, 0)

    def over(self, reading: bool = False) -> bool:
        """The time (or the steps) spent: marks the budget cut. reading: the share of the time lines may be built in
        (`READ_SHARE`) spent: no more lines (the budget cut too: there may have been more)."""
        if self.clock() >= (self.read_until if reading else self.deadline) or \
                self.max_steps is not None and self.steps >= self.max_steps * (READ_SHARE if reading else 1):
            self.cut = "time"
            return True
        return False

    def watch(self, con: sqlite3.Connection) -> None:
        """Abort any query of `con` past the budget (sqlite3.OperationalError "interrupted")."""
        con.set_progress_handler(self._tick, STEPS)

    def _tick(self) -> int:
        self.steps += STEPS
        return int(self.over())

    def each(self, items):
        """`items` while the budget lasts (the clock, and the steps, looked at before each), the first MIN_WEIGHED
        whatever it says (a bound in work: the lines read were read to be weighed): a Python loop's bound."""
        for i, item in enumerate(items):
            if self.over() and i >= MIN_WEIGHED:
                return
            self.steps += STEPS              # a line weighed in Python: about as long as STEPS instructions
            yield item


@dataclass(frozen=True)
class ArchivedLine:
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


def holding(con: sqlite3.Connection, keys=(), roots=(), budget: Budget | None = None,
            oldest_first: bool = False) -> list[ArchivedLine]:
    """The lines holding every value key in `keys` (exact, case folded); with no keys, the lines matching any word
    root in `roots` (a word starting with it); with neither, every line. Newest first (`oldest_first`: the oldest
    first). With a `budget`, at most the lines it has left, and what it lets be read in its time (its `cut` says so
    when there were more)."""
    keys = sorted({key_of(k) for k in keys})
    order = "ASC" if oldest_first else "DESC"
    limit = -1 if budget is None else budget.left + 1          # one more than is read: whether there were more
    if keys:                                                   # off the index (key, seq): streamed, no sort
        query = "SELECT DISTINCT seq FROM vals AS v WHERE key = ?" + "".join(
            " AND EXISTS (SELECT 1 FROM vals WHERE key = ? AND seq = v.seq)" for _ in keys[1:]) + \
            f" ORDER BY seq {order} LIMIT ?"
        args: tuple = (*keys, limit)
    elif roots:
        query, args = f"SELECT rowid FROM lines WHERE lines MATCH ? ORDER BY rowid {order} LIMIT ?", \
            (_fts_prefix(roots), limit)
    else:
        query, args = f"SELECT rowid FROM lines ORDER BY rowid {order} LIMIT ?", (limit,)
    try:
        seqs = [s for (s,) in con.execute(query, args)]
    except sqlite3.OperationalError:
        if budget is None or budget.cut != "time":            # aborted by the budget: nothing read
            raise
        return []
    if budget is not None and len(seqs) > budget.left:
        seqs = seqs[:budget.left]
        budget.cut = budget.cut or "lines"
    return lines(con, seqs, budget)


def lines(con: sqlite3.Connection, seqs: list[int], budget: Budget | None = None) -> list[ArchivedLine]:
    """The lines of `seqs` (in that order; those evicted meanwhile left out), with their values and templates; with
    a `budget`, those built before its time ran out (counted in its `examined`)."""
    out, chunk = [], CHUNK
    for i in range(0, len(seqs), chunk):
        part = seqs[i:i + chunk]
        if budget is not None and budget.over(reading=True):
            break
        marks = ",".join("?" * len(part))
        try:
            rows = {s: (o, t, x) for s, o, t, x in con.execute(
                f"SELECT rowid, offset, time, text FROM lines WHERE rowid IN ({marks})", part)}
            spans: dict[int, list] = {}
            for s, kind, start, stop in con.execute(
                    f"SELECT seq, kind, start, stop FROM vals WHERE seq IN ({marks}) ORDER BY seq, start", part):
                spans.setdefault(s, []).append((kind, start, stop))
            templates = dict(con.execute(f"SELECT seq, template FROM line_templates WHERE seq IN ({marks})", part))
        except sqlite3.OperationalError:
            if budget is None or budget.cut != "time":
                raise
            break
        if budget is not None:
            budget.examined += len(part)
        for s in part:
            if s in rows:
                offset, time_, text = rows[s]
                found = [Value(k, text[a:b], a, b) for k, a, b in spans.get(s, ())]
                out.append(ArchivedLine(s, int(offset), time_, text, tuple(v for v in found if not v.kind.startswith("col:")),
                                templates.get(s, 0), tuple(v for v in found if v.kind.startswith("col:"))))
    return out


def oldest(con: sqlite3.Connection) -> ArchivedLine | None:
    """The archive's oldest line: an aggregate counts from there (serve.archive_max_lines bounds the history)."""
    row = con.execute("SELECT rowid FROM lines ORDER BY rowid LIMIT 1").fetchone()
    found = lines(con, [row[0]]) if row else []
    return found[0] if found else None

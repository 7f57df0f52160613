"""Memory beyond the ring: an SQLite file holding every ingested line, searchable by an operator question.

Owns the archive file and its schema: one writer (`Archive`, in the ingest process) appends lines with their typed
values (pipeline/stream/values.py) and template (pipeline/stream/templates.py), each line, its values and its template
row in one transaction, and evicts the oldest past `max_lines` from every table at once (a template with its last
line, from the table and from the miner); a line keeps at most `max_values` values (the rest counted, never stored),
and rows are named by the header a directive block declared (pipeline/stream/columns.py); any number of readers
(`search` here, the values' queries in pipeline/stream/evidence.py, in the front) open it read-only while the writer
runs (WAL). Tables: `lines` (FTS5: text, time, offset; rowid = seq), `vals` (seq, kind, key, start, stop: a value's
span in its line and its case-folded lookup key), `templates` (id, pattern), `line_templates` (seq, template,
params). An archive written before the values tables existed is filled in by its writer when it opens it (every line's
values extracted then); a reader refuses it with a clear error until then. Never tokenizes for the model, never touches
the ring or a model; a reader never writes.

Ranking: FTS5 MATCH with the OR of the question's terms picks `candidates` rows by bm25 (ties to the most recent),
then those are ordered by coordinate match (distinct query terms the line contains, descending), then, unless the
question asks about recoveries, alarm lines before "NR" recovery lines (which repeat the alarm's words), then recency
(seq descending); only lines matching as many terms as the best one are kept, at most k. "When did PIR108 last go
HH?" wants the newest line with both PIR108 and HH, not lines that share one word with it.
"""
from __future__ import annotations

import itertools
import re
import sqlite3
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from pipeline.stream.columns import BLOCK, Header, Headers, cells, header_of
from pipeline.stream.templates import Miner
from pipeline.stream.values import key_of, values_of
from pipeline.stream.words import RETRIEVAL_STOP

SCHEMA = ("CREATE VIRTUAL TABLE lines USING fts5(text, time UNINDEXED, offset UNINDEXED, "
          "tokenize = \"unicode61 tokenchars '_'\")")   # rowid is the seq; '_' keeps AIR003_3 one token
TABLES = {            # beside `lines`: what the cited reader reads (pipeline/stream/evidence.py)
    "vals": "CREATE TABLE vals(seq INTEGER NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, start INTEGER NOT NULL, "
            "stop INTEGER NOT NULL)",
    "templates": "CREATE TABLE templates(id INTEGER PRIMARY KEY, pattern TEXT NOT NULL)",
    "line_templates": "CREATE TABLE line_templates(seq INTEGER PRIMARY KEY, template INTEGER NOT NULL, "
                      "params TEXT NOT NULL)",
}
INDEXES = ("CREATE INDEX vals_key ON vals(key, seq)", "CREATE INDEX vals_seq ON vals(seq)",
           "CREATE INDEX line_templates_template ON line_templates(template, seq)")
BUSY_MS = 5000
HEADERS_LOOKED_AT = 64    # a restart looks for the header in force among the newest header lines

CODES = {"recover": "nr", "recovers": "nr", "recovered": "nr", "recovery": "nr", "normal": "nr"}
PAIRS = {("high", "high"): "hh", ("low", "low"): "ll"}
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Hit:
    seq: int          # the line's sequence number in the archive (monotonic across runs)
    offset: int       # the record's index in its source (pipeline.stream.records.Record.offset)
    time: str         # the record's timestamp as the source wrote it ("" if none)
    text: str         # the rendered line (what the model sees)
    matched: int      # how many distinct query terms the line contains


def _words(text: str) -> list[str]:
    """Lowercased words with diacritics removed, as FTS5's unicode61 tokenizer folds them."""
    folded = unicodedata.normalize("NFKD", text.lower())
    return _WORD.findall("".join(ch for ch in folded if not unicodedata.combining(ch)))


def query_terms(question: str) -> list[str]:
    """Distinct search terms of a question, in order: operator phrases mapped to the log's codes ("high high" -> hh,
    "low low" -> ll, recovered/normal -> nr), stop words dropped, and 1-character words dropped (in the TEP log they
    are component letters and digits shared by many lines; the H and L alarm types are asked as HIGH and LOW)."""
    words, terms, i = _words(question), [], 0
    while i < len(words):
        pair = PAIRS.get(tuple(words[i:i + 2]))
        word = pair or CODES.get(words[i], words[i])
        i += 2 if pair else 1
        if len(word) > 1 and word not in RETRIEVAL_STOP and word not in terms:
            terms.append(word)
    return terms


def _fts_query(terms: list[str]) -> str:
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)   # quoted: FTS5 syntax is plain text


def _clean(text: str) -> str:
    """Lone surrogates -> U+FFFD (SQLite stores UTF-8 only), NULs -> spaces (FTS5 would cut the line there)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").replace("\0", " ")


def _schema(con: sqlite3.Connection, path) -> str:
    """"current" for an archive, "empty" for an empty database (the writer has not made its tables yet), "old" for an
    archive written before the values tables (only `lines`, exactly), else ValueError naming what is wrong."""
    try:
        tables = dict(con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    except sqlite3.OperationalError:
        raise                                   # locked, unreadable: not a question of what the file is
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{path}: not a ringspec archive: {e}") from e
    if not tables:
        return "empty"
    if tables.get("lines") != SCHEMA:
        raise ValueError(f"{path}: not a ringspec archive: its table lines is {tables.get('lines') or 'missing'}")
    if not any(name in tables for name in TABLES):
        return "old"
    for name, sql in TABLES.items():
        if tables.get(name) != sql:
            raise ValueError(f"{path}: not a ringspec archive: its table {name} is {tables.get(name) or 'missing'}")
    return "current"


def _is_archive(con: sqlite3.Connection, path) -> bool:
    """For a reader: True for an archive, False for an empty database, ValueError for anything else, an archive of
    an older ringspec included (its writer fills the values tables in when it opens it)."""
    state = _schema(con, path)
    if state == "old":
        raise ValueError(f"{path}: a ringspec archive from before the values tables (issue 47): `serve` adds them "
                         f"when it opens the file for writing (or delete the file)")
    return state == "current"


class Archive:
    """Writer side: buffers lines, commits every `flush_every`, keeps only the newest `max_lines`."""

    def __init__(self, path, max_lines: int = 1_000_000, flush_every: int = 256, max_values: int = 64,
                 max_templates: int = 100_000):
        if min(max_lines, flush_every, max_values, max_templates) < 1:
            raise ValueError(f"max_lines ({max_lines}), flush_every ({flush_every}), max_values ({max_values}) and "
                             f"max_templates ({max_templates}) must be at least 1")
        self.path, self.max_lines, self.flush_every = Path(path), max_lines, flush_every
        self.max_values, self.max_templates = max_values, max_templates
        self.stats = {"added": 0, "evicted": 0, "flushes": 0, "values_dropped": 0, "templates_evicted": 0,
                      "headers_refused": 0}
        self.con = sqlite3.connect(self.path, isolation_level=None)   # autocommit; flush opens its own transaction
        try:
            state = _schema(self.con, self.path)
            self.con.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            self.con.execute("PRAGMA journal_mode = WAL")
            self.con.execute("PRAGMA synchronous = NORMAL")    # WAL: a crash may lose the last flush, never corrupt
            if state != "current":
                self._create(state)
            last = self.con.execute("SELECT rowid FROM lines ORDER BY rowid DESC LIMIT 1").fetchone()
            with self.con:                  # rows an older ringspec left behind their last line
                self.con.execute("BEGIN IMMEDIATE")
                self.con.execute("DELETE FROM templates WHERE id NOT IN (SELECT template FROM line_templates)")
            self.miner = Miner(patterns=_recent_templates(self.con, max_templates), max_templates=max_templates)
            self.headers = _headers_at_end(self.con)
        except BaseException:
            self.con.close()
            raise
        self._next = last[0] + 1 if last else 1
        self.pending: list[tuple[int, str, str, int]] = []
        self.pending_values: list[tuple[int, str, str, int, int]] = []
        self.pending_templates: list[tuple[int, int, str]] = []

    def _create(self, state: str) -> None:
        """Make the tables (an empty file), or add the values tables to an older archive and fill them from its
        lines (one transaction: a reader sees the old archive or the whole new one)."""
        with self.con:
            self.con.execute("BEGIN IMMEDIATE")
            if state == "empty":
                self.con.execute(SCHEMA)
            for sql in (*TABLES.values(), *INDEXES):
                self.con.execute(sql)
            if state == "old":
                miner, headers = Miner(max_templates=self.max_templates), Headers()
                for seq, text, offset in self.con.execute("SELECT rowid, text, offset FROM lines ORDER BY rowid"
                                                          ).fetchall():
                    header = headers.take(text, int(offset) == 0)
                    vals, template, _ = _derived(seq, text, miner, header, self.max_values)
                    self.con.executemany("INSERT INTO vals VALUES (?, ?, ?, ?, ?)", vals)
                    self.con.execute("INSERT INTO line_templates VALUES (?, ?, ?)", template)
                self.con.executemany("INSERT OR REPLACE INTO templates VALUES (?, ?)", miner.take_changed().items())

    @property
    def next_seq(self) -> int:
        return self._next

    def add(self, offset: int, time: str, text: str) -> int:
        seq, self._next = self._next, self._next + 1
        text = _clean(text)
        self.pending.append((seq, text, _clean(time), int(offset)))
        refused = self.headers.refused
        header = self.headers.take(text, int(offset) == 0)
        vals, template, dropped = _derived(seq, text, self.miner, header, self.max_values)
        if dropped and not self.stats["values_dropped"]:
            self._note(f"line {seq} holds {len(vals) + dropped} values; the archive keeps {self.max_values} a line "
                       f"(serve.archive_max_values_per_line), the rest counted in its stats from now on")
        if self.headers.refused > refused and not self.stats["headers_refused"]:
            self._note(f"line {seq} is a header line outside a header block: it names no columns (counted in the "
                       f"archive's stats from now on)")
        self.stats["values_dropped"] += dropped
        self.stats["headers_refused"] = self.headers.refused
        self.pending_values += vals
        self.pending_templates.append(template)
        self.stats["added"] += 1
        if len(self.pending) >= self.flush_every:
            self.flush()
        return seq

    def flush(self) -> None:
        """Insert the buffered lines and evict the oldest past max_lines, in one transaction (readers see both)."""
        if not self.pending:
            return
        with self.con:
            self.con.execute("BEGIN IMMEDIATE")
            self.con.executemany("INSERT INTO lines(rowid, text, time, offset) VALUES (?, ?, ?, ?)", self.pending)
            self.con.executemany("INSERT INTO vals VALUES (?, ?, ?, ?, ?)", self.pending_values)
            self.con.executemany("INSERT INTO line_templates VALUES (?, ?, ?)", self.pending_templates)
            self.con.executemany("INSERT OR REPLACE INTO templates VALUES (?, ?)", self.miner.take_changed().items())
            gone, unused = self._forget("<", self._next - self.max_lines)
        self.miner.forget(unused)
        self.stats["evicted"] += gone
        self.stats["templates_evicted"] += len(unused)
        self.stats["flushes"] += 1
        self.pending, self.pending_values, self.pending_templates = [], [], []

    def _note(self, text: str) -> None:
        print(f"ringspec: archive {self.path.name}: {text}", file=sys.stderr, flush=True)

    def _forget(self, op: str, seq: int) -> tuple[int, list[int]]:
        """Delete the lines with seq `op` `seq` from every table, and the templates no line is left of (inside the
        caller's transaction; the caller drops those from the miner once committed): (lines, template ids)."""
        touched = [t for (t,) in self.con.execute(f"SELECT DISTINCT template FROM line_templates WHERE seq {op} ?",
                                                   (seq,))]
        gone = self.con.execute(f"DELETE FROM lines WHERE rowid {op} ?", (seq,)).rowcount
        self.con.execute(f"DELETE FROM vals WHERE seq {op} ?", (seq,))
        self.con.execute(f"DELETE FROM line_templates WHERE seq {op} ?", (seq,))
        unused = [t for t in touched
                  if not self.con.execute("SELECT 1 FROM line_templates WHERE template = ? LIMIT 1", (t,)).fetchone()]
        self.con.executemany("DELETE FROM templates WHERE id = ?", ((t,) for t in unused))
        return gone, unused

    def rewind(self, seq: int) -> None:
        """Forget the lines from `seq` on, so the next line added is `seq` again (a restart re-reads them from the
        source: the archive then holds each line once, under the seq its commit was checkpointed with)."""
        self.flush()
        with self.con:
            self.con.execute("BEGIN IMMEDIATE")
            _, unused = self._forget(">=", seq)
        self.miner.forget(unused)
        self.stats["templates_evicted"] += len(unused)
        self._next = seq
        self.headers = _headers_at_end(self.con)

    def close(self) -> None:
        if self.con is not None:
            self.flush()
            self.con.close()
            self.con = None

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _derived(seq: int, text: str, miner: Miner, header: Header | None, cap: int) -> tuple[list[tuple], tuple, int]:
    """A line's rows in `vals` (its values, and its cells named by `header`, the header in force at it: at most `cap`
    of them, the rest not stored), its row in `line_templates`, and how many values were not stored."""
    found = (*values_of(text), *cells(text, header))
    vals = [(seq, v.kind, key_of(v.text), v.start, v.end) for v in found[:cap]]
    tid, params = miner.add(text)
    return vals, (seq, tid, "\t".join(params)), max(0, len(found) - cap)


def _recent_templates(con: sqlite3.Connection, n: int) -> dict[int, str]:
    """The `n` templates whose lines came last ({id: pattern}, least recently used first): what the miner holds."""
    return dict(con.execute("SELECT t.id, t.pattern FROM templates t JOIN (SELECT template, MAX(seq) AS last FROM "
                            "line_templates GROUP BY template ORDER BY last DESC LIMIT ?) r ON r.template = t.id "
                            "ORDER BY r.last", (n,)))


def _headers_at_end(con: sqlite3.Connection) -> Headers:
    """The header state after the archive's newest line: its newest header taken as `Headers` takes one (the lines
    just before each header line decide), and the directive lines at its very end (a block a restart cut)."""
    headers = Headers()
    for seq, in con.execute("SELECT rowid FROM lines WHERE lines MATCH '^fields' ORDER BY rowid DESC LIMIT ?",
                            (HEADERS_LOOKED_AT,)).fetchall():
        block = con.execute("SELECT text, offset FROM lines WHERE rowid <= ? ORDER BY rowid DESC LIMIT ?",
                            (seq, BLOCK + 1)).fetchall()
        replay = Headers()
        for text, offset in reversed(block):
            replay.take(text, int(offset) == 0)
        if not replay.refused and replay.header == header_of(block[0][0]):      # the newest header line, taken
            headers.header = replay.header
            break
    tail = con.execute("SELECT text, offset FROM lines ORDER BY rowid DESC LIMIT ?", (BLOCK,)).fetchall()
    at_end = list(itertools.takewhile(lambda row: row[0].startswith("#"), tail))
    for text, offset in reversed(at_end):
        headers.take(text, int(offset) == 0)
    headers.refused = 0
    return headers


def open_reader(path) -> sqlite3.Connection | None:
    """A read-only connection to an archive, or None when there is none yet (no file, or no tables yet)."""
    path = Path(path)
    return _open_reader(path) if path.exists() else None


def _open_reader(path: Path) -> sqlite3.Connection | None:
    """A read-only connection, or None when there is no archive yet (no file, or the writer has not made the table)."""
    try:
        con = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True)
    except sqlite3.OperationalError:
        if path.exists():
            raise
        return None                                  # removed between the caller's check and here
    try:
        con.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        if _is_archive(con, path):
            return con
    except BaseException:
        con.close()
        raise
    con.close()
    return None


def search(path, question: str, k: int = 8, before_seq: int | None = None, candidates: int = 200,
           watch=None) -> list[Hit]:
    """Reader side: the k lines most relevant to `question`, among lines with seq < before_seq when given (the lines
    still inside the model's window are excluded by the caller passing the window's first seq). Ranking: see above.
    watch: called with the reader's connection first (a question's budget, pipeline/stream/evidence.py
    `Budget.watch`): a query it interrupts finds no lines."""
    terms, path = query_terms(question), Path(path)
    if not terms or k < 1 or not path.exists():
        return []
    con = _open_reader(path)
    if con is None:
        return []
    bound = before_seq if before_seq is not None else 2**63 - 1
    try:
        if watch is not None:
            watch(con)
        rows = con.execute("SELECT rowid, offset, time, text FROM lines WHERE lines MATCH ? AND rowid < ? "
                           "ORDER BY bm25(lines), rowid DESC LIMIT ?", (_fts_query(terms), bound, candidates))
        hits = [Hit(seq, int(offset), time, text, len(set(terms) & set(_words(text))))
                for seq, offset, time, text in rows]
    except sqlite3.OperationalError as e:
        if watch is None or "interrupted" not in str(e):
            raise
        hits = []
    finally:
        con.close()
    # coordinate match, then (when the question is not about recoveries) alarms before their recoveries, then recency
    asks_recovery = "nr" in terms
    hits.sort(key=lambda h: (-h.matched, not asks_recovery and "nr" in _words(h.text), -h.seq))
    best = hits[0].matched if hits else 0
    return [h for h in hits if h.matched == best][:k]

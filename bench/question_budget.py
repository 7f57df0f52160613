"""`python -m bench.question_budget --lines N`: what one operator question costs the process hosting the front, on an
N-line archive (issue 55, finding 1: an aggregate loaded every matching line).

Owns the reproduction: an N-line archive built through the real writer (pipeline/stream/archive.py `Archive`: values,
templates, FTS5), a block of distinct lines written by it and then repeated by SQL under new seqs (each copy's lines,
values and template rows as the writer made them), so a 1M-line archive takes a minute, not an hour; then, for a few
aggregate and lookup questions, `cited.read` is timed in this process: wall time, the process's memory growth
(VmHWM after the question, its peak reset before through /proc/self/clear_refs, less VmRSS before; else ru_maxrss),
and the reply's first line. Runs on the code as it is (an older `cited.read` without a budget too: the figures before
the fix). Never starts a server or a model.

    python -m bench.question_budget --lines 100000          # builds /tmp/question_budget-100000.sqlite once
    python -m bench.question_budget --lines 1000000 --keep  # keep the file for the next run
    python -m bench.question_budget --together 4 --question "how many lines say connecting?"   # four at once
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import resource
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.process import proc_status
from pipeline.serve import cited
from pipeline.stream.archive import Archive

BLOCK = 10_000          # distinct lines the writer writes; the rest are copies of them under new seqs
QUESTIONS = (
    "how many lines say connecting?",                    # count by a word most lines write
    "how many times did 10.0.3.4 connect?",              # count by a value
    "which port is used most often?",                    # most frequent value over every line of a kind
    "which users connected?",                            # distinct values
    "when did worker-3 last time out?",                  # last
    "when was the first timeout?",                       # first
    "which port did 10.0.3.4 connect to?",               # lookup by a value
    "how many lines say zebrafish?",                     # not found: the nearest lines
)


def line_of(i: int) -> tuple[str, str]:
    """The i-th line of the block: a time and a text, three kinds of events over a few hundred values."""
    t = f"2026-12-06 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
    w, ip, port, user = i % 16, f"10.0.{i % 7}.{i % 11}", 1024 + i % 97, f"user{i % 23}"
    kind = i % 4
    if kind < 2:
        text = f"{t} INFO worker-{w} connecting to {ip}:{port} as {user}"
    elif kind == 2:
        text = f"{t} WARN worker-{w} timeout after {i % 5000} ms on blk_{i * 7919 % 100000}"
    else:
        text = f"{t} INFO worker-{w} closed session {i * 31 % 9973} sent {i % 700} bytes"
    return t, text


def build(path: Path, lines: int) -> float:
    """An archive of `lines` lines at `path` (made once; kept when it already holds them); seconds taken."""
    t0 = time.perf_counter()
    if path.exists():
        with sqlite3.connect(path) as con:
            if con.execute("SELECT count(*) FROM line_templates").fetchone()[0] == lines:
                return 0.0
        path.unlink()
    block = min(lines, BLOCK)
    with Archive(path, max_lines=lines, flush_every=2048) as archive:
        for i in range(block):
            t, text = line_of(i)
            archive.add(i, t, text)
    con = sqlite3.connect(path, isolation_level=None)
    try:
        base = con.execute("SELECT rowid, text, time, offset FROM lines ORDER BY rowid").fetchall()
        vals = con.execute("SELECT seq, kind, key, start, stop FROM vals ORDER BY seq").fetchall()
        temps = con.execute("SELECT seq, template, params FROM line_templates ORDER BY seq").fetchall()
        for start in range(block, lines, block):              # copies under new seqs, as the writer would add them
            n = min(block, lines - start)
            con.execute("BEGIN IMMEDIATE")
            con.executemany("INSERT INTO lines(rowid, text, time, offset) VALUES (?, ?, ?, ?)",
                            [(s + start, x, t, o + start) for s, x, t, o in base[:n]])
            con.executemany("INSERT INTO vals VALUES (?, ?, ?, ?, ?)",
                            [(s + start, k, key, a, b) for s, k, key, a, b in vals if s <= n])
            con.executemany("INSERT INTO line_templates VALUES (?, ?, ?)",
                            [(s + start, tid, p) for s, tid, p in temps[:n]])
            con.execute("COMMIT")
    finally:
        con.close()
    return time.perf_counter() - t0


def _status() -> dict[str, float]:
    """VmRSS and VmHWM of this process, in MB (empty off Linux)."""
    try:
        return proc_status()
    except OSError:
        return {}


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def measure(path: Path, question: str, together: int = 1) -> dict:
    """One question's wall time, memory growth and the reply's first line, asked in a forked child (each question
    from the same heap, none reusing what an earlier one grew), else here."""
    if not hasattr(os, "fork"):
        return _measure(path, question, together)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                         # the child: one question, its figures down the pipe
        try:
            os.close(r)
            os.write(w, json.dumps(_measure(path, question, together)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out) if out else {"question": question, "wall_s": None, "growth_mb": None, "answer": None,
                                        "reply": "the child died"}


def _measure(path: Path, question: str, together: int = 1) -> dict:
    gc.collect()
    resettable = _reset_peak()
    before, maxrss = _status(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if together > 1:                                     # asked by several operators at once, one thread each
        with ThreadPoolExecutor(together) as pool:
            reply = list(pool.map(lambda _: cited.read(str(path), question), range(together)))[0]
    else:
        reply = cited.read(str(path), question)
    wall = time.perf_counter() - t0
    after = _status()
    if resettable and "vmhwm_mb" in after:
        growth = after["vmhwm_mb"] - before["vmrss_mb"]
    else:
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - maxrss
    text = getattr(reply, "text", None) or (f"choice of {reply.options}" if reply is not None else "None (free)")
    return {"question": question, "wall_s": round(wall, 3), "growth_mb": round(growth, 1),
            "answer": (getattr(reply, "answer", None) or "")[:160] or None, "reply": text.splitlines()[0][:160]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.question_budget", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=100_000, help="lines in the archive (default %(default)s)")
    p.add_argument("--archive", help="the archive file (default /tmp/question_budget-LINES.sqlite)")
    p.add_argument("--keep", action="store_true", help="keep the archive file afterwards (default: removed)")
    p.add_argument("--question", action="append", help="ask this instead of the built-in questions (repeatable)")
    p.add_argument("--together", type=int, default=1, help="ask each question this many times at once, from as many "
                   "threads (the wall time is the last one's; default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    path = Path(a.archive or f"/tmp/question_budget-{a.lines}.sqlite")
    built = build(path, a.lines)
    budgeted = "budget_s" in inspect.signature(cited.read).parameters
    rows = [measure(path, q, a.together) for q in (a.question or QUESTIONS)]
    if a.json:
        print(json.dumps({"lines": a.lines, "build_s": round(built, 1), "budgeted": budgeted, "questions": rows}))
    else:
        print(f"archive: {path}, {a.lines} lines (built in {built:.1f} s); cited.read with a budget: {budgeted}")
        for r in rows:
            print(f"{r['wall_s']:7.3f} s {r['growth_mb']:7.1f} MB  {r['question']}\n{'':20}-> {r['reply']}")
    if not a.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

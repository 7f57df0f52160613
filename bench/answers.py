"""`bench --task answers`: are the server's answers right, and can an operator trust them? Measured against a real
server while the log streams.

Owns the measurement over the committed question sets (bench/answer_questions.py, bench/questions/*.json): one real
`run.py serve` per log and reader (`serve.reader`: "cited" or "free"), the log replayed once from its first line at
`rate` lines/s, each question asked over HTTP with streaming on once the stream has ingested its `ask_after` lines,
and the scoring of each reply's `ringspec` object (`score`), with Wilson 95% intervals (`wilson`). Never reads the
reader's code: everything comes from the HTTP replies, /healthz, and the count of lines in the archive file it gave
the server. "Ingested" is that count: ingest writes a line there (searchable, the seq a citation names) before the
ring gets it, and on a loaded host the ring can lag it by tens of lines (each row records /healthz "lines" too). A reply
that ends after more lines than the question's `stable_through` was judged by a gold that may have changed: `late`,
left out of the figures and counted. `run_answers_bench` is the verb: progress on stderr, the table in
`AnswersReport`.

Scoring rules (one reply, `score`):
- exact: the cited reader's `ringspec.answer` against the gold after the set's per-kind rule (answer_questions.EXACT:
  spans equal as written once stripped; a count an integer; "which" a set split at commas; a not_found question's
  gold is null, so exact means a null answer). The free reader has no `answer`: exact means the gold appears in the
  reply's text as a word of its own (every value of a "which"); its not_found questions are not scored.
- citation accuracy (answers with a gold): at least one citation, and every cited seq is one of the gold lines.
- citation support (answers other than counts): the answer, stripped, is a non-empty substring of a cited line's
  text ("which": every value is); an answer without citations is unsupported. Must be 100%.
- a reply that is an error (a deadline, an HTTP error status) is not exact and is no abstention; errors are counted
  per route.
- no citation: answers (non-null) that carry no citation. Must be 0.
- not-found precision: of null answers, the share whose gold is null; recall: of null golds, the share answered null.
- timings from the client: TTFT (request to the first content delta, or to the final chunk when none came) and time
  to answer (request to the final chunk), split by whether the answer needed a model call: `ringspec.model_call`
  when the reply carries it, else `usage.completion_tokens` > 0.
"""
from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from bench.answer_questions import Question, lines_of, load, log_path
from bench.operators import Refused, _Server
from pipeline.config import ServeSection
from pipeline.report import Report
from pipeline.watch import wait_for

READERS = ("cited", "spans", "free")
SPLITS = ("dev", "heldout", "fresh", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6", "fresh7", "all")   # a question set's split
                                                                                 # (answer_questions.py), or every one
ROUTES = ("lookup", "aggregate", "not_found")
MAX_TOKENS = 48            # enough for any gold here (the longest, a jar path, is about 40 tokens)
NO_ASSESSMENTS = ("--every", "100000000")   # the bench measures answers, not the stream's assessments
READER_KEY = any(f.name == "reader" for f in dataclasses.fields(ServeSection))   # has this server serve.reader?


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials (95% by default); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)   # exact at the ends


@dataclass(frozen=True)
class Reply:
    """What one HTTP reply said, as the bench reads it (fields missing from an older server are None / empty)."""
    answer: str | None
    text: str
    citations: tuple[dict, ...]
    route: str | None
    ttft_ms: float | None
    total_ms: float | None
    model_call: bool
    error: str | None = None


def reply_of(asked: dict) -> Reply:
    """`_Server.ask`'s dict (its "final" the last SSE chunk) -> Reply."""
    final = asked.get("final") or {}
    meta = final.get("ringspec") or {}
    tokens = (final.get("usage") or {}).get("completion_tokens", 0)
    answer = meta.get("answer")
    error = final.get("error")
    return Reply(answer if isinstance(answer, str) else None, asked.get("text") or "",
                 tuple(c for c in meta.get("citations") or () if isinstance(c, dict)), meta.get("route"),
                 asked.get("ttft_ms") if asked.get("ttft_ms") is not None else asked.get("total_ms"),
                 asked.get("total_ms"), bool(meta["model_call"]) if "model_call" in meta else tokens > 0,
                 (error.get("message") if isinstance(error, dict) else str(error)) if error else None)


def _values(kind: str, text: str) -> list[str]:
    """The values an answer or gold holds: a "which" list split at commas, anything else as one value."""
    return [v.strip() for v in text.split(",") if v.strip()] if kind == "which" else [text.strip()]


def exact(q: Question, answer: str | None) -> bool:
    """The cited reader's answer against the gold (module docstring)."""
    if q.gold is None or answer is None:
        return q.gold is None and answer is None
    if q.kind == "count":
        return answer.strip().isdigit() and int(answer.strip()) == int(q.gold)
    if q.kind == "which":
        return set(_values("which", answer)) == set(_values("which", q.gold))
    return answer.strip() == q.gold


def in_text(q: Question, text: str) -> bool:
    """The free reader's criterion: the gold appears in the reply's text as a word of its own (no letter, digit or
    '_' against it, nor a decimal point and digit: "L" is not found in "LOW", "5" not in "15" or "5.5")."""
    return all(re.search(rf"(?<![\w])(?<!\d\.){re.escape(v)}(?![\w])(?!\.\d)", text) is not None
               for v in _values(q.kind, q.gold))


def score(q: Question, reply: Reply, reader: str) -> dict:
    """One reply's verdicts: each None where the rule does not apply (module docstring)."""
    row = {"id": q.id, "log": q.log, "route": q.route, "kind": q.kind, "reader": reader, "gold": q.gold,
           "answer": reply.answer, "text": reply.text, "cited": [c.get("seq") for c in reply.citations],
           "reply_route": reply.route, "ttft_ms": reply.ttft_ms, "total_ms": reply.total_ms,
           "model_call": reply.model_call, "error": reply.error, "exact": None, "cite_ok": None, "supported": None,
           "uncited": None, "null": None}
    if reply.error is not None:              # no reply to judge: wrong, and no abstention either
        return {**row, "exact": False}
    if reader == "free":
        row["exact"] = None if q.gold is None else in_text(q, reply.text)
        return row
    answered = reply.answer is not None
    row["exact"], row["null"] = exact(q, reply.answer), not answered
    if answered:
        row["uncited"] = not reply.citations
        if q.gold is not None:
            row["cite_ok"] = bool(reply.citations) and all(c.get("seq") in q.gold_lines for c in reply.citations)
        if q.kind != "count":
            texts = [str(c.get("text", "")) for c in reply.citations]
            values = [v for v in _values(q.kind, reply.answer) if v]
            row["supported"] = bool(values) and all(any(v in t for t in texts) for v in values)
    return row


def _share(rows: list[dict], key: str, want=True) -> dict:
    """k of n rows whose `key` is `want`, among the rows where it applies (not None), with its Wilson interval."""
    seen = [r[key] for r in rows if r[key] is not None]
    k, n = sum(v == want for v in seen), len(seen)
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "share": k / n if n else None, "lo": lo, "hi": hi}


def _percentiles(values: list) -> dict:
    v = [x for x in values if x is not None]
    return {"n": len(v), "p50": float(np.percentile(v, 50)) if v else None,
            "p95": float(np.percentile(v, 95)) if v else None}


def figures(rows: list[dict]) -> dict:
    """{reader: {route | "all": proportions, "timing": {model | model_free: TTFT and total percentiles}}}; rows
    marked late (answered after the gold could change) are left out."""
    out: dict = {}
    by_reader = defaultdict(list)
    for r in rows:
        by_reader[r["reader"]] += [] if r.get("late") else [r]
    for reader, mine in by_reader.items():
        table = {}
        for route in (*ROUTES, "all"):
            sel = [r for r in mine if route in ("all", r["route"])]
            nulls = [r for r in mine if r["null"]]
            golds_null = [r for r in mine if r["route"] == "not_found" and r["null"] is not None]
            table[route] = {"questions": len(sel), "exact": _share(sel, "exact"), "cite_ok": _share(sel, "cite_ok"),
                            "supported": _share(sel, "supported"), "uncited": _share(sel, "uncited"),
                            "errors": sum(r["error"] is not None for r in sel)}
            if route == "all":
                table[route]["nf_precision"] = _share([{"v": r["gold"] is None} for r in nulls], "v")
                table[route]["nf_recall"] = _share([{"v": r["null"]} for r in golds_null], "v")
        table["timing"] = {label: {"ttft_ms": _percentiles([r["ttft_ms"] for r in sel]),
                                   "total_ms": _percentiles([r["total_ms"] for r in sel])}
                           for label, sel in (("model", [r for r in mine if r["model_call"]]),
                                              ("model_free", [r for r in mine if not r["model_call"]]))}
        out[reader] = table
    return out


def _archived(server: _Server) -> int:
    """Lines in the archive the server writes (ingest adds a line there before the ring gets it): what the reader
    can have seen at most. /healthz's ring count when the file cannot be read (not yet made)."""
    if not server.archive.exists():
        return 0
    try:
        con = sqlite3.connect(server.archive, timeout=5.0)
        try:
            return int(con.execute("SELECT COALESCE(MAX(rowid), 0) FROM lines").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return int(server.health()["lines"])


def run_log(log: str, questions: list[Question], reader: str, rate: float, max_tokens: int, retrieve: int,
            config: str | None, progress) -> list[dict]:
    """One server streaming `log` from its first line; the questions asked in ask_after order, one at a time."""
    fmt = questions[0].format
    serve = {"reader": reader} if READER_KEY else {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ringspec_answers_") as tmp:
        server = _Server(str(log_path(log)), rate, retrieve, config, tmp, warm_lines=1, loop=False, serve=serve,
                         args=("--format", fmt, *NO_ASSESSMENTS))
        total = len(lines_of(log_path(log), fmt))         # a question set may ask after the log's last line: then
        try:                                              # it is asked at the end (its gold is over every line)
            for i, q in enumerate(sorted(questions, key=lambda q: (q.ask_after, q.id))):
                wait_for(lambda n=min(q.ask_after, total): _archived(server) >= n, f"{log}: {q.ask_after} lines ingested",
                         pids=[server.proc.pid], progress=lambda: _archived(server), poll_s=0.05)
                before, ring = _archived(server), server.health()["lines"]
                if before > q.stable_through:
                    row = {**score(q, Reply(None, "", (), None, None, None, False), reader), "late": True}
                else:
                    try:
                        reply = reply_of(server.ask(q.text, max_tokens))
                    except Refused as exc:           # an operator refused a reply: counted, the run goes on
                        reply = Reply(None, "", (), None, None, None, False, str(exc))
                    row = {**score(q, reply, reader), "late": _archived(server) > q.stable_through}
                row.update(ask_after=q.ask_after, archived_at_ask=before, ring_at_ask=ring)
                rows.append(row)
                progress(reader, log, i + 1, len(questions), q, row)
        finally:
            server.close(at_once=True)       # the lines not yet in the ring are nothing to wait for
    return rows


def _pct(f: dict) -> str:
    """'  80.0% [0.49,0.94]   8/10' (24 wide), '-' where nothing applies."""
    if not f["n"]:
        return f"{'-':>24s}"
    return f"{f['share']:6.1%} [{f['lo']:.2f},{f['hi']:.2f}] {f['k']:>3d}/{f['n']:<3d}".rjust(24)


def _ms(p: dict) -> str:
    return f"{p['p50']:7.0f} {p['p95']:7.0f}" if p["n"] else f"{'-':>7s} {'-':>7s}"


@dataclass
class AnswersReport(Report):
    """{"figures": figures(rows), "rows": every reply scored, "meta": the run's settings and wall time}."""

    def as_dict(self):
        return {"figures": self.data["figures"], "meta": self.data["meta"]}

    def saved(self):
        return self.data

    def text(self) -> str:
        fig, meta = self.data["figures"], self.data["meta"]
        out = [(f"\ntrusted answers: {meta['questions']} questions ({meta['split']}), logs streamed at "
                f"{meta['rate']:g} lines/s; {meta['late']} late replies left out; {meta['wall_s']:.0f} s"),
               "share [Wilson 95%] k/n" + ("" if READER_KEY else "   (this server has no serve.reader: one reader,"
                                                               " ringspec.answer/citations absent read as null)"),
               (f"{'reader':6s} {'route':9s} {'n':>4s} {'exact':>24s} {'citation accuracy':>24s} "
                f"{'citation support':>24s} {'answers uncited':>24s}")]
        for reader, table in fig.items():
            for route in (*ROUTES, "all"):
                t = table[route]
                out.append(f"{reader:6s} {route:9s} {t['questions']:4d} {_pct(t['exact'])} {_pct(t['cite_ok'])} "
                           f"{_pct(t['supported'])} {_pct(t['uncited'])}")
            a = table["all"]
            out.append(f"{reader:6s} not found: precision {_pct(a['nf_precision']).strip()}, recall "
                       f"{_pct(a['nf_recall']).strip()}; errors {a['errors']}")
        out.append(f"\n{'reader':6s} {'answers':10s} {'n':>4s} {'ttft p50':>8s} {'p95':>7s} {'total p50':>9s} "
                   f"{'p95':>7s}  (ms, client side)")
        for reader, table in fig.items():
            for label, t in table["timing"].items():
                out.append(f"{reader:6s} {label:10s} {t['ttft_ms']['n']:4d} {_ms(t['ttft_ms'])}  "
                           f"{_ms(t['total_ms'])}")
        return "\n".join(out)


def progress_line(reader, log, i, n, q, row) -> None:
    said = row["answer"] if reader != "free" else (row["text"] or "")[:60].replace("\n", " ")
    verdict = "late" if row.get("late") else "ok" if row["exact"] else "no" if row["exact"] is False else "-"
    print(f"  [{reader} {log.split('/')[-1]} {i}/{n}] @{q.ask_after} {q.kind}: {said!r} (gold {q.gold!r}) "
          f"{verdict}, cited {row['cited']}, {row['total_ms'] or 0:.0f} ms", file=sys.stderr, flush=True)


def select(questions: list[Question], split: str, logs: str = "", per_log: int = 0) -> dict[str, list[Question]]:
    """The questions of `split` (dev, heldout, fresh, fresh2, ..., fresh7, all) per log; `logs`:
    comma-separated stems (Linux_2k) to keep; per_log: at most this many per log (the first by ask_after; 0: all)."""
    keep = {s.strip() for s in logs.split(",") if s.strip()}
    out: dict[str, list[Question]] = {}
    for q in questions:
        stem = q.log.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if (split == "all" or q.split == split) and (not keep or stem in keep):
            out.setdefault(q.log, []).append(q)
    unknown = keep - {log.rsplit("/", 1)[-1].rsplit(".", 1)[0] for log in out}
    if unknown:
        raise ValueError(f"no questions for {', '.join(sorted(unknown))} in split {split}")
    return {log: sorted(qs, key=lambda q: q.ask_after)[:per_log or None] for log, qs in out.items()}


def run_answers_bench(cfg, profile: str | None, split: str = "heldout", readers: str = "cited", rate: float = 4.0,
                      logs: str = "", per_log: int = 0, max_tokens: int = MAX_TOKENS,
                      progress=progress_line) -> AnswersReport:
    """Ask every question of `split` of the committed sets (over `logs`, at most `per_log` each) to a real `serve`
    per log and reader, while the log streams at `rate` lines/s; score each reply (module docstring)."""
    chosen = [r.strip() for r in readers.split(",") if r.strip()]
    if split not in SPLITS or not chosen or set(chosen) - set(READERS) or rate <= 0:
        raise ValueError(f"--split {'|'.join(SPLITS)}, --readers of {', '.join(READERS)}, --rate > 0")
    if not READER_KEY and len(chosen) > 1:
        raise ValueError("this server has no serve.reader: run one reader (its only one) at a time")
    sets = select(load(), split, logs, per_log)
    t0, rows = time.monotonic(), []
    for reader in chosen:
        for log, questions in sets.items():
            print(f"{reader}: {log}, {len(questions)} questions", file=sys.stderr, flush=True)
            rows += run_log(log, questions, reader, rate, max_tokens, cfg.serve.retrieve, profile, progress)
    meta = {"split": split, "readers": chosen, "rate": rate, "logs": list(sets), "max_tokens": max_tokens,
            "questions": sum(map(len, sets.values())), "late": sum(bool(r.get("late")) for r in rows),
            "reader_key": READER_KEY, "wall_s": time.monotonic() - t0}
    return AnswersReport({"figures": figures(rows), "rows": rows, "meta": meta})

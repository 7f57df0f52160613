"""`eval-recall`: do questions about events that left the window get answered, with and without the archive?

Owns the answer measurement over `bench.recall_questions`'s questions: for each, the real model reads the lines still in
its window (the replay's frame, the serving profile's ring), then is asked the question twice from that same state,
once as is and once with the archive's retrieved older lines leading the question (what `serve` does). An answer
is an exact match when it contains the answering line's clock time (HH:MM:SS). Retrieval recall@k is reported
beside it. Never writes outside the archive directory it is given. `run_eval_recall` is the `eval-recall` verb: each
answer on stderr as it comes, the figures in `RecallReport`.
"""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.recall_questions import archive_for, build, recall_at_k, seq_of
from models.runner import Runner
from pipeline.decode.drafts.suffix import SuffixDraft
from pipeline.decode.engine import Engine
from pipeline.report import Report
from pipeline.stream.archive import search
from pipeline.stream.frame import replay_frame
from pipeline.stream.prompts import Prompt, question_span
from pipeline.stream.records import read_log


def answer_rate(questions, k: int, archive_dir, cfg, max_tokens: int = 40, progress=None) -> dict:
    frame = replay_frame(cfg)
    tok, system = frame.tok, Prompt.of(cfg.replay)
    runner = Runner(cfg.target.dir, frame.spec,
                    cfg.model.runner_options())
    rows, logs = [], {}
    t0 = time.perf_counter()
    for i, q in enumerate(questions):
        records = logs.setdefault(q.log, read_log(q.log, "csv"))
        hits = search(archive_for(q.log, q.upto, archive_dir), q.text, k, before_seq=seq_of(q.window_from))
        row = {"question": q.text, "answer": q.answer, "retrieved": [h.text for h in hits],
               "recalled": any(h.seq == seq_of(q.answer_offset) for h in hits)}
        for label, retrieved in (("without", []), ("with", [h.text for h in hits])):
            engine = Engine(runner, tok, SuffixDraft(), draft_len=cfg.draft.length)      # a fresh ring each time
            engine.feed(frame.head)
            engine.feed(tok.encode("".join(r.text + "\n" for r in records[q.window_from:q.upto + 1])))
            span = question_span(tok, system, [{"role": "user", "content": q.text}], retrieved)
            res = engine.generate(span, max_tokens, frame.params, stop_ids=tok.stop_ids)
            text = tok.decode([t for t in res.token_ids if t not in tok.stop_ids])
            row[f"text_{label}"], row[f"exact_{label}"] = text, q.answer in text
        rows.append(row)
        if progress:
            progress(i + 1, len(questions), row)
    n = len(rows)
    return {"questions": n, "k": k, "recall": sum(r["recalled"] for r in rows) / n,
            "exact_with_archive": sum(r["exact_with"] for r in rows) / n,
            "exact_without_archive": sum(r["exact_without"] for r in rows) / n,
            "wall_s": time.perf_counter() - t0, "rows": rows}


@dataclass
class RecallReport(Report):
    """`answer_rate`'s figures with "recall_at" {1, 4, 8}; `logs`: how many logs the questions came from."""
    logs: int = 0

    def text(self) -> str:
        out, recall = self.data, self.data["recall_at"]
        return "\n".join([
            f"{out['questions']} questions from {self.logs} logs, answers outside a 40-line window",
            "retrieval recall@1/@4/@8: " + " / ".join(f"{recall[k]:.1%}" for k in (1, 4, 8)),
            (f"exact answers (the right HH:MM:SS in the answer): with the archive ({out['k']} lines) "
             f"{out['exact_with_archive']:.1%}, without {out['exact_without_archive']:.1%}  ({out['wall_s']:.0f} s)")])


def _progress(i, n, row) -> None:
    print(f"  [{i}/{n}] {row['question']} ({row['answer']}): recalled {row['recalled']}, exact with "
          f"{row['exact_with']}, without {row['exact_without']}", file=sys.stderr, flush=True)


def run_eval_recall(cfg, logs: str, per_log: int = 1, max_questions: int = 40, k: int = 4) -> RecallReport:
    """Build questions over TEP alarm logs whose answers lie only outside the model's window ("When did AIR003_1 last
    go LOW?", answered by a clock time), measure how often the archive (SQLite FTS5) retrieves the answering line
    among k, and how often the real model's answer contains the right time with and without the retrieved lines.

    `logs`: a TEP CSV or a directory searched recursively; `cfg`: the serving profile the model runs with."""
    root = Path(logs)
    paths = sorted(str(p) for p in (root.rglob("*.csv") if root.is_dir() else [root]))
    if not paths:
        raise FileNotFoundError(f"no TEP CSV logs under {root}")
    if per_log < 1 or max_questions < 1 or k < 1:
        raise ValueError("--per-log, --max-questions and --k must be at least 1")
    questions = build(paths, per_log=per_log)
    step = max(1, len(questions) // max_questions)
    questions = questions[::step][:max_questions]
    with tempfile.TemporaryDirectory(prefix="ringspec_recall_") as tmp:
        recall = {n: recall_at_k(questions, n, tmp)["recall"] for n in (1, 4, 8)}
        out = answer_rate(questions, k, tmp, cfg, progress=_progress)
    out["recall_at"] = recall
    return RecallReport(out, len(paths))

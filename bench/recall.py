"""`eval-recall`: do questions about events that left the window get answered, with and without the archive?

Owns the answer measurement over `bench.recall_questions`'s questions: for each, the real model reads the lines still in
its window (the replay's frame, the serving profile's ring), then is asked the question twice from that same state,
once as is and once with the archive's retrieved older lines leading the question (what `serve` does). An answer
is an exact match when it contains the answering line's clock time (HH:MM:SS). Retrieval recall@k is reported
beside it. Never writes outside the archive directory it is given.
"""
from __future__ import annotations

import time

from bench.recall_questions import archive_for, seq_of
from models.registry import converted_dir, resolve_gguf
from models.runner import Runner
from pipeline.decode.drafts import SuffixDraft
from pipeline.decode.engine import Engine
from pipeline.stream.archive import search
from pipeline.stream.prompts import question_span
from pipeline.stream.records import read_log
from pipeline.stream.replay import replay_frame


def answer_rate(questions, k: int, archive_dir, cfg, max_tokens: int = 40, progress=None) -> dict:
    frame = replay_frame(cfg)
    tok, system = frame.tok, cfg.replay.system_prompt
    runner = Runner(converted_dir(resolve_gguf(cfg.model.gguf)), frame.spec,
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

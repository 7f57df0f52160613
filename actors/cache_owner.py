"""Cache-owner actor: owns the sequence state and the schedule between stream prefill and analyses.

Receives tokenized records from ingest; emits "line", "assessment" and "eof" events to output. At this stage of the
pipeline it drives the target and the draft through the serial `Engine` in its own process (the next step moves
them into actors of their own); it never parses or renders text and never prints.
"""
from __future__ import annotations

import time

import numpy as np

from kernels.sampling import SamplingParams
from pipeline.channel import Channel, ChannelSpec


def run(in_spec: ChannelSpec, out_name: str, cfg, stop) -> None:
    from models.tokenizer import Tokenizer
    from pipeline.assemble import make_engine, resolve_gguf
    from pipeline.tasks import chat_frame

    params = SamplingParams(cfg.sampling.temperature, cfg.sampling.top_k, cfg.sampling.top_p, cfg.sampling.seed)
    tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
    head, ask = chat_frame(tok, cfg.replay.system_prompt, cfg.replay.question)
    engine = make_engine(cfg.model.gguf, sink=max(cfg.cache.sink, len(head)), window=cfg.cache.window,
                         slack=max(cfg.cache.slack, len(ask) + cfg.replay.max_new_tokens + 8),
                         max_rows=cfg.model.max_rows, threads=cfg.model.threads, draft=cfg.draft.kind,
                         draft_gguf=cfg.draft.model, draft_len=cfg.draft.length, params=params,
                         draft_threads=cfg.draft.threads)
    engine.feed(head)
    lines, first_offset = 0, None
    with Channel.create(in_spec) as inp, Channel.attach(out_name, timeout=300) as out:
        while not stop.is_set():
            try:
                msg = inp.recv(timeout=0.2)
            except TimeoutError:
                continue
            with msg:
                header = dict(msg.header)
                ids = None if "ids" not in msg.arrays else np.array(msg.arrays["ids"], np.int64)
            if header["kind"] == "eof":
                out.send(header, timeout=60.0)
                return
            engine.feed(ids)
            lines += 1
            first_offset = header["offset"] if first_offset is None else first_offset
            out.send(header, timeout=60.0)
            if lines % cfg.replay.every_lines == 0:
                t0 = time.perf_counter()
                mark = engine.mark()
                res = engine.generate(ask, cfg.replay.max_new_tokens, params, stop_ids=tok.stop_ids)
                engine.rollback(mark)
                st = res.stats.as_dict()
                out.send({"kind": "assessment", "offsets": [first_offset, header["offset"]], "lines": lines,
                          "latency_ms": (time.perf_counter() - t0) * 1000.0, "stats": st},
                         {"ids": np.asarray(res.token_ids, np.int32)}, timeout=60.0)
                first_offset = None

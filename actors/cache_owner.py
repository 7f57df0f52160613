"""Cache-owner actor: owns the sequence state and the schedule between stream prefill and analyses.

Receives tokenized records from ingest; emits "line", "assessment" and "eof" events to output. At this stage of the
pipeline it drives the target and the draft through the serial `Engine` in its own process (the next step moves
them into actors of their own); it never parses or renders text and never prints.

An analysis names the lines it could see (those whose tokens are still inside the ring's window), their byte offsets
and their tags, so the output can count tags an answer mentions that none of those lines carries.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from actors.common import Figures, attach_when_ready, pin
from kernels.sampling import SamplingParams
from pipeline.channel import Channel, ChannelSpec


def run(in_spec: ChannelSpec, out_name: str, cfg, stop) -> None:
    from models.tokenizer import Tokenizer
    from pipeline.assemble import make_engine, resolve_gguf
    from pipeline.tasks import chat_frame

    pin(cfg.actors.owner_cpus)
    figures = Figures("cache_owner")
    params = SamplingParams(cfg.sampling.temperature, cfg.sampling.top_k, cfg.sampling.top_p, cfg.sampling.seed)
    tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
    head, ask = chat_frame(tok, cfg.replay.system_prompt, cfg.replay.question)
    engine = make_engine(cfg.model.gguf, sink=max(cfg.cache.sink, len(head)), window=cfg.cache.window,
                         slack=max(cfg.cache.slack, len(ask) + cfg.replay.max_new_tokens + 8),
                         max_rows=cfg.model.max_rows, threads=cfg.model.threads, draft=cfg.draft.kind,
                         draft_gguf=cfg.draft.model, draft_len=cfg.draft.length, params=params,
                         draft_threads=cfg.draft.threads)
    engine.feed(head)
    forward_before = engine.runner.forward_s          # start-up prefill is not the stream's work
    seen: deque = deque()                  # (last position, offset, tags) of the lines in the ring, oldest first
    lines, generated, decode_s = 0, 0, 0.0
    with Channel.create(in_spec) as inp, attach_when_ready(out_name, stop) as out:
        while not stop.is_set():
            try:
                msg = inp.recv(timeout=0.2)
            except TimeoutError:
                continue
            with figures.busy():
                with msg:
                    header = dict(msg.header)
                    ids = None if "ids" not in msg.arrays else np.array(msg.arrays["ids"], np.int64)
                if header["kind"] == "eof":
                    runner = engine.runner
                    figures.extra.update(lines=lines, generated=generated, tokens_per_s=generated / decode_s
                                         if decode_s else 0.0, forward_s=runner.forward_s - forward_before,
                                         kv_pool_mb=runner.pool_bytes / 2**20)
                    header["figures"] = header.get("figures", []) + [figures.snapshot()]
                    out.send(header, timeout=60.0)
                    return
                engine.feed(ids)
                lines += 1
                seen.append((engine.index.n - 1, header["offset"], header.get("tags", [])))
                while seen and seen[0][0] < engine.index.n - engine.spec.window:
                    seen.popleft()
                out.send(header, timeout=60.0)
                if lines % cfg.replay.every_lines:
                    continue
                t0 = time.perf_counter()
                mark = engine.mark()
                res = engine.generate(ask, cfg.replay.max_new_tokens, params, stop_ids=tok.stop_ids)
                engine.rollback(mark)
                st = res.stats.as_dict()
                generated += st["generated"]
                decode_s += st["decode_s"]
                out.send({"kind": "assessment", "offsets": [seen[0][1], seen[-1][1]], "lines": lines,
                          "window_lines": len(seen), "window_tags": sorted({t for _, _, tags in seen for t in tags}),
                          "latency_ms": (time.perf_counter() - t0) * 1000.0, "stats": st},
                         {"ids": np.asarray(res.token_ids, np.int32)}, timeout=60.0)

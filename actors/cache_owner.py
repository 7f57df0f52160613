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

from actors.common import Figures, attach_when_ready, messages, pin
from pipeline.channel import Channel, ChannelSpec


def run(in_spec: ChannelSpec, out_name: str, cfg, stop) -> None:
    from pipeline.tasks import make_analyst

    pin(cfg.actors.owner_cpus)
    figures = Figures("cache_owner")
    analyst = make_analyst(cfg)
    engine = analyst.engine
    forward_before = engine.runner.forward_s          # start-up prefill is not the stream's work
    seen: deque = deque()                  # (last position, offset, tags) of the lines in the ring, oldest first
    lines, generated, decode_s = 0, 0, 0.0
    with Channel.create(in_spec) as inp, attach_when_ready(out_name, stop) as out:
        for msg in messages(inp, stop):
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
                res = analyst.assess()
                st = res.stats.as_dict()
                generated += st["generated"]
                decode_s += st["decode_s"]
                out.send({"kind": "assessment", "offsets": [seen[0][1], seen[-1][1]], "lines": lines,
                          "window_lines": len(seen), "window_tags": sorted({t for _, _, tags in seen for t in tags}),
                          "latency_ms": (time.perf_counter() - t0) * 1000.0, "stats": st},
                         {"ids": np.asarray(res.token_ids, np.int32)}, timeout=60.0)

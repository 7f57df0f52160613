"""Cache-owner actor: owns the sequence state and the schedule between stream prefill and analyses.

Receives tokenized records from ingest; drives the target and draft actors through `DeferredEngine` (the only mover
of committed positions, for both rings); emits "line", "assessment" and "eof" events to output. The sink region
holds the system prompt; every analysis asks its question in a scratch span that is rolled back, so the ring holds
only the stream. Never parses or renders text, never runs a model and never prints.

An analysis names the lines it could see (those whose tokens are still inside the ring's window), their byte offsets
and their tags, so the output can count tags an answer mentions that none of those lines carries.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from actors.common import Figures, attach_when_ready, figures_on_request, pin
from pipeline.channel import Channel


def run(inbox, outbox: str, model_links: dict, cfg, spec, stop) -> None:
    """model_links: the channel specs this actor creates (from_target, from_draft) and the names it attaches to
    (to_target, to_draft)."""
    from pipeline.deferred import DeferredEngine
    from pipeline.tasks import Analyst, replay_frame
    from pipeline.triggers import Triggers

    pin(cfg.actors.owner_cpus)
    figures = Figures("cache_owner")
    figures_on_request(figures)
    frame = replay_frame(cfg)
    seen: deque = deque()                  # (last position, offset, tags) of the lines in the ring, oldest first
    lines, first_line = 0, None
    with Channel.create(inbox) as inp, Channel.create(model_links["from_target"]) as from_target, \
            Channel.create(model_links["from_draft"]) as from_draft, \
            attach_when_ready(model_links["to_target"], stop) as to_target, \
            attach_when_ready(model_links["to_draft"], stop) as to_draft, \
            attach_when_ready(outbox, stop) as out:
        engine = DeferredEngine(spec, cfg.model.max_rows, cfg.draft.length, to_target, from_target, to_draft,
                                from_draft)
        engine.feed(frame.head)
        analyst = Analyst(engine, frame.tok, frame.ask, frame.params, cfg.replay.max_new_tokens)
        triggers = Triggers(cfg.replay.every_lines, cfg.replay.trigger_pattern, cfg.replay.idle_s)
        last_line = time.monotonic()

        def assess(reason: str) -> None:
            t0 = time.perf_counter()
            res = analyst.assess()
            out.send({"kind": "assessment", "trigger": reason, "offsets": [seen[0][1], seen[-1][1]], "lines": lines,
                      "window_lines": len(seen), "window_tags": sorted({t for _, _, tags in seen for t in tags}),
                      "latency_ms": (time.perf_counter() - t0) * 1000.0, "stats": res.stats.as_dict()},
                     {"ids": np.asarray(res.token_ids, np.int32)}, timeout=60.0)

        while not stop.is_set():
            try:
                msg = inp.recv(timeout=0.2)
            except TimeoutError:
                reason = triggers.on_quiet(time.monotonic() - last_line)
                if reason:
                    with figures.busy():
                        assess(reason)
                continue
            with figures.busy():
                with msg:
                    header = dict(msg.header)
                    ids = None if "ids" not in msg.arrays else np.array(msg.arrays["ids"], np.int64)
                if header["kind"] == "eof":
                    model_figures = engine.close()
                    figures.extra.update(lines=lines, stream_wall_s=time.perf_counter() - (first_line or 0.0),
                                         inbox_max_depth=inp.max_depth,
                                         **{k: v for k, v in engine.totals.as_dict().items() if k in _TOTALS})
                    header["figures"] = header.get("figures", []) + [figures.snapshot()] + model_figures
                    out.send(header, timeout=60.0)
                    return
                first_line = first_line or time.perf_counter()
                last_line = time.monotonic()
                if cfg.replay.score_stream:
                    header["nll_sum"], header["nll_n"] = engine.feed(ids, score=True)
                else:
                    engine.feed(ids)
                lines += 1
                seen.append((engine.index.n - 1, header["offset"], header.get("tags", [])))
                while seen and seen[0][0] < engine.index.n - engine.spec.window:
                    seen.popleft()
                out.send(header, timeout=60.0)
                reason = triggers.after_line(header["text"])
                if reason:
                    assess(reason)


_TOTALS = ("tokens_per_s", "generated", "decode_s", "verify_calls", "accepted_per_verify", "acceptance_rate",
           "draft_s", "overlap_s", "overlap_share", "wasted_draft_s", "verify_s", "target_idle_s", "verify_forward_s",
           "decode_overhead_share")

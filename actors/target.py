"""Target actor: owns the target model's session and its KV pool, and judges blocks.

Starts by probing its graph's batch invariance (pipeline/decode/exactness.py) and telling the owner the verdict
(`Ready`). Receives from the cache owner fully specified passes (pipeline/messages.py): a stream or prompt chunk to
prefill (`Prefill`), or a block to verify (`Verify`: rows, positions, the mask, the recent section's slots, the slots
committed rows go to). Runs the pass, stores the K/V the owner said to keep, and for a block answers with a
`Verdict` (rows accepted, next token); `Close` ends it with its figures (`Closed`). Never decides positions, slots
or what is committed: the owner does, from its ring index; this actor's only state is the pool's contents and its
sampler.
"""
from __future__ import annotations

import time

import numpy as np

from kernels.sampling import SamplingParams, sample, target_probs
from models.platform import facts
from models.registry import converted_dir, resolve_gguf
from models.runner import Runner
from pipeline.channel import Channel, ChannelSpec
from pipeline.decode.blocks import Block, judge
from pipeline.decode.exactness import check
from pipeline.messages import Close, Closed, Picked, Prefill, Ready, Scored, Verdict, Verify, decode, send
from pipeline.process import Figures, attach_when_ready, figures_on_request, messages, pin


def run(inbox: ChannelSpec, outbox: str, cfg, spec, stop) -> None:
    pin(cfg.actors.target_cpus)
    figures = Figures("target")
    figures_on_request(figures)
    runner = Runner(converted_dir(resolve_gguf(cfg.model.gguf)), spec,
                    cfg.model.runner_options())
    exactness = check(runner)
    s = cfg.sampling
    params = SamplingParams(s.temperature, s.top_k, s.top_p, s.seed)
    rng = np.random.default_rng(s.seed)                       # consumed in the serial engine's order: pick, judge
    probs = np.zeros((cfg.model.max_rows, runner.vocab), np.float64)
    last_row = np.zeros(1, np.int64)
    shifted = np.zeros((cfg.model.max_rows, runner.vocab), np.float64)     # scoring buffers, allocated once
    top, total, picked = (np.zeros(cfg.model.max_rows, np.float64) for _ in range(3))
    with Channel.create(inbox) as inp, attach_when_ready(outbox, stop) as out:
        send(out, Ready(exactness=exactness.as_dict(), platform=facts()), timeout=60.0)
        for received in messages(inp, stop):
            with figures.busy(), received:
                msg = decode(received)
                if isinstance(msg, Close):
                    figures.extra.update(forward_s=runner.forward_s, inbox_max_depth=inp.max_depth,
                                         forward_calls=runner.forward_calls, forward_rows=runner.forward_rows,
                                         kv_pool_mb=runner.pool_bytes / 2**20)
                    send(out, Closed(figures=figures.snapshot()), timeout=60.0)
                    return
                if not isinstance(msg, (Prefill, Verify)):
                    raise ValueError(f"target: unexpected message {msg.kind!r}")
                ids, pos, recent = msg.ids, msg.pos, msg.recent
                T, m = len(ids), len(recent)
                mask = msg.mask                       # the pass reads it where the message left it
                t0 = time.perf_counter()
                if isinstance(msg, Prefill):
                    last_row[0] = T - 1
                    logits = runner.forward(ids, pos, mask, None if msg.score else last_row,
                                            recent_slots=recent if m else None)
                    runner.store(np.arange(T), msg.slots)
                    if msg.score:                     # row r predicts token r + 1 of the chunk
                        n = T - 1
                        nll = _nll(logits[:n], ids[1:], shifted[:n], top[:n], total[:n], picked[:n])
                        send(out, Scored(nll_sum=nll, nll_n=n), timeout=60.0)
                        logits = logits[n:]
                    if msg.pick:
                        nxt = int(np.argmax(logits[0])) if params.greedy else \
                            sample(target_probs(logits[0], params, out=probs[0]), rng)
                        send(out, Picked(next=nxt), timeout=60.0)
                else:
                    f0 = runner.forward_s
                    logits = runner.forward(ids, pos, mask, recent_slots=recent if m else None)
                    blk = Block(ids, msg.parent, msg.q, pos, None, recent, msg.slots)
                    rows, nxt = judge(logits, blk, params, probs, rng)
                    runner.store(rows, msg.slots[:len(rows)])
                    send(out, Verdict(epoch=msg.epoch, block=msg.block, rows=rows.tolist(), next=nxt, t0=t0,
                                      t1=time.perf_counter(), forward_s=runner.forward_s - f0), timeout=60.0)


def _nll(logits, targets, shifted, top, total, picked) -> float:
    """Sum over rows of -log softmax(logits[r])[targets[r]], in float64, in preallocated buffers."""
    np.copyto(shifted, logits)
    picked[:] = shifted[np.arange(len(targets)), targets]
    shifted.max(axis=1, out=top)
    shifted -= top[:, None]
    np.exp(shifted, out=shifted)
    shifted.sum(axis=1, out=total)
    np.log(total, out=total)
    return float((total + top - picked).sum())

"""Target actor: owns the target model's session and its KV pool, and judges blocks.

Starts by probing its graph's batch invariance (pipeline/decode/exactness.py) and telling the owner the verdict
(`Ready`). Receives from the cache owner fully specified passes (pipeline/messages.py): a stream or prompt chunk to
prefill (`Prefill`), or a block to verify (`Verify`: rows, positions, the mask, a tree's root paths, the recent
section's positions, the slots committed rows go to). Runs and judges it with the serial engine's verifier
(pipeline/decode/local.py), which stores the K/V the owner said to keep, and for a block answers with a `Verdict`
(rows accepted, next token); `Close` ends it with its figures (`Closed`). Never decides positions, slots
or what is committed: the owner does, from its ring index; this actor's only state is the pool's contents and its
sampler.
"""
from __future__ import annotations

import time

from kernels.sampling import SamplingParams
from models.platform import facts
from models.registry import converted_dir, resolve_gguf
from models.runner import Runner
from models.tokenizer import Tokenizer
from pipeline.channel import Channel, ChannelSpec
from pipeline.decode.blocks import Block
from pipeline.decode.exactness import check
from pipeline.decode.local import LocalVerifier
from pipeline.decode.rules import TokenTable, rule_from
from pipeline.messages import Close, Closed, Constrain, Picked, Prefill, Ready, Scored, Verdict, Verify, decode, send
from pipeline.process import Figures, attach_when_ready, chaos, figures_on_request, messages, pin
from pipeline.stream.surprise import unscored_tokens


def run(inbox: ChannelSpec, outbox: str, cfg, spec, stop) -> None:
    pin(cfg.actors.target_cpus)
    figures = Figures("target")
    figures_on_request(figures)
    runner = Runner(converted_dir(resolve_gguf(cfg.model.gguf)), spec,
                    cfg.model.runner_options(trees=cfg.draft.siblings > 0))
    exactness = check(runner)
    runner.reserve()                              # the arena at its high-water mark before the first line
    s = cfg.sampling
    params = SamplingParams(s.temperature, s.top_k, s.top_p, s.seed)
    verifier = LocalVerifier(runner, s.seed)      # its sampler is consumed in the serial engine's order: pick, judge
    table = None                                  # the vocabulary's token texts, read at the first rule
    if cfg.replay.scored:                         # the stream's scored passes leave these tokens' rows off the head
        tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
        verifier.unscored = unscored_tokens(tok, cfg.replay.score_every_token)
    with Channel.create(inbox) as inp, attach_when_ready(outbox, stop) as out:
        send(out, Ready(exactness=exactness.as_dict(), platform=facts()), timeout=60.0)
        for received in messages(inp, stop):
            with figures.busy(), received:
                msg = decode(received)        # its arrays are views into the slot: the pass reads them there
                if isinstance(msg, Close):
                    figures.extra.update(forward_s=runner.forward_s, inbox_max_depth=inp.max_depth,
                                         forward_calls=runner.forward_calls, forward_rows=runner.forward_rows,
                                         kv_pool_mb=runner.pool_bytes / 2**20)
                    send(out, Closed(figures=figures.snapshot()), timeout=60.0)
                    return
                if isinstance(msg, Prefill):
                    chaos("target.prefill")      # armed just after a restart, it hits during the window's refill
                    got = verifier.prefill(msg.ids, msg.pos, msg.mask, msg.slots, params if msg.pick else None,
                                           msg.score, recent=msg.recent, ring_from=msg.ring_from,
                                           rule_state=msg.rule_state)
                    if msg.score:
                        send(out, Scored(nll=got.nll), timeout=60.0)
                    if msg.pick:
                        send(out, Picked(next=got.next), timeout=60.0)
                elif isinstance(msg, Verify):
                    blk = Block(msg.ids, msg.parent, msg.q, msg.pos, None, msg.recent, msg.slots, msg.path,
                                msg.ring_from)
                    v = verifier.verify(blk, msg.mask, params, msg.rule_state)
                    chaos("target.verified")     # fault injection, test-only: K/V stored, the verdict not sent
                    send(out, Verdict(epoch=msg.epoch, block=msg.block, rows=v.rows.tolist(), next=v.next, t0=v.t0,
                                      t1=time.perf_counter(), forward_s=v.forward_s), timeout=60.0)
                elif isinstance(msg, Constrain):
                    if table is None and msg.rule is not None:
                        table = TokenTable.of(Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf)))
                    verifier.constrain(rule_from(msg.rule, table))
                else:
                    raise ValueError(f"target: unexpected message {msg.kind!r}")

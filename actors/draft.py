"""Draft actor: owns the draft (the stream proposer, or a draft model with its own KV pool) and runs ahead.

Receives from the cache owner: committed text (`observe`), scratch rollbacks, and during a generation `start` (the
pending token at committed position n), `commit` (the tokens a verdict committed) and `halt`. Emits proposals, each
tagged (epoch, block, n, pending): block b+1 is drafted from the draft's own guess of the token after block b while
the target verifies block b; at most `AHEAD` blocks are out at once (block b being verified, b+1 drafted ahead).

Never moves the committed position on its own: its ring commits exactly what the owner says was committed, and a
`start` with a new epoch drops every speculative row. Stale proposals are the owner's to discard, by epoch.
"""
from __future__ import annotations

import time

import numpy as np

from actors.common import Figures, attach_when_ready, figures_on_request, pin
from pipeline.channel import Channel, ChannelSpec

AHEAD = 2
EMPTY = np.zeros(0, np.int64)


def run(inbox: ChannelSpec, outbox: str, cfg, spec, vocab: int, stop) -> None:
    from kernels.sampling import SamplingParams
    from pipeline.assemble import make_draft
    from pipeline.blocks import BLOCK, room_of

    pin(cfg.actors.draft_cpus)
    figures = Figures("draft")
    figures_on_request(figures)
    s = cfg.sampling
    params = SamplingParams(s.temperature, s.top_k, s.top_p, s.seed)
    draft = make_draft(cfg.draft.kind, spec, params, cfg.draft.model, cfg.model.max_rows, cfg.draft.threads, vocab)
    k = min(cfg.draft.length, cfg.model.max_rows - 1)
    run_ = None      # the generation being drafted: epoch, next block's number, n and pending, the assumed path
    proposals = drafted_s = 0
    with Channel.create(inbox) as inp, attach_when_ready(outbox, stop) as out:
        catching_up = hasattr(draft, "catch_up")
        while not stop.is_set():
            busy = run_ is not None and run_["out"] < AHEAD and run_["budget"] > 0
            if not busy and catching_up and not inp.ready():
                with figures.busy():
                    if draft.catch_up():                  # idle: bring the pool up to the committed text
                        continue
            if not busy or inp.ready():
                try:
                    msg = inp.recv(timeout=0.2)
                except TimeoutError:
                    continue
                with figures.busy(), msg:
                    h = msg.header
                    kind = h["kind"]
                    if kind == "observe":
                        draft.observe(msg.arrays["ids"])
                    elif kind == "rollback":
                        draft.rollback(h["position"])
                        run_ = None
                    elif kind == "start":                     # (after committing the verdict's tokens, if any)
                        if len(msg.arrays["ids"]):
                            draft.observe(msg.arrays["ids"])
                        if draft.committed != h["n"]:
                            raise RuntimeError(f"draft out of lockstep: it holds {draft.committed} committed "
                                               f"tokens, the cache owner {h['n']}")
                        draft.rollback(h["n"])               # drop any speculation past the committed text
                        run_ = {"epoch": h["epoch"], "block": 0, "n": h["n"], "pending": h["pending"], "path": [],
                                "budget": h["budget"], "out": 0}
                    elif kind == "commit":
                        ids = [int(t) for t in msg.arrays["ids"]]
                        draft.observe(ids)
                        if run_ is not None and h["epoch"] == run_["epoch"]:
                            if run_["path"][:len(ids)] == ids:
                                run_["path"] = run_["path"][len(ids):]
                                run_["out"] -= 1
                            else:                             # a rejection: the owner restarts us with a new epoch
                                run_ = None
                    elif kind == "halt":
                        run_ = None
                    elif kind == "eof":
                        figures.extra.update(proposals=proposals, drafted_s=drafted_s, inbox_max_depth=inp.max_depth,
                                             forward_s=getattr(getattr(draft, "runner", None), "forward_s", 0.0))
                        out.send({"kind": "eof", "figures": figures.snapshot()}, timeout=60.0)
                        return
                    else:
                        raise ValueError(f"draft: unknown message kind {kind!r}")
                continue
            with figures.busy():                          # draft the next block of the current generation
                r = run_
                t0 = time.perf_counter()
                if r["pending"] is None:                  # running ahead: the next block starts at our own guess
                    r["pending"] = draft.guess(r["path"])
                    if r["pending"] is None:              # no guess: say so; the owner restarts us at its verdict
                        out.send({"kind": "proposal", "epoch": r["epoch"], "block": r["block"], "n": -1,
                                  "pending": -1, "t0": t0, "t1": time.perf_counter()},
                                 {"tokens": EMPTY, "parent": EMPTY}, timeout=60.0)
                        run_ = None
                        continue
                prop = draft.propose(r["pending"], min(k, r["budget"] - 1), room_of(r["n"], BLOCK), ahead=r["path"])
                t1 = time.perf_counter()
                arrays = {"tokens": prop.tokens, "parent": prop.parent}
                if prop.q is not None:
                    arrays["q"] = prop.q
                out.send({"kind": "proposal", "epoch": r["epoch"], "block": r["block"], "n": r["n"],
                          "pending": r["pending"], "t0": t0, "t1": t1}, arrays, timeout=60.0)
                proposals += 1
                drafted_s += t1 - t0
                depth = len(prop.tokens)                  # a chain; trees are not drafted ahead
                r["path"] = [*r["path"], r["pending"], *map(int, prop.tokens)]
                r.update(block=r["block"] + 1, n=r["n"] + depth + 1, pending=None, out=r["out"] + 1,
                         budget=r["budget"] - depth - 1)

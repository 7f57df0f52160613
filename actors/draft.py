"""Draft actor: owns the drafts of a node's streams (each stream's proposer, or a draft model with a KV pool per
stream and one session, or one set of NPU graphs, for all of them) and runs ahead for each.

Receives from the cache owner (pipeline/messages.py): committed text (`Observe`), scratch rollbacks (`Rollback`),
and during a generation `Restart` (the pending token at committed position n, after committing a verdict's tokens),
`Commit` (the tokens a verdict committed) and `Halt`; `Close` ends the stream with its figures (`Closed`). Emits
`Proposal`s tagged (epoch, block, n, pending), shaped as the step shapes them (pipeline/decode/blocklen.py `shape`:
line-end cuts, the rows of one pass) and as long as the step last chose (`length` in `Restart` and `Commit`: the
adaptive policy's choice). Block b+1 is drafted from the draft's own guess of the token after block b while the
target verifies block b, assuming b's trunk (a chain: all of it; a token tree: its base chain) is accepted whole; at
most `AHEAD` blocks are out at once. While idle it brings a draft model's pool up to the committed text, so an
analysis does not wait for it.

One actor serves every stream of a node group (pipeline/launch/plan.py): stream n's messages come on its own inbox and
its proposals go on its own outbox, so the messages carry no stream field; a draft model on the NPU is opened once,
by this one process (models/npu.py: one process may hold the NPU).

Never moves the committed position on its own: its ring commits exactly what the owner says was committed (checked
at every `Restart`), and a `Restart` drops every speculative row. Stale proposals are the owner's to discard, by
epoch.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np

from actors.args import DraftArgs
from pipeline.channel import Channel, Selector
from pipeline.decode.assemble import make_draft, policy
from pipeline.decode.blocks import ALIGNED_BLOCK, room_of, trunk
from pipeline.decode.drafts.base import Proposer
from pipeline.messages import Close, Closed, Commit, Halt, Observe, Proposal, Restart, Rollback, decode, send
from pipeline.process import Figures, attach_when_ready, chaos, figures_on_request, pin

AHEAD = 2
EMPTY = np.zeros(0, np.int64)


@dataclass
class Lookahead:
    """The generation being drafted: the next block to draft (number, position n of its pending token) and the
    uncommitted path the draft assumes before it (earlier blocks' pending tokens and proposals)."""
    epoch: int
    n: int
    pending: int | None             # None: running ahead, the pending token is the draft's guess after `path`
    budget: int                     # tokens the generation may still emit
    block: int = 0
    path: list[int] = field(default_factory=list)
    out: int = 0                    # blocks sent and not yet committed

    def wants_block(self) -> bool:
        return self.out < AHEAD and self.budget > 0


class Drafter:
    def __init__(self, draft: Proposer, policy, out, figures: Figures, sink: int, window: int):
        self.draft, self.policy, self.out, self.figures = draft, policy, out, figures
        self.k = policy.length                            # until the owner says otherwise
        self.room = lambda n: room_of(n, ALIGNED_BLOCK, sink, window)
        self.run: Lookahead | None = None
        self.proposals, self.drafted_s = 0, 0.0

    @property
    def busy(self) -> bool:
        return self.run is not None and self.run.wants_block()

    def handle(self, msg) -> None:
        draft, run = self.draft, self.run
        match msg:
            case Observe():
                draft.observe(msg.ids)
            case Rollback():
                draft.rollback(msg.position)
                if msg.forget:
                    draft.forget()
                self.run = None
            case Restart():
                if len(msg.ids):
                    draft.observe(msg.ids)
                if draft.committed != msg.n:
                    raise RuntimeError(f"draft out of lockstep: it holds {draft.committed} committed tokens, the "
                                       f"cache owner {msg.n}")
                draft.rollback(msg.n)                     # drop any speculation past the committed text
                self.k = self.policy.length if msg.length < 0 else msg.length
                self.run = Lookahead(msg.epoch, msg.n, msg.pending, msg.budget)
            case Commit():
                self.k = self.policy.length if msg.length < 0 else msg.length
                ids = [int(t) for t in msg.ids]
                draft.observe(ids)
                if run is not None and msg.epoch == run.epoch:
                    if run.path[:len(ids)] == ids:        # the block we assumed: keep running ahead
                        run.path = run.path[len(ids):]
                        run.out -= 1
                    else:                                 # a rejection: the owner restarts us with a new epoch
                        self.run = None
            case Halt():
                self.run = None
            case _:
                raise ValueError(f"draft: unexpected message {msg.kind!r}")

    def draft_block(self) -> None:
        """Draft the next block of the current generation and send it."""
        r = self.run
        t0 = time.perf_counter()
        if r.pending is None:                             # running ahead: the block starts at our own guess
            r.pending = self.draft.guess(r.path)
            if r.pending is None:                         # no guess: say so; the owner restarts us at its verdict
                self._send(r, EMPTY, EMPTY, None, n=-1, pending=-1, t0=t0)
                self.run = None
                return
        prop = self.draft.propose(r.pending, min(self.k, r.budget - 1), self.room(r.n), ahead=r.path)
        prop = self.policy.shape(prop)                    # as the step will shape it
        self._send(r, prop.tokens, prop.parent, prop.q, n=r.n, pending=r.pending, t0=t0)
        depth = trunk(prop.parent)                        # the next block assumes the trunk accepted whole
        r.path = [*r.path, r.pending, *map(int, prop.tokens[:depth])]
        r.block, r.n, r.pending, r.out, r.budget = r.block + 1, r.n + depth + 1, None, r.out + 1, r.budget - depth - 1

    def _send(self, r: Lookahead, tokens, parent, q, n: int, pending: int, t0: float) -> None:
        t1 = time.perf_counter()
        chaos("draft.proposed")                          # fault injection, test-only: drafted, not yet sent
        send(self.out, Proposal(epoch=r.epoch, block=r.block, n=n, pending=pending, t0=t0, t1=t1, tokens=tokens,
                                parent=parent, q=q), timeout=60.0)
        self.proposals += 1
        self.drafted_s += t1 - t0


def run(args: DraftArgs) -> None:
    """Stream n's messages arrive on inboxes[n] (created here) and its proposals go to outboxes[n] (its owner's).
    Messages first (a `Restart` or `Halt` makes a drafted block stale), then the streams that want a block, in turn,
    then an idle draft model's catch-up; the actor ends when every stream has closed."""
    cfg, spec, stop = args.cfg, args.spec, args.stop
    pin(cfg.actors.draft_cpus)
    figures = Figures("draft")
    figures_on_request(figures)
    shared: list = []                                     # one draft model's session (or NPU graphs) for every stream
    drafts = [make_draft(cfg, spec, args.vocab, shared) for _ in args.inboxes]
    rule = policy(cfg, args.vocab)
    with ExitStack() as held:
        inps = [held.enter_context(Channel.create(spec_n)) for spec_n in args.inboxes]
        outs = [held.enter_context(attach_when_ready(name, stop)) for name in args.outboxes]
        drafters = [Drafter(d, rule, out, figures, spec.sink, spec.window) for d, out in zip(drafts, outs)]
        selector, open_, turn = Selector(inps), set(range(len(inps))), 0
        while open_ and not stop.is_set():
            ready = [n for n in sorted(open_) if inps[n].ready()]
            with figures.busy():
                for n in ready:
                    with inps[n].recv(timeout=1.0) as received:
                        msg = decode(received)
                        if isinstance(msg, Close):
                            _close(drafters[n], inps[n], figures)
                            open_.discard(n)
                        else:
                            drafters[n].handle(msg)
                if ready:
                    continue
                busy = [n for n in sorted(open_) if drafters[n].busy]
                if busy:                                  # the next stream after the last one served
                    n = next((m for m in busy if m >= turn), busy[0])
                    drafters[n].draft_block()
                    turn = n + 1
                    continue
                if any(drafters[n].draft.catch_up() for n in sorted(open_)):
                    continue                              # idle: a draft model's pool brought up to its text
            selector.wait(0.2)


def _close(drafter: Drafter, inp: Channel, figures: Figures) -> None:
    """A stream's `Close`: its figures (the actor's, with this stream's proposals) to its owner."""
    figures.extra.update(proposals=drafter.proposals, drafted_s=drafter.drafted_s, inbox_max_depth=inp.max_depth,
                         forward_s=getattr(getattr(drafter.draft, "runner", None), "forward_s", 0.0))
    send(drafter.out, Closed(figures=figures.snapshot()), timeout=60.0)

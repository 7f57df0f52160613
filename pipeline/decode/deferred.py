"""The channel pair the step runs with in the actor pipeline: the target actor as verifier, the draft actor as drafter.

Owns the cache owner's end of the four model links (pipeline/messages.py) and the pipelining: block b+1, drafted
ahead from the draft's guess while the target verifies block b, is verified next if the verdict on b bore the guess
out (the block's whole trunk accepted, the next token == the guess); otherwise the draft restarts at the verdict
under a new epoch and every proposal of the old epoch is discarded (counted stale). Never plans, judges or commits:
the step does (pipeline/decode/step.py), exactly as in the serial engine, and this module carries its planned blocks
to the target and the target's verdicts back. Never runs a model and never touches a pool.
"""
from __future__ import annotations

import time

import numpy as np

from kernels.sampling import SamplingParams
from pipeline.channel import Selector
from pipeline.decode.blocks import Block
from pipeline.decode.drafts.base import Proposed
from pipeline.decode.interfaces import Drafted, Prefilled, Verified
from pipeline.decode.step import Decoder, Policy
from pipeline.messages import (
    Close,
    Closed,
    Commit,
    Constrain,
    Halt,
    Observe,
    Picked,
    Prefill,
    Proposal,
    Ready,
    Restart,
    Rollback,
    Scored,
    Verdict,
    Verify,
    copied,
    decode,
    send,
)
from pipeline.process import chaos

TIMEOUT_S = 120.0


class ActorSilent(RuntimeError):
    pass


class Links:
    """The four model links and the one receive loop over them: proposals are kept aside until asked for."""

    def __init__(self, to_target, from_target, to_draft, from_draft):
        self.to_target, self.from_target, self.to_draft, self.from_draft = to_target, from_target, to_draft, from_draft
        self._selector = Selector([from_target, from_draft])
        self.proposals: list[Proposal] = []     # proposals that arrived while waiting for something else
        self.epoch = 0                           # the draft's current generation; older proposals are stale
        self.dropped = 0                         # proposals discarded as stale since the last `take_dropped`
        self.dropped_s = 0.0                     # ... and their draft seconds

    def await_target(self, cls):
        """The target's next message, which must be a `cls`."""
        while True:
            got = self.receive(want_target=True)
            if got is not None:
                if not isinstance(got, cls):
                    raise RuntimeError(f"cache owner: expected {cls.kind!r} from the target, got {got.kind!r}")
                return got

    def receive(self, want_target: bool):
        """Take one message: a draft proposal goes to `proposals` (or is dropped as stale); a target message is
        returned (when wanted)."""
        channels = [self.from_target, self.from_draft] if want_target else [self.from_draft]
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            ready = [ch for ch in self._selector.wait(0.5) if ch in channels]
            if ready:
                break
            if time.monotonic() > deadline:
                raise ActorSilent(f"cache owner: no message from the {'target' if want_target else 'draft'} "
                                  f"within {TIMEOUT_S:.0f} s")
        ch = ready[0]
        with ch.recv(timeout=1.0) as received:
            msg = copied(decode(received))
        if ch is self.from_draft:
            if not isinstance(msg, Proposal):
                raise RuntimeError(f"cache owner: unexpected {msg.kind!r} from the draft")
            if msg.epoch == self.epoch:
                self.proposals.append(msg)
            else:
                self.drop(msg)
            return None
        return msg

    def drop(self, prop: Proposal) -> None:
        self.dropped += 1
        self.dropped_s += prop.t1 - prop.t0


class ChannelVerifier:
    """The target actor: a planned pass goes out as `Prefill` or `Verify`; its answers come back. The target judges
    with its own sampler (the config's [sampling]), consumed in the serial engine's order."""

    def __init__(self, links: Links, mask_size: int):
        self.links = links
        self._mask = np.empty(mask_size, np.float32)
        self.blocks = 0                 # verify blocks sent to the target so far
        self.on_block = None            # on_block(blocks) after each is sent (the owner notes what was waiting)
        self._rule = None               # the rule spec the target judges with

    def constrain(self, rule) -> None:
        spec = None if rule is None else rule.spec
        if spec != self._rule:
            send(self.links.to_target, Constrain(rule=spec), timeout=TIMEOUT_S)
            self._rule = spec

    def mask_buffer(self) -> np.ndarray:
        return self._mask

    def prefill(self, ids, pos, mask, slots, pick: SamplingParams | None = None, score: bool = False,
                all_logits: bool = False, recent=None, ring_from: int = 0, rule_state: str | None = None) -> Prefilled:
        if all_logits:
            raise ValueError("the actor pipeline returns no logits: score in the serial engine")
        send(self.links.to_target, Prefill(pick=pick is not None, score=score, ids=ids, pos=pos, mask=mask,
                                           recent=pos[:0] if recent is None else recent, slots=slots,
                                           ring_from=ring_from, rule_state=rule_state),
             timeout=TIMEOUT_S)
        got = Prefilled()
        if score:
            scored = self.links.await_target(Scored)
            got.nll = scored.nll
        if pick is not None:
            got.next = self.links.await_target(Picked).next
        return got

    def verify(self, blk: Block, mask: np.ndarray, params: SamplingParams, rule_state: str | None = None) -> Verified:
        send(self.links.to_target, Verify(epoch=self.links.epoch, block=self.blocks, ids=blk.tokens, pos=blk.pos,
                                          mask=mask, parent=blk.parent, recent=blk.recent, slots=blk.slots, q=blk.q,
                                          path=blk.path, ring_from=blk.ring_from, rule_state=rule_state),
             timeout=TIMEOUT_S)
        self.blocks += 1
        if self.on_block is not None:
            self.on_block(self.blocks)
        v = self.links.await_target(Verdict)
        chaos("owner.verdict")                        # fault injection, test-only: a verdict not yet committed
        return Verified(np.asarray(v.rows, np.int64), v.next, v.t0, v.t1, v.forward_s)


class DraftLink:
    """The draft actor, a block ahead: the proposal for the step's (epoch, block) if it assumed the position and
    pending token the step has, else a restart there (what it drafted is stale). The block length the step chose
    travels with each verdict the draft is told of, for the blocks it drafts next."""

    def __init__(self, links: Links):
        self.links = links
        self.block = 0                  # the next block's number within the epoch
        self.length = -1                # the length the step chose last (-1: none yet, the draft's own)

    def observe(self, ids) -> None:
        send(self.links.to_draft, Observe(ids=ids), timeout=TIMEOUT_S)

    def rollback(self, mark: int, forget: bool = False) -> None:
        send(self.links.to_draft, Rollback(position=int(mark), forget=forget), timeout=TIMEOUT_S)

    def start(self, pending: int, n: int, budget: int) -> None:
        self._restart(pending, n, budget)

    def propose(self, pending: int, n: int, k: int, room: int, budget: int, stats) -> Drafted:
        self.length = k
        while True:
            got = self._proposal(self.block)
            if got.n == n and got.pending == pending:
                break
            self.links.drop(got)            # it assumed another verdict (or had no guess): start again here
            self._restart(pending, n, budget)
        stats.stale += self.links.dropped
        stats.wasted_draft_s += self.links.dropped_s
        self.links.dropped, self.links.dropped_s = 0, 0.0
        return Drafted(Proposed(got.tokens, got.parent, got.q), got.t0, got.t1, ahead=got.block > 0)

    def verdict(self, committed, n: int, nxt: int, whole: bool, budget: int) -> None:
        if whole:                           # the draft's next block stands if its guess equals nxt
            self.block += 1
            send(self.links.to_draft, Commit(epoch=self.links.epoch, length=self.length, ids=committed),
                 timeout=TIMEOUT_S)
        else:                               # a rejection: the draft restarts at the correction, in one message
            self._restart(nxt, n, budget, committed)

    def halt(self) -> None:
        send(self.links.to_draft, Halt(), timeout=TIMEOUT_S)

    def _restart(self, pending: int, n: int, budget: int, committed=None) -> None:
        """Start the draft at `pending` (position n once `committed` is committed) under a new epoch."""
        links = self.links
        links.epoch += 1
        for prop in links.proposals:
            links.drop(prop)
        links.proposals = []
        self.block = 0
        ids = np.zeros(0, np.int64) if committed is None else committed
        send(links.to_draft, Restart(epoch=links.epoch, n=n, pending=int(pending), budget=int(budget),
                                     length=self.length, ids=ids), timeout=TIMEOUT_S)

    def _proposal(self, block: int) -> Proposal:
        """The current epoch's proposal for `block` (copied out of the channel)."""
        links = self.links
        while True:
            for i, prop in enumerate(links.proposals):
                if prop.block == block:
                    return links.proposals.pop(i)
            links.receive(want_target=False)


class DeferredEngine(Decoder):
    """The step over the model links, as the cache owner (and the speed bench's `pipelined` system) runs it."""

    def __init__(self, spec, policy: Policy, to_target, from_target, to_draft, from_draft, max_recent: int = 64):
        self.links = Links(to_target, from_target, to_draft, from_draft)
        self.to_target = to_target
        rows = max(policy.max_rows, policy.prefill)
        verifier = ChannelVerifier(self.links, rows * (spec.pool_slots + max_recent + rows))
        super().__init__(spec, verifier, DraftLink(self.links), policy)
        ready = self.links.await_target(Ready)  # the target's first word: its batch-invariance verdict, where it runs
        self.exactness, self.platform = ready.exactness, ready.platform

    @property
    def blocks(self) -> int:
        return self.verifier.blocks

    @property
    def on_block(self):
        return self.verifier.on_block

    @on_block.setter
    def on_block(self, fn) -> None:
        self.verifier.on_block = fn

    def close(self) -> list[dict]:
        """End of stream: ask both model actors for their figures."""
        figures = []
        for to in (self.links.to_target, self.links.to_draft):
            send(to, Close(), timeout=TIMEOUT_S)
        for ch in (self.links.from_target, self.links.from_draft):
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                with ch.recv(timeout=max(0.1, deadline - time.monotonic())) as received:
                    msg = decode(received)
                if isinstance(msg, Closed):
                    figures.append(dict(msg.figures))
                    break
        return figures

"""Deferred speculative decoding across actors, as the cache owner runs it: the same algorithm as `Engine`, with the
target and the draft in processes of their own.

Owns the target's sequence state (its `RingIndex`, the pending token), the draft's committed position (by telling
it what was committed), and the pipelining: block b+1, drafted ahead from the draft's guess while the target verifies
block b, is verified next if the verdict on b bore the guess out (every proposal accepted, bonus == the guess);
otherwise the draft restarts at the verdict under a new epoch and every proposal of the old epoch is discarded. Never
runs a model and never touches a pool: it sends fully specified passes (rows, positions, mask, slots) and reads
verdicts (the messages of pipeline/messages.py).

Identity: masks, blocks and acceptance are those of `Engine` (pipeline/decode/blocks.py), so greedy output is the serial
engine's bit for bit.
"""
from __future__ import annotations

import time

import numpy as np

from kernels.ring import RingIndex, slot_of
from kernels.sampling import SamplingParams
from pipeline.channel import Selector
from pipeline.decode import drafts
from pipeline.decode.blocks import ALIGNED_BLOCK, plan_block
from pipeline.decode.engine import GenerateResult, Sequence, Stats
from pipeline.messages import (
    Close,
    Closed,
    Commit,
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

TIMEOUT_S = 120.0


class ActorSilent(RuntimeError):
    pass


class DeferredEngine(Sequence):
    def __init__(self, spec, max_rows: int, draft_len: int, to_target, from_target, to_draft, from_draft,
                 max_recent: int = 64):
        self.spec, self.max_rows, self.draft_len = spec, max_rows, draft_len
        self.index = RingIndex(spec)
        self.pending: int | None = None
        self.epoch = 0
        self.to_target, self.from_target, self.to_draft, self.from_draft = to_target, from_target, to_draft, from_draft
        self._selector = Selector([from_target, from_draft])
        self._mask = np.empty(max_rows * (spec.pool_slots + max_recent + max_rows), np.float32)
        self._early: list[Proposal] = []   # proposals that arrived while waiting for something else
        self.totals = Stats()           # every generation's stats, summed (for the run-time figures)
        self.blocks = 0                 # verify blocks sent to the target so far
        self.on_block = None            # on_block(blocks) after each is sent (the owner notes what was waiting)
        ready = self._await(Ready)      # the target's first word: its batch-invariance verdict, where it runs
        self.exactness, self.platform = ready.exactness, ready.platform

    # -- feeding text into the cache -------------------------------------------------------------------------------
    def feed(self, ids, pick: bool = False, score: bool = False):
        """Commit tokens (the pending one first, if any) in chunks; with `pick`, the target's next token; with
        `score`, (sum, count) of the NLL of every token but each chunk's first, teacher-forced."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if self.pending is not None:
            ids = np.concatenate([[self.pending], ids])
            self.pending = None
        if pick and not len(ids):
            raise ValueError("generate needs a non-empty prompt or context")
        nll_sum, nll_n = 0.0, 0
        for start in range(0, len(ids), self.max_rows):
            chunk = ids[start:start + self.max_rows]
            T = len(chunk)
            pos = self.index.n + np.arange(T, dtype=np.int64)
            mask = self.index.visible_mask(pos, None, out=self._mask)
            slots = self.index.write(pos)
            self.index.commit(T)
            last = pick and start + T == len(ids)
            send(self.to_target, Prefill(pick=last, score=score, ids=chunk, pos=pos, mask=mask, recent=pos[:0],
                                         slots=slots), timeout=TIMEOUT_S)
            send(self.to_draft, Observe(ids=chunk), timeout=TIMEOUT_S)
            if score:
                scored = self._await(Scored)
                nll_sum, nll_n = nll_sum + scored.nll_sum, nll_n + scored.nll_n
        if pick:
            return self._await(Picked).next
        return (nll_sum, nll_n) if score else None

    def _rollback_draft(self, mark: int, forget: bool = False) -> None:
        send(self.to_draft, Rollback(position=int(mark), forget=forget), timeout=TIMEOUT_S)

    # -- generation ------------------------------------------------------------------------------------------------
    def generate(self, prompt_ids, max_tokens: int, params: SamplingParams = SamplingParams(),
                 stop_ids=(), on_tokens=None, keep_going=None) -> GenerateResult:
        """Prefill, then decode up to max_tokens (stopping after a stop token). on_tokens(ids) sees the tokens of the
        answer as each verdict commits them (stop token included, nothing past it or past max_tokens); keep_going()
        is asked before each block, and False ends the generation there (a preempted analysis, a deadline)."""
        stats = Stats(prompt_tokens=len(prompt_ids))
        t0 = time.perf_counter()
        self.pending = self.feed(prompt_ids, pick=True)
        stats.prefill_s = time.perf_counter() - t0
        stats.ttft_ms = stats.prefill_s * 1000.0
        start = self.index.n
        out = [self.pending]
        stops = set(int(s) for s in stop_ids)
        shown = _show(out, 0, stops, max_tokens, on_tokens)
        t1 = time.perf_counter()
        self._restart(max_tokens - len(out))
        block, last_verify = 0, None
        while len(out) < max_tokens and not stops.intersection(out[-self.max_rows:]) and \
                (keep_going is None or keep_going()):
            drafted = self._proposal(block)
            if drafted.n != self.index.n or drafted.pending != self.pending:    # the guess was wrong
                stats.wasted_draft_s += drafted.t1 - drafted.t0
                self._restart(max_tokens - len(out))
                block = 0
                continue
            blk = self._verify(drafts.Proposal(drafted.tokens, drafted.parent, drafted.q), block)
            verdict = self._await(Verdict)
            if last_verify is not None:      # draft work for this block done while the target verified the last one
                stats.overlap_s += max(0.0, min(drafted.t1, last_verify[1]) - max(drafted.t0, last_verify[0]))
                stats.target_idle_s += verdict.t0 - last_verify[1]
            stats.draft_s += drafted.t1 - drafted.t0
            stats.verify_s += verdict.t1 - verdict.t0
            stats.verify_forward_s += verdict.forward_s
            last_verify = (verdict.t0, verdict.t1)
            rows = np.asarray(verdict.rows, np.int64)
            committed = blk.tokens[rows]
            self.pending = verdict.next
            out.extend([int(t) for t in committed[1:]] + [self.pending])
            shown = _show(out, shown, stops, max_tokens, on_tokens)
            if len(rows) - 1 == len(blk.proposals):
                block += 1                   # the draft's next block stands if its guess equals self.pending
                send(self.to_draft, Commit(epoch=self.epoch, ids=committed), timeout=TIMEOUT_S)
            else:                            # a rejection: the draft restarts at the correction, in one message
                block = 0
                self._restart(max_tokens - len(out), committed)
            n = self.index.n                 # bookkeeping while the draft drafts
            self.index.write(n + np.arange(len(rows), dtype=np.int64))
            self.index.commit(len(rows))
            stats.count_block(blk, rows, self.spec, self.max_rows)
        stats.decode_s = time.perf_counter() - t1
        send(self.to_draft, Halt(), timeout=TIMEOUT_S)
        result = self._finish(out, start, stops, max_tokens, stats)
        self.totals.add(stats)
        return result

    def _restart(self, budget: int, committed=None) -> None:
        """Start the draft at the pending token under a new epoch (after committing `committed`, if given)."""
        self.epoch += 1
        ids = np.zeros(0, np.int64) if committed is None else committed
        send(self.to_draft, Restart(epoch=self.epoch, n=self.index.n + len(ids), pending=int(self.pending),
                                    budget=int(budget), ids=ids), timeout=TIMEOUT_S)

    def _verify(self, prop: drafts.Proposal, block: int):
        n = self.index.n
        blk = plan_block(n, self.pending, prop, ALIGNED_BLOCK, self.spec.sink, self.spec.ring)
        mask = self.index.visible_mask(blk.pos, blk.anc, out=self._mask, recent_from=n - len(blk.recent))
        send(self.to_target, Verify(epoch=self.epoch, block=block, ids=blk.tokens, pos=blk.pos, mask=mask,
                                    parent=blk.parent, recent=slot_of(blk.recent, self.spec.sink, self.spec.ring),
                                    slots=blk.slots, q=blk.q), timeout=TIMEOUT_S)
        self.blocks += 1
        if self.on_block is not None:
            self.on_block(self.blocks)
        return blk

    def _proposal(self, block: int) -> Proposal:
        """The current epoch's proposal for `block` (copied out of the channel); stale ones are dropped."""
        while True:
            for i, prop in enumerate(self._early):
                if prop.epoch == self.epoch and prop.block == block:
                    del self._early[i]
                    return prop
            self._early = [p for p in self._early if p.epoch == self.epoch and p.block > block]
            self._receive(want_target=False)

    def _await(self, cls):
        """The target's next message, which must be a `cls`."""
        while True:
            got = self._receive(want_target=True)
            if got is not None:
                if not isinstance(got, cls):
                    raise RuntimeError(f"cache owner: expected {cls.kind!r} from the target, got {got.kind!r}")
                return got

    def _receive(self, want_target: bool):
        """Take one message: a draft proposal goes to `_early`; a target message is returned (when wanted)."""
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
                self._early.append(msg)
            return None
        return msg

    def close(self) -> list[dict]:
        """End of stream: ask both model actors for their figures."""
        figures = []
        for to in (self.to_target, self.to_draft):
            send(to, Close(), timeout=TIMEOUT_S)
        for ch in (self.from_target, self.from_draft):
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                with ch.recv(timeout=max(0.1, deadline - time.monotonic())) as received:
                    msg = decode(received)
                if isinstance(msg, Closed):
                    figures.append(dict(msg.figures))
                    break
        return figures


def _show(out: list[int], shown: int, stops: set, max_tokens: int, on_tokens) -> int:
    """Hand on_tokens the answer's tokens past `shown`, up to the first stop token and max_tokens; the new count."""
    if on_tokens is None:
        return shown
    end = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
    end = min(end, max_tokens)
    if end > shown:
        on_tokens(out[shown:end])
    return max(end, shown)

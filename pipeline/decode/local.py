"""The local pair the step runs with: the target's runner as verifier and a draft as drafter, in this process.

Owns running and judging passes on a runner (`LocalVerifier`: the serial engine's verifier, and the target actor's,
which wraps it behind a channel) and asking an in-process draft (`LocalDraft`). Never plans a block and never moves
the committed position: the step (pipeline/decode/step.py) hands it fully planned blocks and commits their verdicts.
"""
from __future__ import annotations

import time

import numpy as np

from kernels.ring import slot_of
from kernels.sampling import SamplingParams, sample, target_probs
from models.streams import Rows
from pipeline.decode.blocks import Block, judge
from pipeline.decode.drafts.none import NoDraft
from pipeline.decode.rules import constrain_rows
from pipeline.decode.interfaces import Drafted, Prefilled, Verified


class LocalVerifier:
    """The target's runner: prefill passes, verify passes judged with this verifier's random stream (consumed in the
    order the step asks: a generation's pick, then its blocks)."""

    def __init__(self, runner, seed: int = 0):
        self.runner, self.spec = runner, runner.spec
        self.rng = np.random.default_rng(seed)
        self._probs = np.zeros((runner.opts.max_rows, runner.vocab), np.float64)
        self._last_row = np.zeros(1, np.int64)
        self._targets = np.zeros(runner.opts.max_rows, np.int64)
        self._nll = np.zeros(runner.opts.max_rows, np.float32)
        self._tail = None           # (logits [V], float64 scratch [V]) of the last scored row: at the first scored pass
        self._tail_pos = None       # ... its position (None: none): it predicts the next scored pass's first token
        self.rule = None            # the answer's rule (pipeline/decode/rules.py): set by `constrain`
        self.unscored = None        # bool [V]: tokens a scored pass leaves unscored (NaN), their rows off the head
        self._rows = np.zeros(runner.opts.max_rows, np.int64)

    def constrain(self, rule) -> None:
        """Judge the coming answer's passes against `rule` (None: unconstrained)."""
        self.rule = rule

    def mask_buffer(self) -> np.ndarray:
        return self.runner.mask_buffer()

    def prefill(self, ids, pos, mask, slots, pick: SamplingParams | None = None, score: bool = False,
                all_logits: bool = False, recent=None, ring_from: int = 0, rule_state: str | None = None) -> Prefilled:
        """Run a pass of committed text and store every row's K/V at `slots`; `recent`: the positions of its recent
        section (pipeline/decode/step.py `feed`); rule_state: the answer's rule state for the picked token."""
        return self.drive(self.prefill_pass(ids, pos, mask, slots, pick, score, all_logits, recent, ring_from,
                                            rule_state))

    def prefill_pass(self, ids, pos, mask, slots, pick: SamplingParams | None = None, score: bool = False,
                     all_logits: bool = False, recent=None, ring_from: int = 0, rule_state: str | None = None):
        """`prefill` as a pass coroutine: yields the pass's `Rows`, is sent its logits, returns the `Prefilled`
        (`drive` runs it on this verifier's runner; a batch of streams runs several in one pass: actors/target.py)."""
        T = len(ids)
        self._last_row[0] = T - 1
        self._overwritten(pos[0])
        recent = None if recent is None or not len(recent) else slot_of(recent, self.spec.sink, self.spec.ring)
        rows, targets = (None if all_logits else self._last_row), None
        if score:                   # row r predicts token r + 1 (scored ones); the last row, the next pass's first
            rows = self._scored_rows(ids)
            targets = self._targets[:len(rows)]
            np.take(ids, np.minimum(rows + 1, T - 1), out=targets)
        logits = yield Rows(ids, pos, mask, rows, recent_slots=recent, ring_from=ring_from, targets=targets)
        self.runner.store(np.arange(T), slots)
        got = Prefilled(logits=logits)
        if score:
            got.nll = self._nll[:T]
            got.nll.fill(np.nan)
            got.nll[rows[:-1] + 1] = self.runner.nll[:len(rows) - 1]
            if self.unscored is None or not self.unscored[ids[0]]:
                got.nll[0] = self._from_tail(int(pos[0]), int(ids[0]))
            self._keep_tail(logits[-1], int(pos[T - 1]))
        if pick is not None:
            if self.rule is not None and rule_state is not None:
                constrain_rows(logits[-1:], self.rule, [rule_state])
            got.next = self._pick(logits[-1], pick)
        return got

    def drive(self, steps):
        """Run a pass coroutine (`prefill_pass`, `verify_pass`, `run_pass`) on this verifier's own runner."""
        try:
            rows = next(steps)
            while True:
                rows = steps.send(self.runner.forward(**vars(rows)))
        except StopIteration as done:
            return done.value

    def run(self, blk: Block, mask: np.ndarray, targets: np.ndarray | None = None) -> np.ndarray:
        """The block's forward pass: logits [N+1, V] (its K/V in the runner's new_k/new_v until the next pass;
        with targets, each row's surprisal of its target in the runner's `nll`)."""
        return self.drive(self.run_pass(blk, mask, targets))

    def run_pass(self, blk: Block, mask: np.ndarray, targets: np.ndarray | None = None):
        recent = slot_of(blk.recent, self.spec.sink, self.spec.ring)
        return (yield Rows(blk.tokens, blk.pos, mask, path=blk.path, recent_slots=recent if len(recent) else None,
                           ring_from=blk.ring_from, targets=targets))

    def verify(self, blk: Block, mask: np.ndarray, params: SamplingParams, rule_state: str | None = None) -> Verified:
        """Run the block, judge it (against the constrained target when a rule is set and `rule_state` given: the
        state before the pending token), store the committed rows' K/V at the block's slots."""
        return self.drive(self.verify_pass(blk, mask, params, rule_state))

    def verify_pass(self, blk: Block, mask: np.ndarray, params: SamplingParams, rule_state: str | None = None):
        """`verify` as a pass coroutine (see `prefill_pass`)."""
        t0, f0 = time.perf_counter(), self.runner.forward_s
        self._overwritten(int(blk.pos.min()))
        logits = yield from self.run_pass(blk, mask)
        rows, nxt = judge(logits, blk, params, self._probs, self.rng, self.rule, rule_state)
        self.runner.store(rows, blk.slots[:len(rows)])
        return Verified(rows, nxt, t0, time.perf_counter(), self.runner.forward_s - f0)

    def _pick(self, logits: np.ndarray, params: SamplingParams) -> int:
        if params.greedy:
            return int(np.argmax(logits))
        return sample(target_probs(logits, params, out=self._probs[0]), self.rng)

    def _scored_rows(self, ids) -> np.ndarray:
        """The rows whose next token is scored, then the last row (its next token is the next pass's first)."""
        T = len(ids)
        rows = self._rows[:T]
        if self.unscored is None:
            rows[:] = np.arange(T)
            return rows
        keep = np.flatnonzero(~self.unscored[ids[1:]])
        rows[:len(keep)], rows[len(keep)] = keep, T - 1
        return rows[:len(keep) + 1]

    def _keep_tail(self, row: np.ndarray, position: int) -> None:
        if self._tail is None:        # once: engines that never score (and the exactness probe) do not carry it
            self._tail = (np.zeros(self.runner.vocab, np.float32), np.zeros(self.runner.vocab, np.float64))
        np.copyto(self._tail[0], row)
        self._tail_pos = position

    def _overwritten(self, first: int) -> None:
        """A pass writes positions from `first` on: a kept row at or after it no longer holds (a rollback rewrote
        it); one before it does (a scratch span after the stream, rolled back, leaves the stream's rows as is)."""
        if self._tail_pos is not None and first <= self._tail_pos:
            self._tail_pos = None

    def _from_tail(self, position: int, token: int) -> float:
        """-log p(token) at `position` from the kept row before it, in float64 (NaN: no row kept there)."""
        if self._tail_pos is None or self._tail_pos != position - 1:
            return float("nan")
        row, scratch = self._tail
        np.copyto(scratch, row)
        top = scratch.max()
        scratch -= top
        np.exp(scratch, out=scratch)
        return float(top + np.log(scratch.sum()) - row[token])


class LocalDraft:
    """A draft in this process (`pipeline/decode/drafts/`), asked for each block when the step needs it."""

    def __init__(self, draft=None):
        self.draft = draft or NoDraft()

    def observe(self, ids) -> None:
        self.draft.observe(ids)

    def rollback(self, mark: int, forget: bool = False) -> None:
        self.draft.rollback(mark)
        if forget:
            self.draft.forget()

    def start(self, pending: int, n: int, budget: int) -> None:
        pass

    def propose(self, pending: int, n: int, k: int, room: int, budget: int, stats) -> Drafted:
        t0 = time.perf_counter()
        prop = self.draft.propose(pending, k, room)
        return Drafted(prop, t0, time.perf_counter())

    def verdict(self, committed, n: int, nxt: int, whole: bool, budget: int) -> None:
        self.draft.observe(committed)

    def halt(self) -> None:
        pass

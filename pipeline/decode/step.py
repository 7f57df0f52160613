"""One speculative step for both engines: propose -> plan -> verify -> judge -> commit, and the loop around it.

Owns the target's sequence state (its `RingIndex`, the pending token), the block-length policy's use (fixed, adaptive,
line-end blocks), the generation loop and its figures. Never runs a model and never holds a draft: a drafter
proposes and a verifier runs and judges passes (their contracts: pipeline/decode/interfaces.py). The serial engine
passes the local pair (pipeline/decode/local.py: the runner and the draft in this process); the actor pipeline
passes the channel pair (pipeline/decode/deferred.py: the target actor, and the draft actor running a block ahead
under epochs). Nothing else differs.

One step of speculative decoding (docs/design.md, "Lossless speculation"):
  propose N tokens after the pending one -> verify [pending, proposals] in one target pass (rows see the sinks, their
  window and their tree ancestors) -> accept a path -> commit the K/V of pending + accepted -> next token is pending.

Greedy identity, bit for bit: with int8 activations a row's result moves by ~0.5 logits if its attention sums the
same terms in another grouping (1e-7 differences cross int8 rounding steps). So every decoding pass splits keys at
the same place whatever the draft did: positions are grouped in aligned blocks of B; a row at u reads positions below
s(u) = u - u % B from the pool and [s(u), u] as one "recent + new" section; a verify block never crosses a block
boundary. A row is then computed identically with or without a draft (rows are independent of the pass's size).
A feed (prompt, stream lines) keeps the same rule on its own grid G (`Policy.prefill`): its passes end at multiples
of G and read [s(u), n) as their recent section, so a text's K/V do not depend on how it was cut into feeds (a line
at a time, or every waiting line at once: the cache owner packs them when the stream runs ahead).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import numpy as np

from kernels.ring import RingIndex, passes
from kernels.sampling import SamplingParams
from pipeline.decode.blocklen import LengthControl, shape
from pipeline.decode.blocks import (ALIGNED_BLOCK, lap, near_wrap, plan_block, recent_start, room_of, trunk,
                                    verify_mask)
from pipeline.decode.drafts.base import Proposed
from pipeline.decode.interfaces import Drafted, Drafter, Verified, Verifier


@dataclass
class Policy:
    """How long a block is and where it ends; the draft actor shapes its run-ahead blocks with the same `shape`."""
    length: int                                 # proposals per block (the upper bound when adaptive)
    max_rows: int                               # rows of one target pass
    control: LengthControl | None = None        # adaptive: the length chosen online from acceptance and costs
    line_ends: np.ndarray | None = None         # bool per token id: a block ends after a newline; None: it may not
    prefill_rows: int = 0                       # rows of a feed's pass, and its grid (0: max_rows)

    @property
    def prefill(self) -> int:
        return self.prefill_rows or self.max_rows

    def choose(self) -> int:
        return self.length if self.control is None else self.control.choose(self.length)

    def shape(self, prop: Proposed) -> Proposed:
        return shape(prop, self.line_ends, self.max_rows)

    def observe(self, blk, v: Verified, d: Drafted) -> None:
        if self.control is not None:    # the trunk's length is what `choose` chose; siblings ride along
            on_trunk = v.rows[1:] == np.arange(1, len(v.rows))      # the path's first i rows are trunk nodes 1..i
            accepted = len(on_trunk) if on_trunk.all() else int(np.argmin(on_trunk))
            self.control.observe(trunk(blk.parent), accepted, v.forward_s, d.t1 - d.t0)


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_ms: float = 0.0
    verify_calls: int = 0
    proposed: int = 0
    accepted: int = 0
    rejections: int = 0
    rejections_after_wrap: int = 0   # rejected blocks whose rows lie within one block of a ring wrap point
    salvaged: int = 0                # tree blocks whose accepted path starts at a sibling of the first proposal
    trees: int = 0                   # blocks verified as a tree (a proposal beside the first one)
    wraps: int = 0                   # times the committed position crossed a ring wrap point
    draft_s: float = 0.0
    # Overlap (the actor pipeline's run-ahead; 0 in the serial engine): draft time spent while the target verified the
    # previous block, verify passes whose block the draft drafted on its own guess of the pending token, before the
    # previous verdict (`ahead`: counted from the protocol, not the clock), drafted blocks discarded because the
    # verdict they assumed did not come (`stale`) and their draft time, the
    # target's time handling verify passes and inside their forward passes, its idle time between two verify passes
    # of one generation; decode_overhead_share = the decode wall time not spent inside the target's forward passes
    overlap_s: float = 0.0
    ahead: int = 0
    stale: int = 0
    wasted_draft_s: float = 0.0
    verify_s: float = 0.0
    verify_forward_s: float = 0.0
    target_idle_s: float = 0.0

    def add(self, other: "Stats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def count_block(self, blk, rows: np.ndarray, spec, max_rows: int) -> None:
        """Account one verified block (`blocks.Block`) whose accepted path is `rows` (0: the pending token)."""
        proposed, first, accepted = len(blk.tokens) - 1, int(blk.pos[0]), len(rows) - 1
        self.salvaged += int(accepted > 0 and rows[1] != 1)
        self.trees += int(blk.path is not None and (blk.parent == -1).sum() > 1)
        self.verify_calls += 1
        self.proposed += proposed
        self.accepted += accepted
        if accepted < proposed:
            self.rejections += 1
            self.rejections_after_wrap += int(near_wrap(first, spec.sink, spec.ring, max_rows))
        self.wraps += int(lap(first + accepted, spec.sink, spec.ring) != lap(first - 1, spec.sink, spec.ring))

    def count_times(self, d: Drafted, v: Verified, last: Verified | None) -> None:
        """Account a block's draft and verify times; `last`: the previous block's verdict in this generation."""
        self.draft_s += d.t1 - d.t0
        self.verify_s += v.t1 - v.t0
        self.verify_forward_s += v.forward_s
        self.ahead += int(d.ahead)
        if last is not None:
            self.overlap_s += max(0.0, min(d.t1, last.t1) - max(d.t0, last.t0))
            self.target_idle_s += max(0.0, v.t0 - last.t1)

    def as_dict(self) -> dict:
        committed = self.accepted + self.verify_calls
        decoded = max(self.generated - 1, 0)  # the first token comes out of the prefill
        return {"tokens_per_s": decoded / self.decode_s if self.decode_s else 0.0,
                "prompt_tokens_per_s": self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0,
                "ttft_ms": self.ttft_ms, "verify_calls": self.verify_calls,
                "accepted_per_verify": committed / self.verify_calls if self.verify_calls else 0.0,
                "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
                "generated": self.generated, "prompt_tokens": self.prompt_tokens, "proposed": self.proposed,
                "accepted": self.accepted, "rejections": self.rejections, "salvaged": self.salvaged,
                "trees": self.trees,
                "rejections_after_wrap": self.rejections_after_wrap, "wraps": self.wraps,
                "draft_s": self.draft_s, "decode_s": self.decode_s, "prefill_s": self.prefill_s,
                "overlap_s": self.overlap_s, "overlap_share": self.overlap_s / self.draft_s if self.draft_s else 0.0,
                "ahead": self.ahead, "ahead_share": self.ahead / self.verify_calls if self.verify_calls else 0.0,
                "stale": self.stale,
                "stale_share": self.stale / (self.stale + self.verify_calls) if self.verify_calls else 0.0,
                "wasted_draft_s": self.wasted_draft_s, "verify_s": self.verify_s,
                "target_idle_s": self.target_idle_s, "verify_forward_s": self.verify_forward_s,
                "decode_overhead_share": 1.0 - self.verify_forward_s / self.decode_s
                if self.decode_s and self.verify_forward_s else 0.0}


@dataclass
class GenerateResult:
    token_ids: list[int]
    stats: Stats = field(default_factory=Stats)


class Decoder:
    """The engine both launchers run, over a `Verifier` and a `Drafter` (pipeline/decode/interfaces.py)."""

    def __init__(self, spec, verifier: Verifier, drafter: Drafter, policy: Policy, block: int = ALIGNED_BLOCK):
        self.spec, self.verifier, self.drafter, self.policy, self.block = spec, verifier, drafter, policy, block
        self.index = RingIndex(spec)
        self.pending: int | None = None
        self.totals = Stats()           # every generation's stats, summed (the run-time figures)
        self.exactness = None           # the start-up batch-invariance verdict (pipeline/decode/exactness.py)
        self.last: Verified | None = None   # the generation's previous verdict (its times: the overlap figures)
        self.rule = None                # the answer's rule (pipeline/decode/rules.py), during a generation
        self.rule_state: str | None = None  # ... and its state after the committed answer tokens (pending excluded)

    # -- feeding text into the cache ---------------------------------------------------------------------------------
    def feed(self, ids, pick: SamplingParams | None = None, score: bool = False, on_logits=None):
        """Commit tokens (the pending one first, if any) in passes of up to G = `policy.prefill` rows, cut at multiples
        of G; a pass's rows read the positions committed since the last multiple as its recent section, so they are
        computed the same however the text was cut into feeds (the module docstring). pick: return the target's token
        after them, drawn under these params; score: return each token's surprisal, float32 [len(ids)] -log p,
        teacher-forced, computed in the pass (a token whose predecessor was not in a scored pass: NaN);
        on_logits(start, logits) sees every pass's logits (the local verifier's only). Otherwise the last row's
        logits where the verifier has them (locally), else None."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        given = len(ids)
        if self.pending is not None:
            ids = np.concatenate([[self.pending], ids])
            self.pending = None
        if pick is not None and not len(ids):
            raise ValueError("generate needs a non-empty prompt or context")
        got, nll = None, np.full(len(ids), np.nan, np.float32) if score else None
        grid, sink, window = self.policy.prefill, self.spec.sink, self.spec.window
        for start, stop in passes(self.index.n, len(ids), grid, sink, window, grid):
            chunk, n = ids[start:stop], self.index.n
            pos = n + np.arange(len(chunk), dtype=np.int64)
            s = recent_start(n, grid, sink, window)
            mask = self.index.visible_mask(pos, None, out=self.verifier.mask_buffer(), recent_from=s)
            last = start + len(chunk) == len(ids)
            got = self.verifier.prefill(chunk, pos, mask, self.index.write(pos), pick=pick if last else None,
                                        score=score, all_logits=on_logits is not None,
                                        rule_state=self.rule_state if last and pick is not None else None,
                                        recent=np.arange(s, n, dtype=np.int64), ring_from=self.index.pool_view(s)[0])
            self.index.commit(len(chunk))
            self.drafter.observe(chunk)
            if on_logits is not None:
                on_logits(start, got.logits)
            if score:
                nll[start:stop] = got.nll
        if pick is not None:
            return got.next
        if score:
            return nll[len(ids) - given:]
        return None if got is None or got.logits is None else got.logits[-1]

    def mark(self) -> int:
        """A committed position to roll back to later (the pending token, if any, is committed first)."""
        if self.pending is not None:
            self.feed([])
        return self.index.n

    def rollback(self, mark: int) -> None:
        """Forget everything after `mark` (a scratch span: a question and its answer); target and draft alike."""
        self.index.rollback(mark)
        self.pending = None
        self.drafter.rollback(mark, forget=False)

    def reset(self) -> None:
        """A new, unrelated text: nothing committed, and the draft forgets what it has seen (a rollback keeps rolled
        back text in the stream proposer's index, where a benchmark's earlier prompts and answers would be found)."""
        self.index.rollback(0)
        self.pending = None
        self.drafter.rollback(0, forget=True)

    # -- generation --------------------------------------------------------------------------------------------------
    def step(self, params: SamplingParams, stats: Stats, budget: int | None = None) -> list[int]:
        """One verify pass; returns the tokens it emits (accepted proposals, then the correction or bonus). budget:
        tokens the generation may still emit (a draft running ahead drafts no further)."""
        n, pending = self.index.n, self.pending
        budget = self.policy.max_rows if budget is None else budget
        room = room_of(n, self.block, self.spec.sink, self.spec.window)
        d = self.drafter.propose(pending, n, self.policy.choose(), room, budget, stats)
        blk, mask = self.plan(pending, self.policy.shape(d.prop))
        v = self.verifier.verify(blk, mask, params, self.rule_state)
        committed = blk.tokens[v.rows]
        for t in committed if self.rule is not None else ():
            self.rule_state = self.rule.advance(self.rule_state, int(t))
            if self.rule_state is None:       # the verifier judged without the rule (pipeline/decode/rules.py)
                raise RuntimeError(f"token {int(t)} was committed but the answer's rule forbids it")
        depth = trunk(blk.parent)           # the draft ran ahead assuming the whole trunk and its own guess next
        whole = len(v.rows) == depth + 1 and bool((v.rows == np.arange(depth + 1)).all())
        self.drafter.verdict(committed, n + len(v.rows), v.next, whole, budget - len(v.rows))
        self.index.write(n + np.arange(len(v.rows), dtype=np.int64))
        self.index.commit(len(v.rows))
        self.policy.observe(blk, v, d)
        stats.count_block(blk, v.rows, self.spec, self.policy.max_rows)
        stats.count_times(d, v, self.last)
        self.pending, self.last = v.next, v
        return [int(t) for t in committed[1:]] + [v.next]

    def plan(self, pending: int, prop: Proposed):
        """The verify pass of `prop` after `pending` at the committed position: (blocks.Block, its mask)."""
        blk = plan_block(self.index.n, pending, prop, self.block, self.spec.sink, self.spec.ring, self.spec.window)
        blk.ring_from = self.index.pool_view(int(blk.pos[0]) - len(blk.recent))[0]
        return blk, verify_mask(self.index, blk, self.verifier.mask_buffer())

    def generate(self, prompt_ids, max_tokens: int, params: SamplingParams = SamplingParams(), stop_ids=(),
                 on_tokens=None, keep_going=None, rule=None, rule_state: str = "") -> GenerateResult:
        """Prefill, then decode up to max_tokens (stopping after a stop token). on_tokens(ids) sees the answer's
        tokens as each verdict commits them (stop token included, nothing past it or past max_tokens); keep_going()
        is asked before each block, and False ends the generation there (a preempted analysis, a deadline). rule:
        every token is drawn from the target constrained by it (pipeline/decode/rules.py), exactly as without a
        draft; rule_state: its state before the first token (the text the prompt ends with, as the rule reads it)."""
        stats = Stats(prompt_tokens=len(prompt_ids))
        t0 = time.perf_counter()
        self.verifier.constrain(rule)
        self.rule, self.rule_state = rule, None if rule is None else rule_state
        self.pending = self.feed(prompt_ids, pick=params)
        stats.prefill_s = time.perf_counter() - t0
        stats.ttft_ms = stats.prefill_s * 1000.0
        start = self.index.n                           # position of the first generated token
        out = [self.pending]
        stops = set(int(s) for s in stop_ids)
        shown = _show(out, 0, stops, max_tokens, on_tokens)
        t1 = time.perf_counter()
        self.drafter.start(self.pending, self.index.n, max_tokens - len(out))
        self.last = None
        while len(out) < max_tokens and not stops.intersection(out[-self.policy.max_rows:]) and \
                (keep_going is None or keep_going()):     # a stop may be accepted mid-block: the last step's tokens
            out.extend(self.step(params, stats, max_tokens - len(out)))
            shown = _show(out, shown, stops, max_tokens, on_tokens)
        stats.decode_s = time.perf_counter() - t1
        self.drafter.halt()
        result = self._finish(out, start, stops, max_tokens, stats)
        self.rule = self.rule_state = None
        self.totals.add(stats)
        return result

    def _finish(self, out: list[int], start: int, stops: set, max_tokens: int, stats: Stats) -> GenerateResult:
        """Cut the output after the first stop token or max_tokens; the cache then holds exactly out[:-1]."""
        end = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
        out = out[:min(end, max_tokens)]
        if self.index.n > start + len(out) - 1:        # a block ran past the end
            self.rollback(start + len(out) - 1)
        self.pending = out[-1]
        stats.generated = len(out)
        return GenerateResult(out, stats)


def _show(out: list[int], shown: int, stops: set, max_tokens: int, on_tokens) -> int:
    """Hand on_tokens the answer's tokens past `shown`, up to the first stop token and max_tokens; the new count."""
    if on_tokens is None:
        return shown
    end = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
    end = min(end, max_tokens)
    if end > shown:
        on_tokens(out[shown:end])
    return max(end, shown)

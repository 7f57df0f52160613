"""The single-process engine: feed stream text into the ring, generate with or without a draft, score text.

Owns the target's sequence state (its `RingIndex`, the pending token) and the speculative step. Never reaches into a
draft's state (it tells drafts what was committed) and never chooses weights or graphs (that is `models/`).

One step of speculative decoding (DESIGN.md, "Lossless speculation"):
  propose N tokens after the pending one -> verify [pending, proposals] in one target pass (rows see the sinks, their
  window and their tree ancestors) -> accept a path -> commit the K/V of pending + accepted -> next token is pending.

Greedy identity, bit for bit: with int8 activations a row's result moves by ~0.5 logits if its attention sums the
same terms in another grouping (1e-7 differences cross int8 rounding steps). So every decoding pass splits keys at
the same place whatever the draft did: positions are grouped in aligned blocks of B; a row at u reads positions below
s(u) = u - u % B from the pool and [s(u), u] as one "recent + new" section; a verify block never crosses a block
boundary. A row is then computed identically with or without a draft (rows are independent of the pass's size).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import numpy as np

from kernels.ring import RingIndex, slot_of
from kernels.sampling import SamplingParams, sample, target_probs
from pipeline.config import DraftSection
from pipeline.decode.blocklen import LengthControl, cut_at_line_end
from pipeline.decode.blocks import ALIGNED_BLOCK, judge, lap, near_wrap, plan_block, room_of, verify_mask
from pipeline.decode.drafts import NoDraft, Proposal


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
    wraps: int = 0                   # times the committed position crossed a ring wrap point
    draft_s: float = 0.0
    # pipelined runs only (pipeline/decode/deferred.py): draft time spent while the target verified the previous block
    # (counted only for proposals that were verified), draft time on proposals discarded as stale, the target's time
    # handling verify messages and inside their forward passes, its idle time between consecutive verify passes of
    # one generation; decode_overhead_share = the decode wall time not spent inside the target's forward passes
    overlap_s: float = 0.0
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
        self.verify_calls += 1
        self.proposed += proposed
        self.accepted += accepted
        if accepted < proposed:
            self.rejections += 1
            self.rejections_after_wrap += int(near_wrap(first, spec.sink, spec.ring, max_rows))
        self.wraps += int(lap(first + accepted, spec.sink, spec.ring) != lap(first - 1, spec.sink, spec.ring))

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
                "rejections_after_wrap": self.rejections_after_wrap, "wraps": self.wraps,
                "draft_s": self.draft_s, "decode_s": self.decode_s, "prefill_s": self.prefill_s,
                "overlap_s": self.overlap_s, "overlap_share": self.overlap_s / self.draft_s if self.draft_s else 0.0,
                "wasted_draft_s": self.wasted_draft_s, "verify_s": self.verify_s,
                "target_idle_s": self.target_idle_s, "verify_forward_s": self.verify_forward_s,
                "decode_overhead_share": 1.0 - self.verify_forward_s / self.decode_s
                if self.decode_s and self.verify_forward_s else 0.0}


@dataclass
class GenerateResult:
    token_ids: list[int]
    stats: Stats = field(default_factory=Stats)


class Sequence:
    """What the serial `Engine` and the cache owner's `DeferredEngine` share: a committed ring index, the pending
    token, marks and scratch rollbacks (the draft told to follow), and how a generation ends. Subclasses provide
    `feed` and `_rollback_draft`."""
    index: RingIndex
    pending: int | None

    def mark(self) -> int:
        """A committed position to roll back to later (the pending token, if any, is committed first)."""
        if self.pending is not None:
            self.feed([])
        return self.index.n

    def rollback(self, mark: int) -> None:
        """Forget everything after `mark` (a scratch span: a question and its answer); target and draft alike."""
        self.index.rollback(mark)
        self.pending = None
        self._rollback_draft(mark)

    def reset(self) -> None:
        """A new, unrelated text: nothing committed, and the draft forgets what it has seen (a rollback keeps rolled
        back text in the stream proposer's index, where a benchmark's earlier prompts and answers would be found)."""
        self.rollback(0)
        self._rollback_draft(0, forget=True)

    def _finish(self, out: list[int], start: int, stops: set, max_tokens: int, stats: Stats) -> GenerateResult:
        """Cut the output after the first stop token or max_tokens; the cache then holds exactly out[:-1]."""
        end = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
        out = out[:min(end, max_tokens)]
        if self.index.n > start + len(out) - 1:        # a block ran past the end
            self.rollback(start + len(out) - 1)
        self.pending = out[-1]
        stats.generated = len(out)
        return GenerateResult(out, stats)


class Engine(Sequence):
    def __init__(self, runner, tokenizer, draft=None, draft_len: int = DraftSection.length, seed: int = 0,
                 block: int = ALIGNED_BLOCK, length_control: LengthControl | None = None,
                 line_ends: np.ndarray | None = None):
        self.runner, self.tok = runner, tokenizer
        if not 1 <= block <= runner.opts.max_recent + 1:
            raise ValueError(f"block {block} must be in 1..max_recent+1 ({runner.opts.max_recent + 1})")
        if runner.opts.max_rows > runner.spec.slack + 1:
            raise ValueError(f"max_rows {runner.opts.max_rows} exceeds the ring's slack + 1 "
                             f"({runner.spec.slack + 1}): use ring >= window + max_rows")
        self.block = block
        self.spec = runner.spec
        self.index = RingIndex(self.spec)
        self.draft = draft or NoDraft()
        self.draft_len = draft_len
        self.length_control = length_control    # None: always ask for draft_len proposals
        self.line_ends = line_ends              # bool per token id: a block ends after a newline; None: it may not
        self.rng = np.random.default_rng(seed)
        self.pending: int | None = None
        self.exactness = None                   # the start-up batch-invariance verdict (pipeline/decode/exactness.py)
        T = runner.opts.max_rows
        self._probs = np.zeros((T, runner.vocab), np.float64)

    # -- feeding text into the cache -------------------------------------------------------------------------------
    def feed(self, ids, all_logits: bool = False, on_logits=None) -> np.ndarray | None:
        """Commit tokens (the pending one first, if any) in chunks; returns the last row's logits.

        on_logits(start, logits) sees every chunk's logits when all_logits (teacher-forced scoring).
        """
        ids = np.asarray(ids, np.int64).reshape(-1)
        if self.pending is not None:
            ids = np.concatenate([[self.pending], ids])
            self.pending = None
        logits = None
        step = self.runner.opts.max_rows
        for start in range(0, len(ids), step):
            chunk = ids[start:start + step]
            T = len(chunk)
            pos = self.index.n + np.arange(T, dtype=np.int64)
            mask = self.index.visible_mask(pos, None, out=self.runner.mask_buffer())
            logits = self.runner.forward(chunk, pos, mask, None if all_logits else np.array([T - 1]))
            if on_logits is not None:
                on_logits(start, logits)
            self._commit(np.arange(T), pos)
            self.draft.observe(chunk)
        return None if logits is None else logits[-1]

    def append(self, text: str) -> int:
        """Stream text into the ring (teacher forced); returns the number of tokens committed."""
        ids = self.tok.encode(text)
        self.feed(ids)
        return len(ids)

    def _rollback_draft(self, mark: int, forget: bool = False) -> None:
        self.draft.rollback(mark)
        if forget:
            self.draft.forget()

    def _commit(self, rows: np.ndarray, positions: np.ndarray) -> None:
        self.runner.store(rows, self.index.write(positions))
        self.index.commit(len(positions))

    # -- generation ------------------------------------------------------------------------------------------------
    def _pick(self, logits: np.ndarray, params: SamplingParams) -> int:
        if params.greedy:
            return int(np.argmax(logits))
        return sample(target_probs(logits, params, out=self._probs[0]), self.rng)

    def step(self, params: SamplingParams, stats: Stats) -> list[int]:
        """One verify pass; returns the tokens it emits (accepted proposals, then the correction or bonus)."""
        t0 = time.perf_counter()
        n = self.index.n
        k = min(self.draft_len, self.runner.opts.max_rows - 1)
        if self.length_control is not None:
            k = self.length_control.choose(min(k, room_of(n, self.block)))
        forward_s, draft_s = self.runner.forward_s, stats.draft_s
        prop: Proposal = self.draft.propose(self.pending, k, room_of(n, self.block))
        if self.line_ends is not None:
            prop = cut_at_line_end(prop, self.line_ends)
        rows = self.runner.opts.max_rows - 1
        if len(prop.tokens) > rows:            # a tree's last siblings past what one pass holds (parents come first)
            prop = prop.keep(np.arange(len(prop.tokens)) < rows)
        stats.draft_s += time.perf_counter() - t0
        blk = plan_block(n, self.pending, prop, self.block, self.spec.sink, self.spec.ring)
        mask = verify_mask(self.index, blk, self.runner.mask_buffer())
        logits = self.runner.forward(blk.tokens, blk.pos, mask, path=blk.path,
                                     recent_slots=slot_of(blk.recent, self.spec.sink, self.spec.ring))
        rows, nxt = judge(logits, blk, params, self._probs, self.rng)
        if self.length_control is not None:
            self.length_control.observe(len(blk.tokens) - 1, len(rows) - 1, self.runner.forward_s - forward_s,
                                        stats.draft_s - draft_s)
        self._commit(rows, n + np.arange(len(rows), dtype=np.int64))
        committed = blk.tokens[rows]
        self.draft.observe(committed)
        stats.count_block(blk, rows, self.spec, self.runner.opts.max_rows)
        self.pending = nxt
        return [int(t) for t in committed[1:]] + [nxt]

    def generate(self, prompt_ids, max_tokens: int, params: SamplingParams = SamplingParams(),
                 stop_ids=()) -> GenerateResult:
        """Prefill the prompt, then decode up to max_tokens (stopping after a stop token)."""
        stats = Stats(prompt_tokens=len(prompt_ids))
        t0 = time.perf_counter()
        last = self.feed(prompt_ids)
        if last is None:
            raise ValueError("generate needs a non-empty prompt or context")
        self.pending = self._pick(last, params)
        stats.prefill_s = stats.ttft_ms = time.perf_counter() - t0
        stats.ttft_ms *= 1000.0
        start = self.index.n                           # position of the first generated token
        out = [self.pending]
        stops = set(int(s) for s in stop_ids)
        t1, f1 = time.perf_counter(), self.runner.forward_s
        emitted = out[:]
        while len(out) < max_tokens and not stops.intersection(emitted):    # a stop may be accepted mid-block
            emitted = self.step(params, stats)
            out.extend(emitted)
        stats.decode_s = time.perf_counter() - t1
        stats.verify_forward_s = self.runner.forward_s - f1
        return self._finish(out, start, stops, max_tokens, stats)


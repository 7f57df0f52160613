"""Drafts behind one interface: `observe` committed tokens, `propose` a chain (or tree) after the pending token.

propose(pending, k, max_depth): at most k nodes, none deeper than max_depth (the engine's aligned block ends there).

Owns each draft's private state (the stream proposer's suffix index; the draft model's own KV pool and ring index).
Never touches the target's cache: the engine tells a draft what was committed, and the draft rolls itself back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.ring import RingIndex, visible_mask
from kernels.sampling import SamplingParams, sample, target_probs
from kernels.suffix import SuffixIndex


@dataclass
class Proposal:
    """Tokens to verify after the pending token. parent[i] = -1: child of the pending token (a chain: i - 1)."""
    tokens: np.ndarray
    parent: np.ndarray
    q: np.ndarray | None = None     # [N, V] distribution each token was drawn from; None: deterministic

    @staticmethod
    def chain(tokens, q=None) -> "Proposal":
        tokens = np.asarray(tokens, np.int64)
        return Proposal(tokens, np.arange(len(tokens), dtype=np.int64) - 1, q)


class NoDraft:
    name = "none"

    def observe(self, tokens) -> None: ...

    def rollback(self, position: int) -> None: ...

    def propose(self, pending: int, k: int, max_depth: int | None = None) -> Proposal:
        return Proposal.chain([])


class SuffixDraft:
    """The model-free stream proposer: what followed the longest recent match of the current suffix."""
    name = "suffix"

    def __init__(self, capacity: int = 16384):
        self.index = SuffixIndex(capacity)

    def observe(self, tokens) -> None:
        self.index.append(tokens)

    def rollback(self, position: int) -> None:
        """Nothing to undo: text that was rolled back may still be proposed, and verification keeps output exact."""

    def propose(self, pending: int, k: int, max_depth: int | None = None) -> Proposal:
        return Proposal.chain(self.index.propose(pending, k if max_depth is None else min(k, max_depth)))


class ModelDraft:
    """A smaller model with the target's tokenizer, run on its own pool under the same cache policy.

    Keeps `fed`: the tokens whose K/V it wrote at positions [index.n, ...) speculatively; `observe` commits the
    prefix that matches what the target committed, rolls back the rest and queues the remainder to catch up.
    """
    name = "model"

    def __init__(self, runner, params: SamplingParams, seed: int = 0):
        self.runner, self.params = runner, params
        self.index = RingIndex(runner.spec)
        self.backlog: list[int] = []
        self.fed: list[int] = []
        self.rng = np.random.default_rng(seed + 1)
        self._probs = np.zeros((runner.opts.max_rows, runner.vocab), np.float64)
        self.forward_calls = 0

    def observe(self, tokens) -> None:
        tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
        if self.fed:
            m = 0
            while m < min(len(tokens), len(self.fed)) and tokens[m] == self.fed[m]:
                m += 1
            self.index.commit(m)
            self.index.rollback(self.index.n)       # discard the speculative rows past the match
            self.fed = []
            tokens = tokens[m:]
        self.backlog.extend(tokens)

    def rollback(self, position: int) -> None:
        """Forget positions >= position (the target rolled a scratch span back)."""
        self.fed = []
        if position >= self.index.n:
            self.backlog = self.backlog[: position - self.index.n]
            self.index.rollback(self.index.n)
        else:
            self.backlog = []
            self.index.rollback(position)

    def _run(self, tokens: list[int]) -> np.ndarray:
        """Forward tokens at the next positions, write their K/V speculatively; logits of the last row."""
        start = self.index.n + len(self.fed)
        pos = np.arange(start, start + len(tokens), dtype=np.int64)
        ix, spec = self.index, self.runner.spec
        # The speculative rows already written (index.n .. start-1) are visible to these queries, like committed ones.
        visible_mask(pos, None, ix.slot_pos, start, ix.ring_start, spec.sink, spec.window,
                     self.runner.mask_buffer(len(tokens)))
        logits = self.runner.forward(np.asarray(tokens, np.int64), pos, logit_rows=np.array([len(tokens) - 1]))
        self.runner.store(np.arange(len(tokens)), self.index.write(pos))
        self.fed.extend(tokens)
        self.forward_calls += 1
        return logits[0]

    def propose(self, pending: int, k: int, max_depth: int | None = None) -> Proposal:
        if max_depth is not None:
            k = min(k, max_depth)
        if k <= 0:                                 # nothing to draft this pass: catch up later, in one chunk
            return Proposal.chain([])
        step = self.runner.opts.max_rows
        while len(self.backlog) >= step:           # catch up on committed text in full chunks
            chunk, self.backlog = self.backlog[:step], self.backlog[step:]
            self._run(chunk)
            self.index.commit(len(chunk))
            self.fed = []
        logits = self._run(self.backlog + [pending])
        self.index.commit(len(self.backlog))
        self.fed, self.backlog = [pending], []
        tokens, qs = [], []
        for i in range(k):
            if self.params.greedy:
                tok = int(np.argmax(logits))
            else:
                q = target_probs(logits, self.params, out=self._probs[i])
                tok = sample(q, self.rng)
                qs.append(q)
            tokens.append(tok)
            if i + 1 < k:
                logits = self._run([tok])
        return Proposal.chain(tokens, None if self.params.greedy else np.stack(qs))


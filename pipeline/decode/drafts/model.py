"""The draft model: a smaller model with the target's tokenizer (or a distilled one over a sub-vocabulary of it), run
on its own KV pool under the same cache policy, speculating along the path it is asked about.

Owns the draft model's pool and ring index, its speculation (`fed`) and the committed text not yet run (`backlog`).
Never touches the target's cache: it commits only what it is told was committed, and rolls itself back.
"""
from __future__ import annotations

import numpy as np

from kernels.ring import RingIndex, passes, visible_mask
from kernels.sampling import SamplingParams, sample, target_probs
from models.draftnet import vocab_map
from pipeline.decode.drafts.base import Proposed


def speaks(card: dict) -> int:
    """The size of the target vocabulary a model's ids index: its own, or its tokenizer's when it is a distilled
    draft over a sub-vocabulary (models.draftnet)."""
    return card["tokenizer"]["vocab_size"] if card.get("target_ids") is not None else card["config"]["vocab_size"]


class ModelDraft:
    """A smaller model with the target's tokenizer, run on its own pool under the same cache policy.

    `index.n` is the committed length; `fed` lists the uncommitted tokens whose K/V sit at positions index.n, ...
    (speculation), `backlog` the committed tokens not yet run (when `fed` is empty). `observe` commits the prefix of
    `fed` that matches what the target committed; a mismatch drops the speculation and queues the rest.
    """
    name = "model"

    def __init__(self, runner, params: SamplingParams, seed: int = 0, min_confidence: float = 0.0):
        self.runner, self.params, self.min_confidence = runner, params, min_confidence
        self.index = RingIndex(runner.spec)
        self.backlog: list[int] = []
        self.fed: list[int] = []
        self.rng = np.random.default_rng(seed + 1)
        vocab = speaks(runner.card)
        self._probs = np.zeros((runner.opts.max_rows, vocab), np.float64)
        self._last = np.zeros(vocab, np.float32)     # logits after the last fed token, over the target's ids
        # A distilled draft speaks a sub-vocabulary: its logits land on their target ids, every other id stays -inf
        # (draft probability 0, so verification stays exact); its id 0 ("other") is never proposed.
        ids = runner.card.get("target_ids")
        self._to_draft = None if ids is None else vocab_map(ids, vocab)
        self._rows = None if ids is None else np.flatnonzero(np.asarray(ids) >= 0)     # draft ids with a target id
        self._to_target = None if ids is None else np.asarray(ids, np.int64)[self._rows]
        if ids is not None:
            self._last[:] = -np.inf
        self._row = np.zeros(runner.vocab, np.float32)     # the draft's own logits after the last fed token
        self._scratch = np.zeros(runner.vocab, np.float32)
        self.forward_calls = 0

    def observe(self, tokens) -> None:
        tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
        m = 0
        while m < min(len(tokens), len(self.fed)) and tokens[m] == self.fed[m]:
            m += 1
        self.index.commit(m)
        self.fed = self.fed[m:]
        if m < len(tokens):                         # the speculation went astray (or ran out): drop the rest
            self._drop_speculation()
            self.backlog.extend(tokens[m:])

    def rollback(self, position: int) -> None:
        """Forget positions >= position (the target rolled a scratch span back)."""
        self._drop_speculation()
        if position >= self.index.n:
            self.backlog = self.backlog[: position - self.index.n]
        else:
            self.backlog = []
            self.index.rollback(position)

    @property
    def committed(self) -> int:
        return self.index.n + len(self.backlog)

    def forget(self) -> None:
        """Nothing outlives rollback(0): the pool is addressed by the ring index alone."""
        self.rollback(0)

    def catch_up(self) -> bool:
        """Run one chunk of committed text not yet in the pool (the draft actor does this while idle, so an analysis
        does not wait for it); False when there was nothing to do."""
        if self.fed or not self.backlog:
            return False
        chunk, self.backlog = self.backlog[:self.runner.opts.max_rows], self.backlog[self.runner.opts.max_rows:]
        self._run(chunk)
        self.index.commit(len(chunk))
        self.fed = []
        return True

    def _drop_speculation(self) -> None:
        self.fed = []
        self.index.rollback(self.index.n)

    def _run(self, tokens: list[int]) -> np.ndarray:
        """Forward tokens at the next positions, write their K/V speculatively; logits of the last row."""
        spec = self.runner.spec
        for a, b in passes(self.index.n + len(self.fed), len(tokens), len(tokens), spec.sink, spec.window):
            logits = self._pass(tokens[a:b])
        self._row = logits[0]                        # the draft's own logits (valid until the next pass)
        if self._to_target is None:
            self._last[:] = logits[0]
        else:
            self._last[self._to_target] = logits[0, self._rows]
        return self._last

    def _pass(self, tokens: list[int]) -> np.ndarray:
        """One pass over tokens at the next positions, their K/V written speculatively; the last row's logits."""
        start = self.index.n + len(self.fed)
        pos = np.arange(start, start + len(tokens), dtype=np.int64)
        ix, spec = self.index, self.runner.spec
        # The speculative rows already written (index.n .. start-1) are visible to these queries, like committed ones.
        columns, t = ix.column_positions(start), len(tokens)
        mask = self.runner.mask_buffer()[: t * (len(columns) + t)].reshape(t, -1)
        visible_mask(pos, None, columns, start, ix.ring_start, spec.sink, spec.window, mask)
        ids = np.asarray(tokens, np.int64) if self._to_draft is None else self._to_draft[tokens]
        logits = self.runner.forward(ids, pos, mask, logit_rows=np.array([len(tokens) - 1]),
                                     ring_from=ix.pool_view(start)[0])
        self.runner.store(np.arange(len(tokens)), self.index.write(pos))
        self.fed.extend(tokens)
        self.forward_calls += 1
        return logits

    def _extend_to(self, path: list[int]) -> np.ndarray:
        """Make `fed` equal `path` (committing the backlog on the way); the logits after path's last token."""
        if self.fed != path[:len(self.fed)]:
            self._drop_speculation()
        if self.fed:
            rest = path[len(self.fed):]
            return self._run(rest) if rest else self._last
        todo, step, backlog = self.backlog + path, self.runner.opts.max_rows, len(self.backlog)
        self.backlog = []
        logits = None
        for i in range(0, len(todo), step):
            logits = self._run(todo[i:i + step])
            committed = min(len(self.fed), backlog)      # the backlog part is committed text
            self.index.commit(committed)
            self.fed, backlog = self.fed[committed:], backlog - committed
        return logits

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposed:
        if max_depth is not None:
            k = min(k, max_depth)
        if k <= 0 and not ahead:                   # nothing to draft this pass: catch up later, in one chunk
            return Proposed.chain([])
        logits = self._extend_to([*map(int, ahead), int(pending)])
        tokens, qs = [], []
        for i in range(k):
            if i and self.min_confidence and _top_probability(self._row, self._scratch) < self.min_confidence:
                break                              # the draft doubts its next token: verify what it has
            if self.params.greedy:
                tok = int(np.argmax(logits))
            else:
                q = target_probs(logits, self.params, out=self._probs[i])
                tok = sample(q, self.rng)
                qs.append(q)
            tokens.append(tok)
            if i + 1 < k:
                logits = self._run([tok])
        return Proposed.chain(tokens, None if self.params.greedy else np.stack(qs))

    def guess(self, path) -> int | None:
        return int(np.argmax(self._extend_to([int(t) for t in path])))


def _top_probability(logits: np.ndarray, scratch: np.ndarray) -> float:
    """The largest softmax probability of a logit row (scratch: a buffer of the row's size)."""
    np.subtract(logits, logits.max(), out=scratch)
    return float(1.0 / np.exp(scratch, out=scratch).sum())

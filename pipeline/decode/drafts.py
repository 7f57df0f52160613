"""Drafts behind one interface: `observe` committed tokens, `propose` a chain (or tree) after the pending token.

propose(pending, k, max_depth, ahead): at most k nodes, none deeper than max_depth (the aligned block ends there).
`ahead` (the draft actor running a block ahead) lists uncommitted tokens assumed to come between the committed text and
`pending`: the previous block's pending token and proposals. guess(path): the draft's best guess of the token after
`path` (committed text + path), or None; the draft actor takes it as the next block's pending token.

Owns each draft's private state (the stream proposer's suffix index; the draft model's own KV pool and ring index).
Never touches the target's cache: the engine tells a draft what was committed, and the draft rolls itself back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.ring import RingIndex, passes, visible_mask
from kernels.sampling import SamplingParams, sample, target_probs
from kernels.suffix import SuffixIndex
from models.draftnet import vocab_map


def speaks(card: dict) -> int:
    """The size of the target vocabulary a model's ids index: its own, or its tokenizer's when it is a distilled
    draft over a sub-vocabulary (models.draftnet)."""
    return card["tokenizer"]["vocab_size"] if card.get("target_ids") is not None else card["config"]["vocab_size"]


@dataclass
class Proposal:
    """Tokens to verify after the pending token. parent[i] = -1: child of the pending token (a chain: i - 1)."""
    tokens: np.ndarray
    parent: np.ndarray
    q: np.ndarray | None = None     # [N, V] distribution each token was drawn from; None: deterministic

    def keep(self, keep: np.ndarray) -> "Proposal":
        """The nodes where `keep` is true (every kept node's kept ancestors too), parents renumbered, q rows kept."""
        if keep.all():
            return self
        new_index = np.cumsum(keep) - 1
        parent = np.where(self.parent[keep] < 0, -1, new_index[np.maximum(self.parent[keep], 0)])
        return Proposal(self.tokens[keep], parent, None if self.q is None else self.q[keep])

    @staticmethod
    def chain(tokens, q=None) -> "Proposal":
        tokens = np.asarray(tokens, np.int64)
        return Proposal(tokens, np.arange(len(tokens), dtype=np.int64) - 1, q)


class NoDraft:
    """No proposals. Counts the committed tokens it was told of, like every draft (`committed`: the lockstep check)."""
    name = "none"

    def __init__(self):
        self.committed = 0

    def observe(self, tokens) -> None:
        self.committed += np.asarray(tokens).size

    def rollback(self, position: int) -> None:
        self.committed = min(self.committed, position)

    def forget(self) -> None:
        self.committed = 0

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposal:
        return Proposal.chain([])

    def guess(self, path) -> int | None:
        return None


class SuffixDraft:
    """The model-free stream proposer: what followed the longest recent match of the current suffix."""
    name = "suffix"

    def __init__(self, capacity: int = 16384):
        self.index = SuffixIndex(capacity)
        self.committed = 0

    def observe(self, tokens) -> None:
        self.index.append(tokens)
        self.committed += np.asarray(tokens).size

    def rollback(self, position: int) -> None:
        """Text that was rolled back stays in the index: it may still be proposed, and verification keeps output
        exact."""
        self.committed = min(self.committed, position)

    def forget(self) -> None:
        """Drop the whole index (after rollback(0), before an unrelated text)."""
        self.index = SuffixIndex(self.index.capacity)
        self.committed = 0

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=(), min_gram: int = 1) -> Proposal:
        k = k if max_depth is None else min(k, max_depth)
        return Proposal.chain(self.index.propose([*ahead, pending], k, min_gram))

    def guess(self, path) -> int | None:
        nxt = self.index.propose(list(path), 1)
        return int(nxt[0]) if len(nxt) else None


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

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposal:
        if max_depth is not None:
            k = min(k, max_depth)
        if k <= 0 and not ahead:                   # nothing to draft this pass: catch up later, in one chunk
            return Proposal.chain([])
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
        return Proposal.chain(tokens, None if self.params.greedy else np.stack(qs))

    def guess(self, path) -> int | None:
        return int(np.argmax(self._extend_to([int(t) for t in path])))


def _top_probability(logits: np.ndarray, scratch: np.ndarray) -> float:
    """The largest softmax probability of a logit row (scratch: a buffer of the row's size)."""
    np.subtract(logits, logits.max(), out=scratch)
    return float(1.0 / np.exp(scratch, out=scratch).sum())


class HybridDraft:
    """The stream proposer when the stream has a confident match (the last `min_gram` tokens occurred before), the
    draft model otherwise (at most `model_len` proposals: its tokens cost a pass each). Both see every commit."""
    name = "hybrid"

    def __init__(self, stream: SuffixDraft, model: ModelDraft, min_gram: int = 4, model_len: int = 3):
        self.stream, self.model, self.min_gram, self.model_len = stream, model, min_gram, model_len

    def observe(self, tokens) -> None:
        self.stream.observe(tokens)
        self.model.observe(tokens)

    def rollback(self, position: int) -> None:
        self.stream.rollback(position)
        self.model.rollback(position)

    def forget(self) -> None:
        self.stream.forget()
        self.model.forget()

    @property
    def committed(self) -> int:
        return self.model.committed

    def catch_up(self) -> bool:
        return self.model.catch_up()

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposal:
        prop = self.stream.propose(pending, k, max_depth, ahead, min_gram=self.min_gram)
        if len(prop.tokens) or k <= 0:
            return prop
        return self.model.propose(pending, min(k, self.model_len), max_depth, ahead)

    def guess(self, path) -> int | None:
        nxt = self.stream.guess(path)
        return nxt if nxt is not None else self.model.guess(path)


class TreeDraft:
    """A token tree: `base`'s chain as the trunk, plus up to `siblings` other first tokens, so that when the trunk's
    first token is rejected a sibling may still be accepted (the reference article's batch re-organisation). Siblings
    come from the stream (the continuations of shorter n-gram matches, `SuffixIndex.branches`), then from the domain
    prior (the pending token's most frequent followers, `SuffixIndex.followers`), each carrying what followed it.
    Verified in one pass by the tree graph (`models.graph`), bit for bit as the chain through each path."""
    name = "tree"

    def __init__(self, base, stream: SuffixDraft, siblings: int = 2, branch_len: int = 2):
        self.base, self.stream, self.siblings, self.branch_len = base, stream, siblings, branch_len

    def observe(self, tokens) -> None:
        self.base.observe(tokens)

    def rollback(self, position: int) -> None:
        self.base.rollback(position)

    def forget(self) -> None:
        self.base.forget()

    @property
    def committed(self) -> int:
        return self.base.committed

    def catch_up(self) -> bool:
        return getattr(self.base, "catch_up", lambda: False)()

    def guess(self, path) -> int | None:
        return self.base.guess(path)

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposal:
        trunk = self.base.propose(pending, k, max_depth, ahead)
        depth = self.branch_len if max_depth is None else min(self.branch_len, max_depth)
        if not len(trunk.tokens) or depth <= 0 or not self.siblings:
            return trunk
        tokens, parent = list(trunk.tokens), list(trunk.parent)
        for branch in self._branches([*map(int, ahead), int(pending)], int(trunk.tokens[0]), depth):
            first = len(tokens)
            tokens += [int(t) for t in branch]
            parent += [-1] + list(range(first, first + len(branch) - 1))
        q = trunk.q
        if q is not None and len(tokens) > len(q):         # stream siblings are deterministic: point masses
            extra = np.zeros((len(tokens) - len(q), q.shape[1]), q.dtype)
            extra[np.arange(len(extra)), tokens[len(q):]] = 1.0
            q = np.concatenate([q, extra])
        return Proposal(np.asarray(tokens, np.int64), np.asarray(parent, np.int64), q)

    def _branches(self, context: list[int], taken: int, depth: int) -> list[np.ndarray]:
        """Up to `siblings` continuations of `context` whose first tokens differ from `taken` and from each other."""
        index, firsts, out = self.stream.index, {taken}, []
        candidates = index.branches(context, depth)
        candidates += [np.concatenate([[f], index.propose([*context, int(f)], depth - 1)]).astype(np.int64)
                       for f in index.followers(context[-1]) if int(f) not in firsts]
        for branch in candidates:
            if len(out) < self.siblings and int(branch[0]) not in firsts:
                firsts.add(int(branch[0]))
                out.append(branch)
        return out

"""The tree draft: another draft's chain as the trunk, with sibling branches from the stream beside it.

Owns the choice of siblings (the stream's shorter matches, then the pending token's followers). Never keeps text of
its own: the base draft is told every commit and rollback, and the stream it reads is the base's (assemble.py).
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.drafts.base import Proposed, Proposer
from pipeline.decode.drafts.suffix import SuffixDraft


class TreeDraft:
    """A token tree: `base`'s chain as the trunk, plus up to `siblings` other first tokens, so that when the trunk's
    first token is rejected a sibling may still be accepted (the reference article's batch re-organisation). Siblings
    come from the stream (the continuations of shorter n-gram matches, `SuffixIndex.branches`), then from the domain
    prior (the pending token's most frequent followers, `SuffixIndex.followers`), each carrying what followed it.
    Verified in one pass by the tree graph (`models.graph`), bit for bit as the chain through each path."""
    name = "tree"

    def __init__(self, base: Proposer, stream: SuffixDraft, siblings: int = 2, branch_len: int = 2):
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
        return self.base.catch_up()

    def guess(self, path) -> int | None:
        return self.base.guess(path)

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposed:
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
        return Proposed(np.asarray(tokens, np.int64), np.asarray(parent, np.int64), q)

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

"""The stream proposer: the model-free draft that proposes what followed the longest recent match of the suffix.

Owns its suffix index over the committed text (kernels/suffix_index.py). Never drops rolled-back text from the index on a
rollback: it may still be proposed, and verification keeps the output exact.
"""
from __future__ import annotations

import numpy as np

from kernels.suffix_index import SuffixIndex
from pipeline.decode.drafts.base import Proposed


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

    def catch_up(self) -> bool:
        return False                                # the index takes each commit as it is observed

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=(), min_gram: int = 1) -> Proposed:
        k = k if max_depth is None else min(k, max_depth)
        return Proposed.chain(self.index.propose([*ahead, pending], k, min_gram))

    def guess(self, path) -> int | None:
        nxt = self.index.propose(list(path), 1)
        return int(nxt[0]) if len(nxt) else None

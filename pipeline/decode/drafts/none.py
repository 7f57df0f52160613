"""No draft: target-only decoding through the same step.

Owns a count of the committed tokens it was told of. Never proposes a token and never guesses one.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.drafts.base import Proposed


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

    def catch_up(self) -> bool:
        return False                                # nothing is ever deferred

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposed:
        return Proposed.chain([])

    def guess(self, path) -> int | None:
        return None

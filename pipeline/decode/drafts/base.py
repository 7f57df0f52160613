"""What every draft shares: the block it proposes (`Proposed`, a chain or a token tree) and the interface the engines
and the draft actor call on it (`Proposer`).

propose(pending, k, max_depth, ahead): at most k nodes, none deeper than max_depth (the aligned block ends there).
`ahead` (the draft actor running a block ahead) lists uncommitted tokens assumed to come between the committed text and
`pending`: the previous block's pending token and proposals. guess(path): the draft's best guess of the token after
`path` (committed text + path), or None; the draft actor takes it as the next block's pending token.

Owns the proposed block's shape (tokens, parents, the rows they were drawn from) and the interface. Never holds a
draft's state: each draft owns its own, in its own module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass
class Proposed:
    """Tokens to verify after the pending token. parent[i] = -1: child of the pending token (a chain: i - 1)."""
    tokens: np.ndarray
    parent: np.ndarray
    q: np.ndarray | None = None     # [N, V] distribution each token was drawn from; None: deterministic

    def keep(self, keep: np.ndarray) -> Proposed:
        """The nodes where `keep` is true (every kept node's kept ancestors too), parents renumbered, q rows kept."""
        if keep.all():
            return self
        new_index = np.cumsum(keep) - 1
        parent = np.where(self.parent[keep] < 0, -1, new_index[np.maximum(self.parent[keep], 0)])
        return Proposed(self.tokens[keep], parent, None if self.q is None else self.q[keep])

    @staticmethod
    def chain(tokens, q=None) -> Proposed:
        tokens = np.asarray(tokens, np.int64)
        return Proposed(tokens, np.arange(len(tokens), dtype=np.int64) - 1, q)


@runtime_checkable
class Proposer(Protocol):
    """A draft as the local proposer (pipeline/decode/local.py `LocalDraft`) and the draft actor (actors/draft.py)
    drive it: told every commit and rollback, asked for a block or a guess."""

    @property
    def committed(self) -> int:
        """The committed tokens it was told of (the draft actor's lockstep check)."""

    def observe(self, tokens) -> None:
        """The target committed `tokens` after the text so far."""

    def rollback(self, position: int) -> None:
        """The committed text now ends at `position` (the target rolled a scratch span back)."""

    def forget(self) -> None:
        """Drop what was learnt of the text (after rollback(0), before an unrelated text)."""

    def catch_up(self) -> bool:
        """Do one piece of deferred work on the committed text (the draft actor calls it while idle); False when there
        was nothing to do."""

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposed:
        """The block to verify after `pending` (the module's docstring)."""

    def guess(self, path) -> int | None:
        """The token after committed text + `path`, or None (the module's docstring)."""

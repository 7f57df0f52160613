"""The hybrid draft: the stream proposer when the stream has a confident match, the draft model otherwise.

Owns the choice between its two drafts, block by block. Never lets one of them miss a commit or a rollback: both see
every one.
"""
from __future__ import annotations

from pipeline.decode.drafts.base import Proposed
from pipeline.decode.drafts.model import ModelDraft
from pipeline.decode.drafts.suffix import SuffixDraft


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

    def propose(self, pending: int, k: int, max_depth: int | None = None, ahead=()) -> Proposed:
        prop = self.stream.propose(pending, k, max_depth, ahead, min_gram=self.min_gram)
        if len(prop.tokens) or k <= 0:
            return prop
        return self.model.propose(pending, min(k, self.model_len), max_depth, ahead)

    def guess(self, path) -> int | None:
        nxt = self.stream.guess(path)
        return nxt if nxt is not None else self.model.guess(path)

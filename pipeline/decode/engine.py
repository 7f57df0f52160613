"""The serial engine: the step (pipeline/decode/step.py) with the local pair, the runner and the draft in this process.

Owns building that pair from a runner, a tokenizer and a draft, and streaming text in (`append`). Never plans,
verifies or commits on its own: `Decoder` does, exactly as in the actor pipeline (pipeline/decode/deferred.py).
"""
from __future__ import annotations

import numpy as np

from pipeline.config import DraftSection
from pipeline.decode.blocklen import LengthControl
from pipeline.decode.blocks import ALIGNED_BLOCK
from pipeline.decode.drafts.none import NoDraft
from pipeline.decode.local import LocalDraft, LocalVerifier
from pipeline.decode.step import Decoder, GenerateResult, Policy, Stats

__all__ = ["Engine", "GenerateResult", "Stats"]


class Engine(Decoder):
    def __init__(self, runner, tokenizer, draft=None, draft_len: int = DraftSection.length, seed: int = 0,
                 block: int = ALIGNED_BLOCK, length_control: LengthControl | None = None,
                 line_ends: np.ndarray | None = None, rows: int = 0, prefill_rows: int = 0):
        """rows: a verify block's rows; prefill_rows: a feed pass's rows and grid (0: the runner's max_rows)."""
        if not 1 <= block <= runner.opts.max_recent + 1:
            raise ValueError(f"block {block} must be in 1..max_recent+1 ({runner.opts.max_recent + 1})")
        if runner.opts.max_rows > runner.spec.slack + 1:
            raise ValueError(f"max_rows {runner.opts.max_rows} exceeds the ring's slack + 1 "
                             f"({runner.spec.slack + 1}): use ring >= window + max_rows")
        self.runner, self.tok = runner, tokenizer
        self.draft = draft or NoDraft()
        rows = rows or runner.opts.max_rows
        if max(rows, prefill_rows) > runner.opts.max_rows:
            raise ValueError(f"passes of {max(rows, prefill_rows)} rows: the runner takes {runner.opts.max_rows}")
        policy = Policy(min(draft_len, rows - 1), rows, length_control, line_ends, prefill_rows)
        super().__init__(runner.spec, LocalVerifier(runner, seed), LocalDraft(self.draft), policy, block)

    def append(self, text: str) -> int:
        """Stream text into the ring (teacher forced); returns the number of tokens committed."""
        ids = self.tok.encode(text)
        self.feed(ids)
        return len(ids)

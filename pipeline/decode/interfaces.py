"""The step's two contracts and the data passed across them: what `Decoder` (pipeline/decode/step.py) asks of the
target and of the draft, whichever side of a process boundary they are on.

Owns `Verifier` (the target: a feed's prefill passes and a block's verify pass, judged) and `Drafter` (the draft as
the step drives it: told every commit and rollback, asked for a block), each implemented twice: in this process
(pipeline/decode/local.py `LocalVerifier`, `LocalDraft`: the serial engine; the target actor judges with the former)
and over the actors' channels (pipeline/decode/deferred.py `ChannelVerifier`, `DraftLink`: the draft a block ahead),
and the messages between the step and them: `Drafted`, `Verified`, `Prefilled`. A `Drafter` is not a draft model's
own interface (pipeline/decode/drafts/base.py `Proposer`: `propose(pending, k, room)`), which `LocalDraft` and the
draft actor call. Never runs a model. tests/pipeline/decode/test_interfaces.py holds each implementation to its
contract, parameter by parameter (vLLM's spec_decode/interfaces.py is the model followed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from kernels.sampling import SamplingParams
from pipeline.decode.drafts.base import Proposed


@dataclass
class Drafted:
    """A drafter's block. Times are perf_counter (CLOCK_MONOTONIC: comparable between processes)."""
    prop: Proposed
    t0: float                       # drafting began
    t1: float                       # ... and ended
    ahead: bool = False             # drafted on the draft's own guess of the pending token, before the verdict before


@dataclass
class Verified:
    """A verifier's verdict on a block."""
    rows: np.ndarray                # [a+1] rows committed: 0 (the pending token), then the accepted path's rows
    next: int                       # the token after them: a correction or the bonus
    t0: float                       # the target took the block
    t1: float                       # ... and answered
    forward_s: float                # of which inside the forward pass


@dataclass
class Prefilled:
    """A verifier's answer to one prefill pass (what was asked of it)."""
    next: int | None = None         # pick: the target's token after the pass
    nll: np.ndarray | None = None   # score: [T] -log p of each token of the pass (NaN: its predecessor unknown)
    logits: np.ndarray | None = None    # the local verifier only: the pass's logits (every row, or its last)


@runtime_checkable
class Verifier(Protocol):
    """The target as the step uses it."""

    def constrain(self, rule) -> None:
        """Judge the coming answer's passes against `rule` (pipeline/decode/rules.py; None: unconstrained)."""

    def mask_buffer(self) -> np.ndarray:
        """The preallocated mask a pass's visibility is written into."""

    def prefill(self, ids, pos, mask, slots, pick: SamplingParams | None = None, score: bool = False,
                all_logits: bool = False, recent=None, ring_from: int = 0,
                rule_state: str | None = None) -> Prefilled:
        """Run a pass of committed text (rows `ids` at positions `pos`, visibility `mask`) and store every row's K/V
        at `slots`; pick: the target's token after it; score: each token's surprisal; recent: the positions of its
        recent section (step.py `feed`)."""

    def verify(self, blk, mask: np.ndarray, params: SamplingParams, rule_state: str | None = None) -> Verified:
        """Run a block (pipeline/decode/blocks.py `Block`: the pending token, then the proposals), judge it exactly
        (kernels/accept.py), store the committed rows' K/V at the block's slots."""


@runtime_checkable
class Drafter(Protocol):
    """The draft as the step drives it."""

    def observe(self, ids) -> None:
        """Tokens committed by a feed."""

    def rollback(self, mark: int, forget: bool = False) -> None:
        """Everything after `mark` is gone; forget: a new, unrelated text (nothing seen is kept)."""

    def start(self, pending: int, n: int, budget: int) -> None:
        """A generation starts after the prefill: `pending` at position `n`, `budget` tokens at most."""

    def propose(self, pending: int, n: int, k: int, room: int, budget: int, stats) -> Drafted:
        """A block of at most `k` proposals after `pending` at `n` (`room`: rows before the next aligned boundary)."""

    def verdict(self, committed, n: int, nxt: int, whole: bool, budget: int) -> None:
        """The verifier committed `committed` up to `n`; `nxt` is pending; whole: the whole trunk was accepted."""

    def halt(self) -> None:
        """The generation ended: no block is drafted ahead any more."""

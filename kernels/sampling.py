"""The target's sampling transform (temperature, then top-k, then top-p) and inverse-CDF sampling.

Invariant: every row of `target_probs` is a probability distribution (float64, sums to 1) that is the single source of
truth for "p" in speculative acceptance (kernels/accept.py); temperature 0 is greedy, a one-hot at np.argmax (lowest
index on ties), reached without ever dividing by the temperature.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1 disable those filters; seed feeds np.random.default_rng."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        t, k, p, s = self.temperature, self.top_k, self.top_p, self.seed
        if not (isinstance(t, numbers.Real) and 0.0 <= t < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables top-k), got {k!r}")
        if not (isinstance(p, numbers.Real) and 0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 disables top-p), got {p!r}")
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0:
            raise ValueError(f"seed must be an integer >= 0, got {s!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """Row-wise (last axis) distribution after temperature, top-k, top-p, renormalised; written into `out` (float64).

    top-k keeps every token whose logit is >= the k-th largest; top-p keeps every token at least as likely as the one
    at which the descending cumulative mass first reaches top_p. Both keep ties at the cut, so the result does not
    depend on token order. The plain temperature path allocates only per-row scalars; top-k and top-p need O(V) scratch.
    """
    logits = np.asarray(logits)
    out = np.empty(logits.shape, np.float64) if out is None else out
    if params.greedy:  # point mass at argmax: no division, ties go to the lowest index like np.argmax
        out.fill(0.0)
        np.put_along_axis(out, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    np.copyto(out, logits)
    out -= out.max(axis=-1, keepdims=True)  # stable: max first, so a tiny temperature gives -inf, never inf - inf
    with np.errstate(over="ignore"):
        out /= params.temperature
    vocab = out.shape[-1]
    if 0 < params.top_k < vocab:
        kth = np.partition(out, vocab - params.top_k, axis=-1)[..., vocab - params.top_k, None]
        np.copyto(out, -np.inf, where=out < kth)  # keep the k largest (and ties with the k-th)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        desc = np.sort(out, axis=-1)[..., ::-1]
        reach = np.minimum((np.cumsum(desc, axis=-1) < params.top_p).sum(axis=-1, keepdims=True), vocab - 1)
        np.copyto(out, 0.0, where=out < np.take_along_axis(desc, reach, axis=-1))  # smallest head with mass >= top_p
        out /= out.sum(axis=-1, keepdims=True)
    return out


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw of one index from a 1-D distribution; never returns a zero-probability index.

    The uniform is scaled by the total mass, so rows summing to 1 +- 1e-12 (or any positive total) are fine.
    """
    cdf = probs.cumsum()
    i = int(cdf.searchsorted(rng.random() * cdf[-1], side="right"))  # first index whose cdf exceeds u * total
    return i if i < cdf.size else int(np.flatnonzero(probs)[-1])  # u * total rounded up to total

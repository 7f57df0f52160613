"""How long a verify block is: the number of proposals chosen online, and blocks that end at a line's end.

Owns the online estimates behind the length (per-depth acceptance, verify seconds per row, draft seconds per
proposal) and the cut of a proposal after its first newline-carrying token. Never proposes, verifies or commits: the
step (pipeline/decode/step.py) asks `choose`, `shape`s what the draft proposed (the draft actor shapes its run-ahead
blocks the same way) and reports each verdict to `observe`.
"""
from __future__ import annotations

import numpy as np

from pipeline.decode.drafts.base import Proposed

DECAY = 0.95                          # weight of an observation one verify older
PRIOR_TRIES = 2.0                     # pseudo-tries per depth at the prior estimate
FIRST_PRIOR = 0.5                     # prior a_1: 1 accept in 2 tries
ROW_COST_RATIO = 0.2                  # prior c1/c0: docs/speed.md measured 13.2 ms for 1 row, +2.5 ms per extra row
PRIOR_WEIGHT = 1.0                    # strength of that prior in the cost fit, in observations
FREE_PROPOSALS = 1.0                  # prior draft cost: this many proposals that cost nothing


class LengthControl:
    """Chooses how many proposals to verify, from what verification has shown so far (chains).

    a_i = P(proposal i accepted | proposals 1..i-1 accepted), as decayed counts per depth plus PRIOR_TRIES pseudo-tries
    at the prior: 1/2 at depth 1, the estimate a_{i-1} deeper (an untried depth is assumed as good as the one before
    it, so the length grows while every proposal is accepted). Counts decay at every verify, tried or not: a length
    abandoned for poor acceptance drifts back towards the prior and is retried (about one verify in six while nothing
    is accepted, at the default prior and cost ratio: a few percent of the time).
    Verify seconds = c0 + c1 * rows by decayed least squares, with c1 pulled towards row_cost_ratio * c0: the fit
    stays defined (and keeps the measured ratio) while every pass has the same number of rows. Draft seconds per
    proposal: decayed sums plus FREE_PROPOSALS at no cost, so a cost measured once (a model draft catching up on the
    prompt) fades while nothing is proposed, and drafting is tried again.
    """

    def __init__(self, max_len: int, decay: float = DECAY, row_cost_ratio: float = ROW_COST_RATIO,
                 measured: bool = True):
        """measured: fit the costs to the seconds observed; False: keep the prior costs (a row `row_cost_ratio` of a
        pass, drafting free), so the length depends on the verdicts alone, never on the clock."""
        self.max_len, self.decay, self.ratio, self.measured = max_len, decay, row_cost_ratio, measured
        self._accepts = np.zeros(max_len)     # decayed count of acceptances at depth i + 1
        self._tries = np.zeros(max_len)       # decayed count of verifies that reached depth i + 1
        self._w = self._wx = self._wxx = self._wy = self._wxy = 0.0    # decayed sums over (rows x, seconds y)
        self._draft_s = self._drafted = 0.0   # decayed draft seconds and proposals
        self._a = np.zeros(max_len)           # the estimates, refreshed by `acceptance`

    def acceptance(self) -> np.ndarray:
        """Estimated a_i for depths 1..max_len (a buffer: the next call overwrites it)."""
        prior = FIRST_PRIOR
        for i in range(self.max_len):
            prior = self._a[i] = (self._accepts[i] + PRIOR_TRIES * prior) / (self._tries[i] + PRIOR_TRIES)
        return self._a

    def verify_cost(self) -> tuple[float, float]:
        """(c0, c1) of verify seconds = c0 + c1 * rows; before any verify, (1, ratio) in units of c0."""
        if self._w == 0.0:
            return 1.0, self.ratio
        # Normal equations of sum w (c0 + c1 x - y)^2 + PRIOR_WEIGHT (c1 - ratio c0)^2: det > 0 once w > 0.
        lam, r = PRIOR_WEIGHT, self.ratio
        a11, a12, a22 = self._w + lam * r * r, self._wx - lam * r, self._wxx + lam
        det = a11 * a22 - a12 * a12
        c0 = (self._wy * a22 - a12 * self._wxy) / det
        c1 = (a11 * self._wxy - a12 * self._wy) / det
        return max(c0, 1e-9), max(c1, 0.0)           # timing noise must not make a pass or a row cost less than 0

    def draft_per_proposal(self) -> float:
        return self._draft_s / (self._drafted + FREE_PROPOSALS)

    def choose(self, k_max: int) -> int:
        """The number of proposals in 0..k_max with the most expected emitted tokens per second."""
        c0, c1 = self.verify_cost()
        per_proposal = self.draft_per_proposal()
        a = self.acceptance()
        best, best_rate = 0, 1.0 / (c0 + c1)
        reach = emitted = 1.0
        for k in range(1, min(k_max, self.max_len) + 1):
            reach *= a[k - 1]
            emitted += reach
            # k maximises (1 + sum_{i<=k} prod_{j<=i} a_j) / (c0 + c1 (k + 1) + draft_per_proposal k)
            rate = emitted / (c0 + c1 * (k + 1) + per_proposal * k)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def observe(self, proposed: int, accepted: int, verify_s: float, draft_s: float) -> None:
        """One verified chain: `proposed` proposals (what the draft returned, not what was asked), the first
        `accepted` of them accepted; the target's seconds verifying it and the draft's seconds proposing it."""
        d = self.decay
        self._accepts *= d
        self._tries *= d
        self._tries[:min(accepted + 1, proposed, self.max_len)] += 1.0     # depths past the first rejection: untried
        self._accepts[:min(accepted, self.max_len)] += 1.0
        if not self.measured:
            return
        x, y = float(proposed + 1), float(verify_s)
        self._w = d * self._w + 1.0
        self._wx = d * self._wx + x
        self._wxx = d * self._wxx + x * x
        self._wy = d * self._wy + y
        self._wxy = d * self._wxy + x * y
        self._draft_s = d * self._draft_s + (draft_s if proposed else 0.0)   # a pass without proposals: no rate
        self._drafted = d * self._drafted + proposed


def shape(prop: Proposed, line_ends: np.ndarray | None, max_rows: int) -> Proposed:
    """A proposal as a block verifies it: cut at line ends (when `line_ends` is given), then the nodes one pass holds
    (max_rows - 1 after the pending token; parents come before their children, so the last siblings go first)."""
    if line_ends is not None:
        prop = cut_at_line_end(prop, line_ends)
    if len(prop.tokens) > max_rows - 1:
        prop = prop.keep(np.arange(len(prop.tokens)) < max_rows - 1)
    return prop


def cut_at_line_end(prop: Proposed, ends: np.ndarray) -> Proposed:
    """Keep each proposal up to and including the first newline-carrying token on its path: drop every node with a
    strict ancestor among the proposals whose token is in `ends` (a chain: truncate after its first such token).
    Parents and q rows follow the kept nodes."""
    n = len(prop.tokens)
    closed = np.zeros(n, bool)            # closed[i]: node i's path, i included, has reached a line end
    keep = np.ones(n, bool)
    for i in range(n):
        p = prop.parent[i]
        keep[i] = p < 0 or not closed[p]
        closed[i] = ends[prop.tokens[i]] or (p >= 0 and closed[p])
    return prop.keep(keep)


def line_end_ids(tokenizer, vocab: int | None = None) -> np.ndarray:
    """Bool mask over the target vocabulary (`vocab` ids, default the tokenizer's): the tokens whose text contains a
    newline. Decodes every id once: build it at start-up."""
    ends = np.zeros(vocab or tokenizer.vocab_size, bool)
    for i in range(min(len(ends), tokenizer.vocab_size)):
        ends[i] = "\n" in tokenizer.token_text(i)
    return ends

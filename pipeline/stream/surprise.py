"""How unusual a stream line is: its mean surprisal under the ring, against what its kind of line usually scores.

Owns the online baseline and the score. A line's surprisal is the mean -log p of its tokens, teacher-forced, as the
prefill that puts it in the ring computes them (models/graph.py `nll`: T floats out of the pass). Lines of one
template (the text with its digit runs folded to `#`: "FIR123 H ... 01:32:20" and "FIR124 H ... 01:33:05" are one)
keep a running mean and variance of it; a line scores the z of its surprisal against its template's baseline, or
against every line's while its template has been seen fewer than `MIN_SEEN` times. The baseline is judged before the
line joins it, and the table keeps the `TEMPLATES` most recently seen templates: memory is constant however long
the stream runs. Never runs the model and never decides what an assessment says; the cache owner and the serial
replay ask it after each scored line, and `[replay] surprise_above` fires an assessment on a high score.

Why a baseline: raw surprisal ranks lines by how much text the model cannot guess (timestamps, counters, fresh
identifiers), which every line of some templates has; against its template's history a line is unusual only when
it is unusual for its kind (log keys as the unit of normal behaviour: DeepLog, Du et al., CCS 2017). Whether that
beats raw surprisal, and either beats counting templates, is measured, not assumed: `python run.py eval-quality`.
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pipeline.decode.rules import TokenTable

TEMPLATES = 4096        # templates whose baseline is kept (least recently seen evicted)
HORIZON = 256           # a baseline's memory in lines: running mean and variance, then exponentially weighted
MIN_SEEN = 3            # a template's own baseline from its fourth line on; before, every line's
SD_FLOOR = 0.25         # nats: a template whose lines all score alike still tolerates this much
UNUSUAL = 3.0           # the z a line is shown as unusual at (console, journal) when no trigger threshold is set
_DIGITS = re.compile(r"\d+")


def unscored_tokens(tok, score_every_token: bool = False) -> np.ndarray | None:
    """bool [V]: the tokens a scored pass leaves out, for the verifier (pipeline/decode/local.py `unscored`): those
    that are not words (no letter, or a digit: times, counters, tag numbers, punctuation and spaces, what a template
    keeps or folds), unless score_every_token (None: none left out). A line's surprisal is then over its words."""
    if score_every_token:
        return None
    table = TokenTable.of(tok)
    out = np.array([not any(b >= 0x80 or chr(b).isalpha() for b in p) for p in table.pieces])  # >= 0x80: UTF-8
    out[table.digit_ids] = True
    return out


def template_of(text: str) -> str:
    """The line with its digit runs folded: lines that differ only in numbers (times, counters, tag numbers) share
    a template."""
    return _DIGITS.sub("#", text)


@dataclass
class Baseline:
    """Running mean and variance of a surprisal (exact for the first HORIZON values, then exponentially weighted)."""
    n: int = 0
    mean: float = 0.0
    var: float = 0.0

    def z(self, x: float) -> float:
        return (x - self.mean) / math.sqrt(self.var + SD_FLOOR ** 2)

    def add(self, x: float) -> None:
        self.n = min(self.n + 1, HORIZON)
        d = x - self.mean
        self.mean += d / self.n
        self.var += (d * (x - self.mean) - self.var) / self.n


@dataclass(frozen=True)
class LineScore:
    """One line's figures."""
    nll_sum: float          # -log p summed over the line's scored tokens
    nll_n: int              # ... how many (a token whose predecessor was not scored is not)
    surprise: float | None  # z against the baseline (None: no token scored, or the first line of the stream)
    unusual: bool = False   # surprise at or over the stream's threshold

    @property
    def nll_mean(self) -> float:
        return self.nll_sum / self.nll_n if self.nll_n else float("nan")


class Surprise:
    """The baselines of one stream (owned by whoever feeds it: the cache owner, the serial replay); a line is
    unusual from `unusual_at` on (0: `UNUSUAL`)."""

    def __init__(self, unusual_at: float = 0.0, templates: int = TEMPLATES):
        self.templates, self.capacity = OrderedDict(), templates
        self.every = Baseline()
        self.unusual_at = unusual_at or UNUSUAL

    def line(self, text: str, nll: np.ndarray) -> LineScore:
        """Score a line from its tokens' surprisals (NaN: not scored), then let it join its baselines."""
        known = nll[np.isfinite(nll)]
        if not len(known):
            return LineScore(0.0, 0, None)
        x = float(known.mean())
        key = template_of(text)
        own = self.templates.get(key)
        base = own if own is not None and own.n >= MIN_SEEN else self.every
        score = base.z(x) if base.n else None
        if own is None:
            own = self.templates[key] = Baseline()
            if len(self.templates) > self.capacity:
                self.templates.popitem(last=False)
        self.templates.move_to_end(key)
        own.add(x)
        self.every.add(x)
        return LineScore(float(known.sum()), len(known), score, score is not None and score >= self.unusual_at)


def line_fields(scored: LineScore | None) -> dict:
    """A line's fields for the journal and the console (none when the stream is not scored)."""
    if scored is None:
        return {}
    return dict(nll_sum=scored.nll_sum, nll_n=scored.nll_n, surprise=scored.surprise, unusual=scored.unusual)


def unusual_mark(record: dict) -> str | None:
    """How a terminal shows an unusual line (None: shown as any other)."""
    if not record.get("unusual"):
        return None
    return (f"!! {record['text']}    <- unusual: surprise {record['surprise']:.1f}, "
            f"{record['nll_sum'] / record['nll_n']:.2f} nats/token")

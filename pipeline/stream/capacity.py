"""What the stream gets of the target and what it can take: the share of the target's recent time spent on stream
lines, and the ingest capacity measured while it ran.

Owns two decayed sums (time constant `TAU_S`, constant memory): the target's seconds on the stream and on everything
else (questions, analyses), the stream tokens and lines those seconds carried, and the stream passes still in flight.
The cache owner tells it what was sent, what ran and when; the schedule reads `share` (serve.stream_share: questions
and analyses go first only while the stream has had its share) and `capacity` (replay.line_rate: warn once when the
stream cannot be sustained, `short_of`). Never reads a clock: every time is given, so a test states its times.
"""
from __future__ import annotations

import math

TAU_S = 30.0               # the recent past the share and the capacity speak of
MIN_STREAM_S = 5.0         # decayed stream seconds before the capacity is stated (about 6 s of stream work)


class StreamClock:
    def __init__(self, tau_s: float = TAU_S):
        self.tau_s = tau_s
        self.stream_s = self.other_s = self.tokens = self.lines = 0.0
        self.t: float | None = None
        self.in_flight: tuple[float, int, int] | None = None    # (since, tokens, lines) of stream passes not yet run
        self.warned = False

    def _decay(self, now: float) -> None:
        if self.t is not None and now > self.t:
            f = math.exp(-(now - self.t) / self.tau_s)
            self.stream_s, self.other_s, self.tokens, self.lines = (x * f for x in (self.stream_s, self.other_s,
                                                                                    self.tokens, self.lines))
        self.t = now if self.t is None else max(self.t, now)

    def stream(self, seconds: float, tokens: int, lines: int, now: float) -> None:
        """The target spent `seconds` up to `now` on stream passes carrying `tokens` tokens of `lines` lines."""
        self._decay(now)
        self.stream_s += seconds
        self.tokens += tokens
        self.lines += lines

    def sent(self, tokens: int, lines: int, now: float) -> None:
        """Stream passes carrying `tokens` tokens of `lines` lines went to the target at `now`."""
        since, before_tokens, before_lines = self.in_flight or (now, 0, 0)
        self.in_flight = (since, before_tokens + tokens, before_lines + lines)

    def ran(self, now: float) -> None:
        """The target has run every stream pass sent (or other work comes next: the rest counts as its time)."""
        if self.in_flight is not None:
            since, tokens, lines = self.in_flight
            self.in_flight = None
            self.stream(now - since, tokens, lines, now)

    def short_of(self, line_rate: float) -> tuple[float, float] | None:
        """The capacity, the first time it is measured below `line_rate` lines/s (once: a claim found false)."""
        got = self.capacity()
        if self.warned or not line_rate or got is None or got[1] >= line_rate:
            return None
        self.warned = True
        return got

    def other(self, seconds: float, now: float) -> None:
        """The target spent `seconds` up to `now` on a question or an analysis."""
        self._decay(now)
        self.other_s += seconds

    @property
    def share(self) -> float:
        """The stream's share of the target's recent time (1.0 before anything ran)."""
        total = self.stream_s + self.other_s
        return self.stream_s / total if total else 1.0

    def capacity(self) -> tuple[float, float] | None:
        """(tokens/s, lines/s) the stream goes in at while the target works on it; None until MIN_STREAM_S."""
        if self.stream_s < MIN_STREAM_S or not self.lines:
            return None
        return self.tokens / self.stream_s, self.lines / self.stream_s

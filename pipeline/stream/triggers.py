"""When the model writes an assessment: every N lines, on a line matching a pattern (alarm severity), on a line
the model finds unusual (pipeline/stream/surprise.py), on idle.

Owns the counting only; a stream's session (pipeline/stream/session.py) asks it after each line and when the stream
is quiet, so every launcher writes its assessments after the same lines. Never reads a clock itself.
"""
from __future__ import annotations

import re


class Triggers:
    def __init__(self, every_lines: int, pattern: str = "", idle_s: float = 0.0, surprise_above: float = 0.0):
        self.every, self.idle_s, self.surprise_above = every_lines, idle_s, surprise_above
        self.pattern = re.compile(pattern) if pattern else None
        self.since = 0            # lines since the last assessment

    @classmethod
    def of(cls, replay) -> "Triggers":
        """The triggers a profile's [replay] section sets (pipeline/config.py ReplaySection)."""
        return cls(replay.every_lines, replay.trigger_pattern, replay.idle_s, replay.surprise_above)

    def after_line(self, text: str, surprise: float | None = None) -> str | None:
        """The reason to assess now ("every", "pattern", "surprise"), or None."""
        self.since += 1
        if self.since >= self.every:
            return self._fire("every")
        if self.pattern is not None and self.pattern.search(text):
            return self._fire("pattern")
        if self.surprise_above > 0 and surprise is not None and surprise >= self.surprise_above:
            return self._fire("surprise")
        return None

    def would_fire(self, text: str, ahead: int = 0) -> bool:
        """Would `after_line(text)` fire if `ahead` lines came (none firing) before it? Counts nothing; a line's
        surprise is known only once it is in the ring, so it is not foreseen here."""
        return self.since + ahead + 1 >= self.every or (self.pattern is not None and bool(self.pattern.search(text)))

    def on_quiet(self, quiet_s: float) -> str | None:
        """"idle" when lines came since the last assessment and none for idle_s seconds."""
        if self.idle_s > 0 and self.since and quiet_s >= self.idle_s:
            return self._fire("idle")
        return None

    def _fire(self, reason: str) -> str:
        self.since = 0
        return reason

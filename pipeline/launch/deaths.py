"""An actor's death, as every launcher reports it, and what the supervisor makes of it.

Owns `ActorDied` (who died, how, when; raised by the launchers and the site), the grace periods actors get once
stopped, and `Supervisor`: a restart (the `RestartReason` the next start journals) unless the deaths make a crash loop
(`[supervise]`). Never starts, stops or watches a process: the launchers do; supervise.py loops over restarts.
"""
from __future__ import annotations

import signal
import time

from actors.args import RestartReason
from pipeline.stream.sources import SourceSpec

STOP_GRACE_S = 10.0   # actors told to stop that still run after this are killed
DEATH_GRACE_S = 0.5   # ... after an actor died: what they hold is recovered from the checkpoint, not from them
STOPPED = "; the pipeline was stopped"     # how a death's message ends; a restart's cause leaves it off


class ActorDied(RuntimeError):
    def __init__(self, message: str, actor: str = "", died_at: float | None = None):
        super().__init__(message)
        self.actor, self.died_at = actor, died_at if died_at is not None else time.time()


def cause(name: str, pid: int, code: int) -> str:
    """A local process's death from its exit code (negative: the signal that killed it)."""
    how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit code {code}"
    return f"actor {name} (pid {pid}) died: {how}{STOPPED}"


class Supervisor:
    """Counts deaths per actor; a restart is allowed unless one actor died more than `max_restarts` times within
    `period_s` (a crash loop: ActorDied, which stops the pipeline with exit 2)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.deaths: dict[str, list[float]] = {}
        self.restarts: dict[str, int] = {}

    def restart(self, died: ActorDied, sources: list[SourceSpec]) -> RestartReason:
        """What the next start journals, or ActorDied when this death makes a crash loop."""
        now = time.monotonic()
        recent = [t for t in self.deaths.get(died.actor, []) if now - t <= self.cfg.period_s] + [now]
        self.deaths[died.actor] = recent
        if len(recent) > self.cfg.max_restarts:
            why = (f"{died}" if self.cfg.max_restarts == 0 else
                   f"{died.args[0].removesuffix(STOPPED)}: {len(recent)} deaths of {died.actor} within "
                   f"{self.cfg.period_s:.0f} s (supervise.max_restarts = {self.cfg.max_restarts}), a crash loop"
                   f"{STOPPED}")
            raise ActorDied(why, died.actor, died.died_at)
        self.restarts[died.actor] = self.restarts.get(died.actor, 0) + 1
        why = died.args[0].removesuffix(STOPPED)
        if not all(source.file for source in sources):      # read again from a checkpoint's offset: files only
            why += ("; a live source cannot be read again: what the previous ingest held after the last checkpoint "
                    "is a gap")
        return RestartReason(died.actor, why, died.died_at, dict(self.restarts))

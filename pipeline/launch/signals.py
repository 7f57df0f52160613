"""The operator's signals to a running pipeline: SIGINT/SIGTERM, to the launcher or to its whole process group, drain
it (the source stops, what was read is processed, the journal gets its final record); a second signal or a drain
stuck past DRAIN_S stops everything; SIGUSR1 makes every actor print its figures.

Owns the launcher's handlers of those signals and the flags they set in the run's directory, which every actor and
every group's launcher watch. Never stops a process itself: the launchers do, on the flags. The actors ignore SIGINT
and SIGTERM (pipeline/process.py `enter`), so a terminal's Ctrl-C reaches them only through here.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from pipeline.process import StopFlag

DRAIN_S = 60.0        # a drain that takes longer than this is cut short


class Signals:
    """SIGINT/SIGTERM: the first drains, the second stops; SIGUSR1 is forwarded to every actor (figures). `pids`:
    per group, the running actors' pids, set by the launcher of each start."""

    def __init__(self, run_dir: str):
        self.drain, self.stop = StopFlag(f"{run_dir}/drain"), StopFlag(f"{run_dir}/stop")
        self.pids: dict[str, object] = {}
        self.drain_since: float | None = None
        self.forced = False                  # a second signal: stopped at once
        self.previous = {sig: signal.signal(sig, self._on_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_stop(self, signum, frame):
        if self.drain_since is None:
            self.drain_since = time.monotonic()
            self.drain.set()
            print(f"ringspec: {signal.Signals(signum).name}: draining (again to stop now)", file=sys.stderr,
                  flush=True)
        else:
            self.forced = True
            self.stop.set()

    def _on_usr1(self, signum, frame):
        for pid in [pid for pids in list(self.pids.values()) for pid in pids()]:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def overdue(self) -> bool:
        return self.drain_since is not None and time.monotonic() - self.drain_since > DRAIN_S

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

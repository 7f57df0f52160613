"""Waiting on other processes by their progress, not by the clock: what tests and benches use to wait for a server.

Owns `wait_for(done, what, ...)`, `cpu_seconds(pid)` and `dies_with_parent` (a server a test or bench starts ends
when its starter dies, even by SIGKILL or a timeout, instead of running on for hours).

A loaded host (two suites side by side, a load of 30 on two cores) slows every process down without stopping any: a
wait that gives up after N wall-clock seconds then fails though nothing is wrong. So a wait here fails only for a
cause that load cannot produce:

- a watched process has exited;
- the watched processes have burned `cpu_budget_s` CPU seconds without the awaited figure moving (work done and
  nothing to show for it; a CPU second is the same work on an idle or a loaded host);
- nothing moved for `hang_s` wall-clock seconds: the last resort against a deadlock, set far above any plausible wait.

Never sleeps longer than `poll_s` between checks and never kills what it watches.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time

TICK = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl        # resolved here: the forked child must not call dlopen


def dies_with_parent() -> None:
    """Popen's preexec_fn: the child gets SIGTERM (a launcher drains on it) when the process that started it dies."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from 3 (state) on: [1] the parent, [11..14] CPU ticks; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()          # fields from 3 (state) on; comm may hold spaces


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by `pid` and its living descendants (and by their children already reaped)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat_fields(int(name))) is not None:
            parents[int(name)] = (int(st[1]), st)
    tree, total = {pid}, 0.0
    grew = True
    while grew:
        more = {p for p, (parent, _) in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    for p in tree:
        if p in parents:
            st = parents[p][1]
            total += sum(int(st[i]) for i in (11, 12, 13, 14)) / TICK     # utime stime cutime cstime
    return total


def alive(pid: int) -> bool:
    st = stat_fields(pid)
    return st is not None and st[0] != "Z"


def wait_for(done, what: str, *, pids=(), progress=None, cpu_budget_s: float = 300.0, hang_s: float = 900.0,
             poll_s: float = 0.2, exit_ok: bool = False) -> None:
    """Poll done() until it holds. progress(): any value that changes while the awaited work moves (lines taken,
    tokens decoded); None counts only CPU. pids: the processes doing the work (their CPU time is the budget; they
    must stay alive unless exit_ok), default this process. Raises TimeoutError naming `what` and the cause."""
    watched = tuple(pids) or (os.getpid(),)
    seen = progress() if progress else None
    cpu0, t0 = sum(map(cpu_seconds, watched)), time.monotonic()
    while not done():
        gone = [] if exit_ok else [p for p in pids if not alive(p)]
        if gone:
            raise TimeoutError(f"{what}: process {gone[0]} exited")
        now = progress() if progress else None
        cpu = sum(map(cpu_seconds, watched))
        if now != seen:
            seen, cpu0, t0 = now, cpu, time.monotonic()
        elif cpu - cpu0 > cpu_budget_s:
            raise TimeoutError(f"{what}: {cpu - cpu0:.0f} CPU seconds used and nothing moved (still {seen!r})")
        elif time.monotonic() - t0 > hang_s:
            raise TimeoutError(f"{what}: nothing moved for {hang_s:.0f} s (still {seen!r}; "
                               f"{cpu - cpu0:.1f} CPU seconds used)")
        time.sleep(poll_s)

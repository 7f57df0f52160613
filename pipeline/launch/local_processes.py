"""The local launcher: each actor of a start as a process of its own on this machine (multiprocessing, spawn).

Owns those processes' lifetimes for one start: started together (SIGUSR1 blocked until each installs its handler),
watched until they end, the group's stop or the operator's drain runs over, and then joined, the stragglers killed. A
death is ActorDied, its exit code or signal named; the supervisor decides what follows (supervise.py). Never decides
what an actor runs with (plan.py).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from pipeline.launch.deaths import DEATH_GRACE_S, STOP_GRACE_S, ActorDied, cause
from pipeline.launch.plan import ActorPlan, Group, write_pids
from pipeline.launch.signals import Signals
from pipeline.process import enter


def processes(plans: list[ActorPlan]) -> dict[str, mp.Process]:
    """Each plan's actor as a local process (spawn, dying with this one), not started yet: `start_all`."""
    ctx = mp.get_context("spawn")
    return {p.name: ctx.Process(target=enter, args=(p.run, p.args, os.getpid()), name=f"ringspec-{p.name}")
            for p in plans}


def start_all(procs) -> None:
    # children inherit a blocked SIGUSR1 through fork+exec, so an early operator request cannot kill an actor that
    # has not installed its handler yet; `enter` unblocks it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        for proc in procs:
            proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def run_local(plans: list[ActorPlan], group: Group, cfg, signals: Signals) -> None:
    """One start of a group's actors, until they end (ActorDied when one dies)."""
    procs = processes(plans)
    signals.pids[group.dir] = lambda: [p.pid for p in procs.values() if p.pid]
    stop = group.stop
    try:
        start_all(procs.values())
        write_pids(group.dir, {name: p.pid for name, p in procs.items()})
        while any(p.is_alive() for p in procs.values()) and not stop.is_set():
            for name, proc in procs.items():
                if proc.exitcode not in (None, 0) and not stop.is_set():
                    stop.set()
                    raise ActorDied(cause(name, proc.pid, proc.exitcode), name)
            if signals.overdue():
                stop.set()
            time.sleep(0.05)
    finally:
        stop.set()
        deadline = time.monotonic() + _grace(procs)      # actors see `stop` within a poll interval
        for proc in procs.values():
            if proc.pid is not None:
                proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for proc in procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join()


def _grace(procs: dict) -> float:
    died = any(p.exitcode not in (None, 0) for p in procs.values())
    return DEATH_GRACE_S if died else STOP_GRACE_S

"""The local launcher: each actor of a start as a process of its own on this machine, forked from one fork server.

The fork server (multiprocessing's forkserver) is a process of this launcher's, started with its first start, that has
imported every actor's modules once: each start and restart is then a fork of it (~0.06 s) instead of a new interpreter
importing NumPy, ONNX Runtime and the pipeline (~0.8 s of CPU an actor: docs/pipeline.md, "Launchers"). An actor
takes the launcher's environment and working directory as they are at its start (`Launcher`), as a spawned process
would. The fork server dies with this launcher (its end of a pipe closes) and every actor with the fork server or the
launcher (PR_SET_PDEATHSIG: pipeline/process.py); it is started with SIGINT, SIGTERM and SIGUSR1 blocked, so a signal
to the whole process group neither stops it under the actors nor kills an actor before its handler is in.

Owns those processes' lifetimes for one start: started together (each born with SIGUSR1 blocked until it installs
its handler), watched until they end, the group's stop or the operator's drain runs over, and then joined, the
stragglers killed. A death is ActorDied, its exit code or signal named; the supervisor decides what follows
(supervise.py). Never decides what an actor runs with (plan.py).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from multiprocessing import forkserver, resource_tracker

from pipeline.launch.deaths import DEATH_GRACE_S, STOP_GRACE_S, ActorDied, cause
from pipeline.launch.plan import ActorPlan, Group, write_pids
from pipeline.launch.signals import Signals
from pipeline.process import BLOCKED_AT_START, Launcher, enter, parent_of
from pipeline.watch import alive

# What the fork server imports once for every actor it forks (a module missing here is imported by the actor itself).
PRELOAD = ["pipeline.process", "actors.ingest", "actors.cache_owner", "actors.target", "actors.draft",
           "actors.output", "actors.site"]


def processes(plans: list[ActorPlan]) -> dict[str, mp.Process]:
    """Each plan's actor as a local process (forked from the fork server, dying with this one), not started yet:
    `start_all`."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)                  # read when the fork server starts: this launcher's first start
    launcher = Launcher(os.getpid(), dict(os.environ), os.getcwd())
    return {p.name: ctx.Process(target=enter, args=(p.run, p.args, launcher), name=f"ringspec-{p.name}")
            for p in plans}


def actor_pids(launcher: int) -> dict[str, int]:
    """The processes a local launcher runs its actors with, by name: "fork_server", and each running actor (rs:<name>,
    set on entry; the fork server's children)."""
    found = {}
    for server in _children({launcher}):
        try:
            with open(f"/proc/{server}/cmdline", "rb") as f:
                if b"multiprocessing.forkserver" not in f.read():
                    continue
        except OSError:
            continue
        found["fork_server"] = server
        for pid in _children({server}):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
            except OSError:                             # gone since the listing
                continue
            if name.startswith("rs:"):
                found[name[3:]] = pid
    return found


def _children(parents: set[int]) -> list[int]:
    """The pids whose parent is one of `parents`."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and parent_of(int(entry)) in parents]


def start_all(procs) -> None:
    _ensure_fork_server()
    for proc in procs:
        proc.start()


def _ensure_fork_server() -> None:
    """Start the fork server (once; again if it died) with BLOCKED_AT_START blocked: it never acts on them, and every
    actor it forks is born with them blocked, so an early operator request cannot kill an actor that has not
    installed its handler yet (`enter` unblocks them). A signal that reaches this launcher meanwhile waits."""
    resource_tracker.ensure_running()       # starting its own process unblocks SIGINT and SIGTERM: before we block
    before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_AT_START)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def run_local(plans: list[ActorPlan], group: Group, cfg, signals: Signals) -> None:
    """One start of a group's actors, until they end (ActorDied when one dies)."""
    procs = processes(plans)
    signals.pids[group.dir] = lambda: [p.pid for p in procs.values() if p.pid]
    stop = group.stop
    try:
        start_all(procs.values())
        write_pids(group.dir, {name: p.pid for name, p in procs.items()})
        while not stop.is_set():
            for name, proc in procs.items():     # deaths first: several at once (the fork server's) end them all
                if proc.exitcode not in (None, 0):
                    stop.set()
                    raise ActorDied(_cause(name, proc), name)
            if not any(p.is_alive() for p in procs.values()):
                break                            # every actor ended cleanly
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


def _cause(name: str, proc: mp.Process) -> str:
    """An actor's death, named; one whose fork server is gone was killed with it (PR_SET_PDEATHSIG), which the fork
    server can no longer report (multiprocessing gives it exit code 255)."""
    server = forkserver._forkserver._forkserver_pid
    if proc.exitcode == 255 and server is not None and not alive(server):
        return f"actor {name} (pid {proc.pid}) died with the launcher's fork server (pid {server}), which is gone"
    return cause(name, proc.pid, proc.exitcode)


def _grace(procs: dict) -> float:
    died = any(p.exitcode not in (None, 0) for p in procs.values())
    return DEATH_GRACE_S if died else STOP_GRACE_S

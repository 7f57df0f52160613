"""What every actor process does on entry and keeps while it runs: enter (`enter`: name the process, one malloc
arena, die with the launcher, ignore the terminal's signals, run the actor's `run(args)`, a failure one line on stderr
and exit code 1), pin its CPUs, account for its time and memory, and watch the pipeline's stop flag.

Owns nothing else: no channels, no model, no actor's arguments (actors/args.py). Figures are plain dicts so they
travel in a channel header. Also the test-only fault hook (`chaos`), inert unless RINGSPEC_CHAOS is set.
"""
from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import forkserver
from typing import Callable

from pipeline.channel import Channel
from pipeline.config import cpu_set
from pipeline.watch import stat_fields


def pin(cpus: str) -> None:
    """Restrict this process (and the threads it starts later, ONNX Runtime's among them) to a CPU set."""
    chosen = cpu_set(cpus)
    if chosen:
        os.sched_setaffinity(0, chosen)


def proc_status(pid: int | str = "self") -> dict:
    """Resident memory now and at its peak (MB) and thread count of a process (this one by default), from
    /proc/PID/status; OSError when it is gone."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key.lower() + "_mb"] = int(value.split()[0]) / 1024
            elif key == "Threads":
                out["threads"] = int(value)
    return out


class Figures:
    """Busy time (inside `with figures.busy():`) against wall time since start."""

    def __init__(self, name: str):
        self.name, self.start, self.busy_s = name, time.perf_counter(), 0.0
        self.extra: dict = {}

    @contextmanager
    def busy(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.busy_s += time.perf_counter() - t0

    def snapshot(self) -> dict:
        wall = time.perf_counter() - self.start
        return {"actor": self.name, "pid": os.getpid(), "wall_s": wall, "busy_s": self.busy_s,
                "busy_share": self.busy_s / wall if wall else 0.0,
                "cpus": sorted(os.sched_getaffinity(0)), **proc_status(), **self.extra}


class StopFlag:
    """A stop request every actor on this node sees, whichever launcher started it (local processes and Ray actors
    alike): the existence of a file in the run's directory (set when any of `paths` exists). Plain data, so it
    pickles into any process."""

    def __init__(self, *paths: str):
        self.paths = paths

    def set(self) -> None:
        with open(self.paths[0], "a"):
            pass

    def clear(self) -> None:
        for path in self.paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def is_set(self) -> bool:
        return any(os.path.exists(p) for p in self.paths)


_SHOWN: list[Figures] = []          # every actor's figures in this process (several, when run_each hosts them)


def figures_on_request(figures: Figures) -> None:
    """SIGUSR1 prints this actor's figures as one JSON line on stderr (the launcher forwards the operator's signal);
    a process hosting several actors (`run_each`) prints each one's."""
    _SHOWN.append(figures)
    if threading.current_thread() is threading.main_thread():    # an actor run as a thread (a test) has no signals
        signal.signal(signal.SIGUSR1, _show)


def _show(signum, frame) -> None:
    for figures in _SHOWN:         # one write(2) per line: actors share the launcher's stderr
        os.write(sys.stderr.fileno(), f"figures {json.dumps(figures.snapshot())}\n".encode())


# Blocked while the local launcher starts its fork server, so in it and in every actor it forks, at birth
# (pipeline/launch/local_processes.py); `enter` unblocks them once the actor's handlers are in.
BLOCKED_AT_START = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}


@dataclass(frozen=True)
class Launcher:
    """What a locally launched actor takes from its launcher at its start: the launcher's pid (the actor dies with
    it), its environment and working directory as they are then (a forked actor's own are the fork server's, from
    the launcher's first start)."""
    pid: int
    environ: dict
    cwd: str


def enter(run: Callable[[object], None], args, launcher: Launcher | None = None) -> None:
    """An actor's entry point, in its own process: `run(args)` (args: its dataclass of actors/args.py; a tuple of
    them: several streams' actors of one role, `run_each`); a failure is one line on stderr and exit code 1. The
    process is named rs:<actor>, its module's name (what `top` and `ps -o comm` show). With `launcher` (a local
    launch) the actor takes its environment and dies with it: a launcher killed outright (SIGKILL, OOM) leaves no
    actor spinning on (PR_SET_PDEATHSIG)."""
    actor = run.__module__.rpartition(".")[2]
    _name_process(f"rs:{actor}")
    _one_malloc_arena()
    if launcher is not None:
        _die_with(launcher.pid)
        _release_fork_server()
        os.environ.clear()
        os.environ.update(launcher.environ)
        os.chdir(launcher.cwd)
    for sig in (signal.SIGINT, signal.SIGTERM):         # a terminal's Ctrl-C reaches the whole process group: the
        signal.signal(sig, signal.SIG_IGN)              # launcher drains the pipeline, the actors go on until told
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)       # until the actor installs its figures handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_AT_START)
    try:
        if isinstance(args, tuple):                    # several streams' actors of one role: a thread each
            run_each(run, args)
        else:
            run(args)
    except Stopped:
        pass                                           # stopped before its peers were up: a clean exit
    except Exception as exc:                           # noqa: BLE001 -- reported, then the launcher stops the rest
        if os.environ.get("RINGSPEC_TRACEBACK"):
            traceback.print_exc()
        print(f"ringspec: error: actor {actor}: {type(exc).__name__}: {exc}"
              f"{'' if os.environ.get('RINGSPEC_TRACEBACK') else ' (RINGSPEC_TRACEBACK=1 prints where)'}",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _one_malloc_arena() -> None:
    """Every thread of this process allocates from glibc's main arena. By default a thread that finds the arena's
    lock taken gets an arena of its own (up to 8 per core) whose pages stay resident: an actor's memory then steps up
    whenever load makes more of its threads (the HTTP handlers, zmq's) allocate at once (4-7 arenas per actor seen in
    a short serving run; the likely cause of the output actor's 260 KiB step in the first million-token serving soak:
    docs/stream-quality.md). The GIL already serialises nearly all of an
    actor's allocations. Takes effect only before the process's second thread first allocates (a Ray worker has
    started its own by then); a C library without mallopt is left as it is."""
    try:
        ctypes.CDLL(None).mallopt(-8, 1)                            # M_ARENA_MAX = 1
    except (OSError, AttributeError):
        pass


def _die_with(launcher: int) -> None:
    """SIGKILL this process when its parent exits (the launcher, or the launcher's fork server, which exits with it);
    exit now if that parent is already gone."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)           # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.getppid()
    if parent != launcher and parent_of(parent) != launcher:       # died before the request took effect
        os._exit(1)


def _release_fork_server() -> None:
    """multiprocessing hands every process its fork server forks the server's keep-alive pipe (so that it could fork
    more), and the server ends only when every holder has closed it: an actor forks nothing, so it closes its copy
    and the fork server ends with the launcher (then the actors with it: `_die_with`)."""
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def parent_of(pid: int) -> int | None:
    """A process's parent's pid, from /proc/PID/stat; None when it is gone."""
    st = stat_fields(pid)
    return None if st is None else int(st[1])


def _name_process(name: str) -> None:
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)      # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def run_each(run: Callable[[object], None], each: tuple) -> None:
    """One role's actors of several streams (`run(args)` for each of `each`) in this one process, a thread each:
    the interpreter, its libraries and the model's tokenizer once, not once per stream (docs/streams.md, "Cost").
    The first actor to fail fails the process with its exception (the launcher restarts the group, as for any
    actor's death); one stopped before its peers were up ends quietly, as it would alone."""
    ended: queue.SimpleQueue = queue.SimpleQueue()

    def one(args) -> None:
        try:
            run(args)
            ended.put(None)
        except Stopped:
            ended.put(None)
        except BaseException as exc:              # noqa: BLE001 -- handed to the main thread, which raises it
            ended.put(exc)

    if threading.current_thread() is threading.main_thread():      # the threads cannot install it
        signal.signal(signal.SIGUSR1, _show)
    for args in each:
        threading.Thread(target=one, args=(args,), daemon=True).start()
    for _ in each:
        failed = ended.get()
        if failed is not None:
            raise failed


class Stopped(Exception):
    """The pipeline was stopped while this actor was still waiting for a peer."""


def attach_when_ready(name: str, stop, timeout: float = 300.0):
    """Attach to a channel whose owner may still be starting (loading a model), giving up early on `stop`."""

    deadline = time.monotonic() + timeout
    while True:
        try:
            return Channel.attach(name, timeout=0.5)
        except TimeoutError:
            if stop.is_set():
                raise Stopped(name) from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"channel {name} did not appear within {timeout:.0f} s") from None


def messages(channel, stop, poll_s: float = 0.2):
    """The channel's messages until `stop` is set (polling, so a stop is seen within poll_s)."""
    while not stop.is_set():
        try:
            yield channel.recv(timeout=poll_s)
        except TimeoutError:
            continue


CHAOS_DIR = os.environ.get("RINGSPEC_CHAOS") or None      # test-only: `python run.py chaos` sets it for its run


class ChaosError(RuntimeError):
    """The exception `chaos` raises inside an actor when its armed point says "raise"."""


def chaos(point: str) -> None:
    """A named point an actor passes (README "Surviving faults"). Inert (one global read) unless RINGSPEC_CHAOS
    names a directory; then, if the file <dir>/<point> exists, this process claims it (rename: one claimant) and
    dies as the file says: "kill" (SIGKILL, as an OOM kill would) or "raise" (an exception in the actor's code)."""
    if CHAOS_DIR is None:
        return
    armed = os.path.join(CHAOS_DIR, point)
    try:
        os.rename(armed, f"{armed}.{os.getpid()}.hit")
    except FileNotFoundError:
        return
    with open(f"{armed}.{os.getpid()}.hit") as f:
        how = f.read().strip()
    if how == "raise":
        raise ChaosError(f"chaos: raised at {point}")
    os.kill(os.getpid(), signal.SIGKILL)

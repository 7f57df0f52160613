"""Running a command from a test the way a loaded host allows: wait while it works, not for a number of seconds.

`run(cmd, ...)` is `subprocess.run(cmd, capture_output=True, text=True)` whose wait ends when the command exits, and
fails (killing it) only when it burns `cpu_budget_s` CPU seconds without printing a line, or prints nothing and uses
no CPU for 900 s (pipeline/watch.py); `finish(proc, ...)` is the same for `proc.communicate()`. A wall-clock timeout
fails a correct test when the host is busy; these do not.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import subprocess
import threading

import pytest

from pipeline.watch import wait_for


def run(cmd, *, input: str | None = None, env=None, cwd=None, check: bool = False,
        cpu_budget_s: float = 600.0) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=buf.extend, args=(stream,), daemon=True)
               for stream, buf in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    if input is not None:
        proc.stdin.write(input)
        proc.stdin.close()
    try:
        wait_for(lambda: proc.poll() is not None and not any(r.is_alive() for r in readers),
                 " ".join(str(c) for c in cmd[1:4]), pids=[proc.pid], exit_ok=True,
                 progress=lambda: (len(out), len(err)), cpu_budget_s=cpu_budget_s)
    except TimeoutError as e:
        proc.kill()
        proc.wait()
        pytest.fail(f"{e}\n{''.join(err)[-2000:]}")
    done = subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err))
    if check:
        done.check_returncode()
    return done


def finish(proc: subprocess.Popen, what: str, data: str | None = None) -> tuple[str, str]:
    """proc.communicate(data) for a process started elsewhere, waiting the same way as `run`."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(proc.communicate(data)), daemon=True)
    reader.start()
    try:
        wait_for(lambda: not reader.is_alive(), what, pids=[proc.pid], exit_ok=True)
    except TimeoutError as e:
        proc.kill()
        pytest.fail(str(e))
    return got[0], got[1]


@contextlib.contextmanager
def actor(run, args):
    """An actor's `run(args)` in a spawned process of its own, as the launcher starts it; on leaving, the stop flag
    (`args.stop`) is set and the process reaped (killed if it does not end)."""
    proc = mp.get_context("spawn").Process(target=run, daemon=True, args=(args,))
    proc.start()
    try:
        yield proc
    finally:
        args.stop.set()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()

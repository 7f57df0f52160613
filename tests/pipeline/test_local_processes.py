"""The local launcher's processes (pipeline/launch/local_processes.py): actors forked from one fork server take the
launcher's environment and working directory as they are at their start, and the fork server outlives the signals an
operator sends to the whole process group."""
from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.launch.local_processes import actor_pids, processes, start_all
from pipeline.launch.plan import ActorPlan


@dataclass(frozen=True)
class Report:
    out: str          # where the actor writes what it was born with
    hold: str         # the actor runs until this file exists


def run(args: Report) -> None:
    """A stand-in actor: writes its environment's marker and working directory, then waits to be let go."""
    Path(args.out).write_text(json.dumps({"mark": os.environ.get("RINGSPEC_TEST_MARK"), "cwd": os.getcwd()}))
    while not os.path.exists(args.hold):
        time.sleep(0.02)


@contextmanager
def started(tmp_path: Path, name: str):
    """A stand-in actor started as the local launcher starts one: (its process, what it reported); let go (and
    reaped, killed if it hangs) on leaving."""
    out, hold = tmp_path / f"{name}.json", tmp_path / f"{name}.hold"
    procs = processes([ActorPlan(name, run, Report(str(out), str(hold)))])
    start_all(procs.values())
    proc = procs[name]
    try:
        while not out.exists() or not out.read_text():
            assert proc.exitcode is None, f"the actor ended before reporting: exit code {proc.exitcode}"
            time.sleep(0.02)
        yield proc, json.loads(out.read_text())
    finally:
        hold.touch()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_an_actor_takes_the_launchers_environment_and_directory_as_they_are_at_its_start(tmp_path, monkeypatch):
    """The fork server was started by an earlier start (or another test) with the environment of then: what an
    actor sees must be the launcher's now, as a spawned process would see it."""
    monkeypatch.setenv("RINGSPEC_TEST_MARK", "first")
    with started(tmp_path, "first") as (first, seen):
        assert seen["mark"] == "first"
    monkeypatch.setenv("RINGSPEC_TEST_MARK", "second")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with started(tmp_path, "second") as (second, seen):
        assert seen == {"mark": "second", "cwd": str(tmp_path / "elsewhere")}
    assert first.exitcode == second.exitcode == 0


def test_the_fork_server_and_its_actors_outlive_a_terminate_sent_to_the_whole_process_group(tmp_path):
    """systemd's stop and `kill -TERM -PGID` reach every process of the group: the launcher drains on it, so the fork
    server must not die under its actors (they die with it) and the actors ignore it (pipeline/process.py)."""
    with started(tmp_path, "termed") as (actor, _):
        pids = actor_pids(os.getpid())
        assert actor.pid in pids.values() and "fork_server" in pids              # named by its module
        assert signal.SIGTERM in mask(pids["fork_server"], "SigBlk") and signal.SIGTERM in mask(actor.pid, "SigIgn")
        for pid in (pids["fork_server"], actor.pid):
            os.kill(pid, signal.SIGTERM)
    assert actor.exitcode == 0, "killed: the fork server died under it (PR_SET_PDEATHSIG), or the signal did"
    assert actor_pids(os.getpid())["fork_server"] == pids["fork_server"]


def mask(pid: int, field: str) -> set[int]:
    """The signals of a /proc/PID/status mask (SigBlk: blocked, SigIgn: ignored)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            bits = int(line.split()[1], 16)
            return {n for n in range(1, 65) if bits >> (n - 1) & 1}
    raise AssertionError(f"no {field} in /proc/{pid}/status")

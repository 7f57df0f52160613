"""Supervision, on the real model and real processes: an actor that dies is restarted with the whole pipeline from the
last durable checkpoint (README, "Surviving faults"), and a file stream loses no line and repeats none; a whole
service killed outright resumes from the journal; a crash loop and a fail-stop profile stop with exit code 2 and leave
nothing behind (a Ray actor's death: test_launch.py's joined-cluster test). Lines are counted by
`bench.chaos.account`: the journal's checkpoints against the log's own bytes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bench.chaos import account, offered
from pipeline import config
from pipeline.config import SuperviseSection
from pipeline.launch.deaths import ActorDied, Supervisor
from pipeline.stream.sources import SourceSpec
from tests import procs
from tests.paths import ROOT
from tests.pipeline.test_launch import (  # noqa: F401 -- no_stray_pipelines: the autouse fixture, here too
    ENV,
    LOG,
    actor_pids,
    alive,
    journal_of,
    launch,
    leftovers,
    no_stray_pipelines,
    parent_of,
    processes,
    wait_for,
)

pytestmark = pytest.mark.slow
# shorter assessments and a smaller window (less to refill after each restart): the kills come sooner
FAST = "[cache]\nwindow = 256\n[replay]\nevery_lines = 10\nmax_new_tokens = 16\n"


def test_chaos_kills_every_actor_at_every_named_point_and_no_line_is_lost_or_repeated(default_gguf, tmp_path):
    """The CI-sized chaos run: every named point of every actor (SIGKILL or an exception, by the seed), random
    moments, about ten deaths; every line of the log committed exactly once, no assessment written twice or lost."""
    profile = tmp_path / "fast.toml"
    profile.write_text(FAST + "trigger_pattern = '\\b(HH|LL)\\b'\n")
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "chaos", "--kills", "10", "--seed", "3",
                           "--copies", "1", "--config", str(profile), "--json"],
                          capture_output=True, text=True, env=ENV, timeout=1500)
    got = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert got["kills"] >= 10 and not got["unreached_points"], got
    assert all(n >= 1 for n in got["deaths_by_actor"].values()), got["deaths_by_actor"]
    assert got["lines_offered"] == got["lines_committed"] == 242
    assert got["lines_lost"] == got["lines_duplicated"] == got["lines_foreign"] == 0
    assert got["assessments_duplicated"] == got["assessments_lost"] == 0 and got["assessments_written"] > 0
    assert got["restarts"] >= 1 and got["recovery_lines"] > 0 and got["recovery_s_p50"] > 0


def test_a_power_loss_resumes_from_the_checkpoint_across_a_rotated_journal_without_losing_or_repeating_a_line(
        default_gguf, tmp_path):
    """SIGKILL to every process at once (a power cut, `systemctl kill -s KILL`), then `--resume`: the stream
    continues after the last durable checkpoint; over both runs every line is committed exactly once. The journal is
    rotated every few records (`supervise.journal_max_mb`, the security round's finding 9): the resume reads the
    newest file's carried checkpoint, and across the kept files every line is committed exactly once. (Two tests
    before, each a power cut, one of them unrotated: one run holds both; an unrotated journal's resume is
    test_an_assessment_a_crash_interrupted_is_written_once_after_the_window_is_refilled's.)"""
    from pipeline.stream.journal import files, history
    journal, profile = tmp_path / "journal.jsonl", tmp_path / "rotating.toml"
    profile.write_text("[supervise]\njournal_max_mb = 0.004\njournal_keep = 1000\n")
    args = [str(LOG), "--quiet-lines", "--every", "8", "--max-lines", "64", "--journal", str(journal),
            "--config", str(profile)]
    first = launch(*args, group=True)

    def rotated_after_two_assessments() -> bool:
        # the record that passes max_bytes is fsynced before the rotation it triggers: wait for the rotation itself
        try:
            return len(files(str(journal))) >= 2 and sum(r["kind"] == "assessment" for r in history(str(journal))) >= 2
        except FileNotFoundError:                                    # listed, then renamed by a rotation
            return False

    wait_for(rotated_after_two_assessments, "two assessments in a journal rotated once", first)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    second = launch(*args, "--resume")
    out, err = procs.finish(second, "the resumed pipeline ending")
    assert second.returncode == 0, err
    assert "resumed from the journal (resume): the stream continues after offset" in err
    assert len(files(str(journal))) > 3
    records = list(history(str(journal)))
    restart = next(r for r in records if r["kind"] == "restart")
    assert restart["actor"] == "" and restart["cause"] == "resume" and restart["resumed_after"] > 0
    lines = (tmp_path / "first64.csv")
    lines.write_bytes(b"".join(LOG.read_bytes().splitlines(keepends=True)[:65]))
    got = account(lines, journal, config.load(profile), serve=False)
    assert got["lines_committed"] == len(offered(lines)) == 64
    assert got["lines_lost"] == got["lines_duplicated"] == got["assessments_duplicated"] == 0
    assert next(r for r in records if r["kind"] == "recovery")["lines"] > 0   # the window was refilled
    assert not leftovers(first) and not leftovers(second)


def test_an_assessment_a_crash_interrupted_is_written_once_after_the_window_is_refilled(default_gguf, tmp_path):
    """The journal as a crash during the assessment after line 20 leaves it (its last checkpoint says the assessment
    is due; its record was never written): `--resume` refills the window, writes that assessment over the same 20
    lines before any new line, once, and goes on."""
    journal = tmp_path / "journal.jsonl"
    first = launch(str(LOG), "--quiet-lines", "--every", "10", "--max-lines", "20", "--journal", str(journal))
    out, err = procs.finish(first, "the first run ending")
    assert first.returncode == 0, err
    records = journal_of(journal)
    last = next(r for r in reversed(records) if r["kind"] == "assessment")
    assert last["lines"] == 20
    kept = [r for r in records if r is not last and r["kind"] != "eof"]
    crashed = {**last["checkpoint"], "kind": "checkpoint", "due": "every"}
    journal.write_text("".join(json.dumps(r) + "\n" for r in [*kept, crashed]))
    second = launch(str(LOG), "--quiet-lines", "--every", "10", "--max-lines", "25", "--journal", str(journal),
                    "--resume")
    out, err = procs.finish(second, "the resumed run ending")
    assert second.returncode == 0, err
    written = [(r["lines"], r["trigger"], r["offsets"][1]) for r in journal_of(journal) if r["kind"] == "assessment"]
    assert written == [(10, "every", written[0][2]), (20, "every", crashed["offset"])], written


def test_a_streams_thread_that_fails_restarts_its_group_and_every_streams_lines_are_committed_once(
        default_gguf, tmp_path):
    """Two streams: each role's actors of a group are threads of one process (pipeline/process.py run_each). At the
    first verdict of either stream (after both have started: the target's Ready comes before any line is fed) that
    stream's cache owner raises in its thread: the process fails with it, the group restarts from each stream's
    checkpoint, and over the run every line of both logs is committed exactly once, no assessment written twice or
    lost."""
    from tests.paths import SHARED
    chaos, profile, journal = tmp_path / "chaos", tmp_path / "fast.toml", tmp_path / "j.jsonl"
    chaos.mkdir()
    (chaos / "owner.verdict").write_text("raise")
    profile.write_text(FAST)
    logs = {}
    for name, log in (("bgl", "BGL_2k.log"), ("zookeeper", "Zookeeper_2k.log")):
        logs[name] = tmp_path / f"{name}.log"
        logs[name].write_bytes(b"".join((SHARED / "data" / "loghub" / log).read_bytes().splitlines(True)[:20]))
    proc = launch(*map(str, logs.values()), "--quiet-lines", "--config", str(profile), "--journal", str(journal),
                  env={"RINGSPEC_CHAOS": str(chaos)})
    out, err = procs.finish(proc, "the run ending")
    assert proc.returncode == 0, err
    assert "actor cache_owner" in err and err.count("restarting the pipeline") == 1 and "Traceback" not in err, err
    assert not (chaos / "owner.verdict").exists()                   # claimed: the fault was hit once
    cfg = config.load(profile)
    for name, log in logs.items():
        path = tmp_path / f"j.{name}.jsonl"
        got = account(log, path, cfg, serve=False)
        assert got["lines_committed"] == len(offered(log)) == 20, (name, got)
        assert got["lines_lost"] == got["lines_duplicated"] == got["lines_foreign"] == 0, (name, got)
        assert got["assessments_duplicated"] == got["assessments_lost"] == 0 and got["assessments_written"], got
        assert [r["actor"] for r in journal_of(path) if r["kind"] == "restart"] == ["cache_owner"], name
    assert not leftovers(proc)


def test_a_fork_server_killed_outright_takes_its_actors_with_it_and_the_group_starts_again(default_gguf, tmp_path):
    """Every local actor is forked from the launcher's fork server (pipeline/launch/local_processes.py), one process
    whose death (the OOM killer's choice) takes them all (PR_SET_PDEATHSIG): the supervisor restarts the group on a
    new fork server, and every line is committed exactly once."""
    from tests.paths import SHARED
    profile, journal, log = tmp_path / "fast.toml", tmp_path / "j.jsonl", tmp_path / "bgl.log"
    profile.write_text(FAST)
    log.write_bytes(b"".join((SHARED / "data" / "loghub" / "BGL_2k.log").read_bytes().splitlines(True)[:24]))
    proc = launch(str(log), "--quiet-lines", "--rate", "2", "--config", str(profile), "--journal", str(journal))
    actors = actor_pids(proc, "local")                 # ingest still feeding: 24 lines at 2 a second
    wait_for(lambda: journal.exists() and any(r["kind"] == "start" for r in journal_of(journal)),
             "the pipeline up (its start record)", proc)
    server = parent_of(actors["target"])
    os.kill(server, signal.SIGKILL)
    out, err = procs.finish(proc, "the run ending")
    assert proc.returncode == 0, err
    assert not alive(server) and not any(alive(pid) for pid in actors.values())
    assert err.count("restarting the pipeline") == 1 and f"with the launcher's fork server (pid {server})" in err, err
    got = account(log, journal, config.load(profile), serve=False)
    assert got["lines_committed"] == len(offered(log)) == 24, got
    assert got["lines_lost"] == got["lines_duplicated"] == got["lines_foreign"] == 0, got
    assert not leftovers(proc)


def test_a_crash_loop_stops_with_exit_code_2_and_says_why(default_gguf, tmp_path):
    """An actor that dies at every start (here the draft raises at its first proposal, re-armed each time) is
    restarted `max_restarts` times, then the pipeline stops: exit 2, the cause, nothing left behind."""
    chaos = tmp_path / "chaos"
    chaos.mkdir()
    profile = tmp_path / "loop.toml"
    profile.write_text("[replay]\nevery_lines = 3\nmax_new_tokens = 8\n[supervise]\nmax_restarts = 1\n"
                       "period_s = 3600.0\n")
    done = threading.Event()

    def rearm():
        while not done.is_set():
            if not (chaos / "draft.proposed").exists():
                (chaos / "armed.tmp").write_text("raise")
                os.replace(chaos / "armed.tmp", chaos / "draft.proposed")
            done.wait(0.05)
    threading.Thread(target=rearm, daemon=True).start()
    try:
        proc = launch(str(LOG), "--quiet-lines", "--config", str(profile), env={"RINGSPEC_CHAOS": str(chaos)})
        out, err = procs.finish(proc, "the crash loop ending")
    finally:
        done.set()
    assert proc.returncode == 2, err
    assert "2 deaths of draft within 3600 s (supervise.max_restarts = 1), a crash loop" in err, err
    assert err.count("restarting the pipeline") == 1 and "Traceback" not in err
    assert not leftovers(proc)


def test_fail_stop_still_exists_as_a_profile_and_leaves_nothing_behind(default_gguf, tmp_path):
    """`[supervise] max_restarts = 0`: the first death stops everything, as before supervision (exit 2)."""
    profile = tmp_path / "failstop.toml"
    profile.write_text("[supervise]\nmax_restarts = 0\n")
    proc = launch(str(LOG), "--quiet-lines", "--speed", "0.01", "--config", str(profile))
    actors = actor_pids(proc, "local")
    time.sleep(3.0)
    os.kill(actors["target"], signal.SIGKILL)
    out, err = procs.finish(proc, "the pipeline ending")
    assert proc.returncode == 2
    assert "actor target" in err and "died: signal 9 (SIGKILL)" in err and "Traceback" not in err
    assert "restarting" not in err
    assert not any(alive(pid) for pid in actors.values())
    assert not leftovers(proc)


def test_the_supervisor_counts_deaths_per_actor_within_its_period():
    sup = Supervisor(SuperviseSection(max_restarts=2, period_s=3600.0))
    first = sup.restart(ActorDied("actor target (pid 1) died: x; the pipeline was stopped", "target"),
                        [SourceSpec("replay")])
    assert first.restarts == {"target": 1} and first.cause == "actor target (pid 1) died: x"
    sup.restart(ActorDied("actor draft (pid 2) died: x", "draft"), [SourceSpec("tcp")])
    assert "a live source cannot be read again" in sup.restart(ActorDied("d", "draft"), [SourceSpec("tcp")]).cause
    with pytest.raises(ActorDied, match="3 deaths of draft within 3600 s"):
        sup.restart(ActorDied("actor draft (pid 3) died: x", "draft"), [SourceSpec("replay")])
    with pytest.raises(ActorDied, match="died: x; the pipeline was stopped"):
        Supervisor(SuperviseSection(max_restarts=0)).restart(
            ActorDied("actor draft (pid 3) died: x; the pipeline was stopped", "draft"), [SourceSpec("replay")])

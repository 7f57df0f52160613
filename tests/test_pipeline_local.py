"""The local launcher: real processes over shared-memory channels, the same assessments as the serial engine, and
clean exits (normal end, SIGTERM, an actor SIGKILLed): no orphan process, no leftover segment."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "data" / "tep_demo.csv"


def segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("ringspec_")}


def children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def launch(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), "replay", str(LOG), "--launcher", "local",
                             "--quiet-lines", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_local_pipeline_writes_the_same_assessments_as_the_serial_engine(default_gguf, tmp_path):
    from pipeline import config, tasks

    before = segments()
    journal = tmp_path / "journal.jsonl"
    proc = launch("--max-lines", "30", "--journal", str(journal))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    local = [r["text"] for r in records if r["kind"] == "assessment"]
    assert records[-1]["kind"] == "eof" and records[-1]["sent"] == 30

    serial = []
    tasks.replay(str(LOG), None, config.load(), lambda kind, p: serial.append(p["text"]) if kind == "assessment"
                 else None, max_lines=30)
    assert local == serial and len(local) == 3
    assert all(r["offsets"][0] < r["offsets"][1] for r in records if r["kind"] == "assessment")
    assert segments() <= before


def wait_for_actors(proc, n=3, timeout=120.0) -> list[int]:
    """Pids of the launcher's spawned actor processes (not its resource tracker), once all n are up."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        actors = []
        for kid in children(proc.pid):
            try:
                if b"multiprocessing.spawn" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    actors.append(kid)
            except OSError:
                continue
        if len(actors) >= n:
            return actors
        time.sleep(0.1)
    raise AssertionError("actors did not start")


def test_sigkill_of_an_actor_stops_the_pipeline_cleanly(default_gguf):
    before = segments()
    proc = launch("--speed", "0.01")                      # slow replay: the pipeline is mid-stream when killed
    actors = wait_for_actors(proc)
    time.sleep(3.0)
    victim = actors[1]
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "died: signal 9 (SIGKILL)" in err and "Traceback" not in err
    assert not any(alive(pid) for pid in actors)
    assert segments() <= before


def test_sigterm_stops_the_pipeline_without_leftovers(default_gguf):
    before = segments()
    proc = launch("--speed", "0.01")
    actors = wait_for_actors(proc)
    time.sleep(3.0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert not any(alive(pid) for pid in actors)
    assert segments() <= before


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def test_per_actor_cpu_affinity_from_the_config_is_applied(default_gguf, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        import pytest
        pytest.skip("needs two CPUs")
    profile = tmp_path / "pinned.toml"
    profile.write_text('[actors]\ningest_cpus = "1"\nowner_cpus = "0"\noutput_cpus = "1"\n')
    proc = launch("--speed", "0.01", "--config", str(profile))
    try:
        actors = wait_for_actors(proc)
        deadline = time.time() + 60
        seen = {}
        while time.time() < deadline and sorted(seen.values()) != ["0", "1", "1"]:   # each pins on start-up
            time.sleep(0.5)
            seen = {pid: cpus_allowed(pid) for pid in actors if alive(pid)}
        assert sorted(seen.values()) == ["0", "1", "1"], seen
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        finally:
            for pid in [proc.pid, *children(proc.pid)]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0


def test_journal_names_offsets_and_counts_tags_not_in_view(default_gguf, tmp_path):
    journal = tmp_path / "journal.jsonl"
    proc = launch("--max-lines", "20", "--journal", str(journal))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    analyses = [r for r in records if r["kind"] == "assessment"]
    assert len(analyses) == 2
    for a in analyses:
        assert a["offsets"][0] <= a["offsets"][1] and a["window_lines"] >= 10 and a["latency_ms"] > 0
        assert set(a["tags_hallucinated"]) <= set(a["tags_mentioned"])
        assert not set(a["tags_hallucinated"]) & set(a["window_tags"])
    figures = {f["actor"]: f for f in records[-1]["figures"]}
    assert set(figures) == {"ingest", "cache_owner", "output"}
    assert 0 < figures["cache_owner"]["forward_s"] <= figures["cache_owner"]["busy_s"] * 1.01
    assert "overhead share" in err

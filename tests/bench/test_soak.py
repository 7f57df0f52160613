"""The soak command end to end on a short run: every actor sampled, no segment or descriptor growth, the KV pool
equal to its formula, PPL of complete loops reported. (The million-token run is a command, not a CI test.)"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from bench.soak import report
from models.gguf import GGUFModel
from tests import procs
from tests.paths import ROOT


def test_a_short_soak_samples_every_actor_and_reports_the_figures(default_gguf, default_pool_bytes, tmp_path):
    log = tmp_path / "loop.log"
    log.write_text("".join(f"12:{i // 60:02d}:{i % 60:02d} PIC{i % 7:03d} H PRESSURE HIGH ALM\n" for i in range(60)))
    profile = tmp_path / "small.toml"
    profile.write_text("[cache]\nwindow = 128\n[replay]\nevery_lines = 40\nmax_new_tokens = 16\n")
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "soak", "--tokens", "4000", "--every", "500",
                      "--log", str(log), "--config", str(profile), "--json", "--plot", str(tmp_path / "m.svg")])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["tokens"] >= 4000 and out["samples"] >= 6 and out["assessments"] >= 2
    assert set(out["actors"]) == {"fork_server", "ingest", "cache_owner", "target", "draft", "output"}
    assert out["segments_growth"] == 0
    header = GGUFModel(default_gguf).config                  # the formula from the file, not from the pool's shape
    per_slot = 2 * header.n_layers * header.n_kv_heads * (header.d_model // header.n_heads) * default_pool_bytes
    mirror = min(out["ring"], out["window"] + 32)         # ring slots stored twice: a pass's view is one slice
    assert out["kv_pool_bytes"] == per_slot * (out["sink"] + out["ring"] + mirror)
    assert out["goals"]["kv_pool_matches_formula"]
    assert out["loops_complete"] >= 2 and 0.5 < out["ppl_last_over_first"] < 2.0
    assert (tmp_path / "m.svg").read_text().startswith("<svg")


def samples(rss_kib_per_1k: float, tokens: int = 100_000, fds_step: int = 0) -> list[dict]:
    """Every 1,000 tokens, two actors; summed RSS grows at `rss_kib_per_1k` (half each), warm-up samples wild."""
    out = []
    for i, t in enumerate(range(0, tokens + 1, 1000)):
        warm = t >= 0.10 * tokens                          # the definition: after the first 10%
        rss = 50_000 + rss_kib_per_1k / 2 * t / 1000 if warm else 90_000.0 * (i % 2)   # warm-up: ignored
        out.append({"tokens": t, "segments": 5, "actors": {
            name: {"rss_kb": rss, "anon_kb": rss, "fds": 10 + fds_step * i,
                   "threads": 4} for name in ("target", "output")}})
    return out


@pytest.mark.parametrize("slope", [0.0, 0.4, 2.5])
def test_the_rss_slope_is_the_least_squares_fit_over_the_samples_after_warm_up(slope):
    out = report(samples(slope), {}, 100_000, 0, 0)             # the warm-up's wild values would tilt it
    assert out["rss_slope_kib_per_1k_tokens"] == pytest.approx(slope, abs=1e-9)
    assert out["actors"]["target"]["rss_slope_kib_per_1k_tokens"] == pytest.approx(slope / 2, abs=1e-9)
    assert out["goals"]["rss_slope_below_1_kib_per_1k_tokens"] == (slope < 1.0)


def test_descriptor_growth_fails_the_no_growth_goal():
    assert report(samples(0.0), {}, 100_000, 0, 0)["goals"]["no_growth_in_fds_threads_segments"]
    assert not report(samples(0.0, fds_step=1), {}, 100_000, 0, 0)["goals"]["no_growth_in_fds_threads_segments"]


def test_the_ppl_ratio_compares_the_last_complete_loop_with_the_first():
    loops = {0: (200.0, 100), 1: (150.0, 100), 2: (165.0, 100), 3: (10.0, 3)}      # loop 3 is partial
    out = report(samples(0.0), loops, 100_000, 0, 0)
    assert out["loops_complete"] == 3
    assert out["ppl_last_over_first"] == pytest.approx(np.exp(1.65) / np.exp(2.0))
    assert not out["goals"]["last_loop_ppl_within_10_percent"]


def test_a_descriptor_open_at_one_sample_is_not_growth_but_a_rising_floor_is():
    """Serving, a connection or a request thread is alive at some samples: the floor of the last quarter against the
    first quarter's, not the largest value against the first, is what a leak moves."""
    spiky = samples(0.0)
    for i, s in enumerate(spiky):
        s["actors"]["output"]["fds"] += 3 * (i % 5 == 2)             # a client connected at every fifth sample
    out = report(spiky, {}, 100_000, 0, 0)
    assert out["actors"]["output"]["fds_growth"] == 0 and out["goals"]["no_growth_in_fds_threads_segments"]
    leaking = samples(0.0)
    for i, s in enumerate(leaking):
        s["actors"]["output"]["threads"] += i // 30                   # one thread more every 30 samples, kept
    assert not report(leaking, {}, 100_000, 0, 0)["goals"]["no_growth_in_fds_threads_segments"]


def test_the_growth_is_attributed_to_the_mappings_that_grew_after_warm_up():
    """Resident memory that grows is named by what backs it: a model file whose pages are touched for the first time
    is told apart from a heap that grows (the warm-up's changes do not count)."""
    rows = samples(0.0)
    for i, s in enumerate(rows):
        for name, a in s["actors"].items():
            a["mapped_kb"] = {"[anon]": 40_000 + (i < 10) * 9_000, "/m/model.onnx.data": 1_000 + 8 * i,
                              "/usr/lib/libc.so.6": 700}
    out = report(rows, {}, 100_000, 0, 0)
    assert out["actors"]["target"]["grown_kib"] == {"/m/model.onnx.data": 8 * (len(rows) - 1 - 10)}
    assert report(samples(0.0), {}, 100_000, 0, 0)["actors"]["target"]["grown_kib"] == {}      # not sampled: none


def test_the_archive_figures_start_when_it_first_filled():
    rows = samples(0.0)
    for i, s in enumerate(rows):
        s["lines"] = 40 * i
        s["disk_bytes"] = min(i, 10) * 100_000 + (i >= 10) * (i - 10) * 2048     # fills at line 400, then leaks
    out = report(rows, {}, 100_000, 0, 0, archive_lines=400)
    assert out["archive_turnovers"] == pytest.approx(40 * 100 / 400)
    assert out["archive_disk_slope_kib_per_1k_tokens"] == pytest.approx(2.0)       # 2 KiB per 1,000-token sample
    assert not out["goals"]["archive_disk_bounded"] and out["goals"]["archive_turned_over_5_times"]
    for s in rows:
        s["disk_bytes"] = min(s["disk_bytes"], 1_000_000)                          # full, then flat
    assert report(rows, {}, 100_000, 0, 0, archive_lines=400)["goals"]["archive_disk_bounded"]


def test_a_short_serving_soak_samples_the_server_and_its_actors_with_questions_and_vanishing_clients(
        default_gguf, default_pool_bytes, tmp_path):
    log = tmp_path / "loop.log"
    log.write_text("".join(f"12:{i // 60:02d}:{i % 60:02d} PIC{i % 7:03d} H PRESSURE HIGH ALM\n" for i in range(60)))
    profile = tmp_path / "small.toml"
    profile.write_text("[cache]\nwindow = 128\n[serve]\nmax_answer_tokens = 8\nbacklog_lines = 4\n")   # a short drain
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "soak", "--serve", "--tokens", "1500", "--every", "250",
                      "--log", str(log), "--config", str(profile), "--ask-every", "0.5", "--leave-every", "0.5",
                      "--archive-lines", "10", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["mode"] == "serve" and out["tokens"] >= 1500 and out["exit_code"] == 0
    assert set(out["actors"]) == {"launcher", "fork_server", "ingest", "cache_owner", "target", "draft", "output"}
    assert out["questions_answered"] >= 1 and out["questions_failed"] == 0 and all(out["clients_left"].values())
    assert out["server_client_disconnects"] >= 1 and out["segments_growth"] == 0
    assert out["archive_turnovers"] >= 5 and out["archive_samples_after_filling"] >= 2
    header = GGUFModel(default_gguf).config
    per_slot = 2 * header.n_layers * header.n_kv_heads * (header.d_model // header.n_heads) * default_pool_bytes
    assert out["kv_pool_bytes"] == per_slot * (out["sink"] + out["ring"] + min(out["ring"], out["window"] + 32))
    plan = out["memory_plan"]                # the plan's recorded overheads, checked against a real run's PSS
    assert 0.75 < plan["plan_over_measured"] < 1.33, plan

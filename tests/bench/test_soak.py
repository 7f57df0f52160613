"""The soak command end to end on a short run: every actor sampled, no segment or descriptor growth, the KV pool
equal to its formula, PPL of complete loops reported. (The million-token run is a command, not a CI test.)"""
from __future__ import annotations

import json
import sys

from tests import procs
from tests.paths import ROOT


def test_a_short_soak_samples_every_actor_and_reports_the_figures(default_gguf, tmp_path):
    log = tmp_path / "loop.log"
    log.write_text("".join(f"12:{i // 60:02d}:{i % 60:02d} PIC{i % 7:03d} H PRESSURE HIGH ALM\n" for i in range(60)))
    profile = tmp_path / "small.toml"
    profile.write_text("[cache]\nwindow = 128\n[replay]\nevery_lines = 40\nmax_new_tokens = 16\n")
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "soak", "--tokens", "4000", "--every", "500",
                      "--log", str(log), "--config", str(profile), "--json", "--plot", str(tmp_path / "m.svg")])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["tokens"] >= 4000 and out["samples"] >= 6 and out["assessments"] >= 2
    assert set(out["actors"]) == {"ingest", "cache_owner", "target", "draft", "output"}
    assert out["segments_growth"] == 0
    assert out["goals"]["kv_pool_matches_formula"] and out["kv_pool_bytes"] > 0
    assert out["loops_complete"] >= 2 and 0.5 < out["ppl_last_over_first"] < 2.0
    assert (tmp_path / "m.svg").read_text().startswith("<svg")

"""`bench --task ingest`'s protocol: every system on every log, who goes first rotating, the JSON contract, the table.
The measurements themselves are real processes (minutes): their figures are in docs/operators.md, "Ingest"."""
from __future__ import annotations

import json

import pytest

from bench import ingest
from models import handle
from pipeline import config


def test_every_system_runs_on_every_log_in_rotating_order_and_the_json_names_them(monkeypatch, tmp_path):
    calls = []

    def fake(name, tokens_per_s):
        def run(log, *args, **kwargs):
            calls.append((log, name))
            return ingest._rates(tokens_per_s * 10, tokens_per_s * 10 / 30, 10.0)
        return run

    monkeypatch.setattr(ingest, "replay_rate", fake("replay", 140))
    monkeypatch.setattr(ingest, "serve_rate", lambda log, profile, seconds, workdir, ask_every_s=0.0: (
        fake("serve_questions" if ask_every_s else "serve", 90 if ask_every_s else 130)(log)))
    monkeypatch.setattr(ingest, "llama_rate", fake("llama", 100))
    monkeypatch.setattr(handle, "_HANDLES", {})                       # a handle of its own, gone after the test
    monkeypatch.setattr(handle, "resolve_gguf", lambda name: tmp_path / "model.gguf")
    report = ingest.run_ingest_bench(config.parse({}), None, ["a.csv", "b.log"], seconds=1.0, repeats=2)
    out = json.loads(json.dumps(report.as_dict()))
    assert set(out) == {"a.csv", "b.log"}
    for log in out.values():
        assert set(log) == {"ringspec_replay", "ringspec_serve", "ringspec_serve_questions", "llama_cpp"}
        assert all(set(r) >= {"tokens_per_s", "lines_per_s"} and r["repeats"] == 2 for r in log.values())
    assert out["a.csv"]["ringspec_replay"]["tokens_per_s"] == 140.0
    firsts = [calls[i][1] for i in range(0, len(calls), 4)]
    assert firsts == ["replay", "serve", "serve_questions", "llama"]        # each turn another system goes first
    assert len(calls) == 16
    text = report.text()
    assert "1.40" in text and "1.30" in text                               # each system over llama.cpp


def test_a_profile_with_its_own_replay_section_is_refused(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("[replay]\nevery_lines = 5\n")
    with pytest.raises(ValueError, match=r"leave out \[replay\]"):
        ingest._profile(str(profile), str(tmp_path), "default")


def test_the_benchs_model_reaches_the_profile_its_actors_run(tmp_path):
    path = ingest._profile(None, str(tmp_path), "qwen2.5-coder-0.5b")
    assert config.load(path).model.gguf == "qwen2.5-coder-0.5b"
    named = tmp_path / "named.toml"
    named.write_text('[model]\ngguf = "default"\n')
    assert config.load(ingest._profile(str(named), str(tmp_path), "default")).model.gguf == "default"
    with pytest.raises(ValueError, match=r"set the model there"):
        ingest._profile(str(named), str(tmp_path), "qwen2.5-coder-0.5b")

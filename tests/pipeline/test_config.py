"""Profiles are validated once, with messages that name the file, the key and what was expected."""
from __future__ import annotations

import pytest

from pipeline import config
from pipeline.config import ConfigError


def test_default_profile_loads_and_sizes_the_ring_for_the_largest_block():
    cfg = config.load()
    assert cfg.draft.kind in ("none", "suffix", "model", "hybrid")
    assert config.ring_spec(cfg).ring >= cfg.cache.window + cfg.model.max_rows


@pytest.mark.parametrize("text, words", [
    ("[cache]\nwindow = 0\n", ["cache.window", ">= 1"]),
    ("[cache]\nwindw = 10\n", ["unknown key cache.windw", "window"]),
    ("[cahce]\n", ["unknown section [cahce]"]),
    ("[model]\nthreads = \"two\"\n", ["model.threads must be int", "'two'"]),
    ("[draft]\nkind = \"eagle\"\n", ["draft.kind", "'eagle'", "suffix"]),
    ("[draft]\nkind = \"model\"\nmodel = \"\"\n", ["needs model ="]),
    ("[sampling]\ntop_p = 1.5\n", ["top_p must be in (0, 1]"]),
    ("[draft]\nmin_confidence = 1.0\n", ["draft.min_confidence", "[0, 1)"]),
    ("[model]\nthreads = true\n", ["model.threads must be int"]),
    ("[cache\nwindow = 3\n", ["not valid TOML"]),
    ("[replay]\ntrigger_pattern = \"(HH\"\n", ["replay.trigger_pattern", "not a valid regular expression"]),
    ("[actors]\nlauncher = \"k8s\"\n", ["actors.launcher", "'k8s'", "ray"]),
    ("[replay]\nidle_s = -1\n", ["replay.idle_s", ">= 0"]),
    ("[model]\npass_streams = 0\n", ["model.pass_streams", ">= 1"]),
    ("[model]\npass_streams = 33\n", ["model.pass_streams", "<= 32"]),
    ("[draft]\nbackend = \"cuda\"\n", ["draft.backend", "'cuda'", "rknn"]),
    ("[draft]\nkind = \"suffix\"\nbackend = \"rknn\"\n", ["draft.backend", "needs kind"]),
    ("[draft]\nkind = \"model\"\nbackend = \"rknn\"\n", ["needs a board with an NPU", "[board] npu"]),
    ("[board]\nnpu = \"hailo\"\n", ["board.npu", "'hailo'"]),
    ("[board]\ncpus = \"0-3\"\nbig_cpus = \"2-5\"\n", ["board.big_cpus", "outside board.cpus"]),
    ("[board]\ncpus = \"0-1\"\n[actors]\ningest_cpus = \"2\"\n", ["actors.ingest_cpus", "board", "[2]"]),
    ("[board]\nbig_cpus = \"1\"\n[actors]\ntarget_cpus = \"0-1\"\n", ["target_cpus", "[0]", "big cores"]),
    ("[[streams]]\nname = \"DCS list\"\nlog = \"a.csv\"\n", ["streams[0].name", "'DCS list'", "lower-case"]),
    ("[[streams]]\nname = \"a\"\nlog = \"a.csv\"\n[[streams]]\nname = \"a\"\nlog = \"b.csv\"\n",
     ["streams[1].name = 'a'", "already"]),
    ("[[streams]]\nname = \"plc\"\n", ["streams[0] (plc) needs log"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nwindow = 3\n", ["streams[0] (plc): unknown key window"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nevery_lines = 0\n", ["streams[0] (plc)", "every_lines"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nnode = \"Gateway 2\"\n",
     ["streams[0].node = 'Gateway 2'", "ringspec-node"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nnode = 2\n", ["streams[0].node = 2"]),
])
def test_bad_profiles_are_refused_with_a_precise_message(tmp_path, text, words):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    for word in words:
        assert word in str(err.value)
    assert str(path) in str(err.value)


def test_missing_profile_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(tmp_path / "absent.toml")


def test_integers_are_accepted_where_floats_are_expected(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[sampling]\ntemperature = 1\n")
    assert config.load(path).sampling.temperature == 1.0


@pytest.mark.parametrize("value, words", [("0-x", "not a CPU list"), ("4096", "does not offer")])
def test_actor_cpu_sets_are_validated(tmp_path, value, words):
    path = tmp_path / "p.toml"
    path.write_text(f'[actors]\nowner_cpus = "{value}"\n')
    with pytest.raises(ConfigError, match=words):
        config.load(path)


def test_cpu_set_syntax():
    assert config.cpu_set("0-2,5") == {0, 1, 2, 5} and config.cpu_set("") == set()


def test_a_boards_profile_names_the_way_to_run_it_on_another_machine_and_that_way_unpins_every_actor(monkeypatch):
    """configs/rk3588.toml pins to eight cores: here it is refused with the hint, RINGSPEC_UNPIN=1 runs it
    unpinned, and `plan` (here=False) reads it as the board's without either."""
    import os
    profile = config.ROOT / "configs" / "rk3588.toml"
    missing = set(range(8)) - os.sched_getaffinity(0)
    if missing:
        with pytest.raises(ConfigError, match="RINGSPEC_UNPIN=1 runs it here unpinned"):
            config.load(profile)
    board = config.load(profile, here=False)
    assert board.actors.target_cpus == "4-7" and board.board.big_cpus == "4-7" and board.draft.backend == "rknn"
    monkeypatch.setenv("RINGSPEC_UNPIN", "1")
    unpinned = config.load(profile)
    assert all(getattr(unpinned.actors, key) == "" for key in config.ACTOR_CPUS)

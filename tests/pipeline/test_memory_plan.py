"""The memory plan: its terms are what the pipeline allocates, it refuses a board it does not fit (and so does the
engine, before any actor starts), and it names the profile key to change."""
from __future__ import annotations

import json
import sys

import pytest

from models.convert import linears
from models.npu_runner import buckets
from models.platform import core_kinds
from models.runner import Runner, RunnerOptions
from pipeline import config
from pipeline.launch import memory
from pipeline.config import ConfigError
from pipeline.stream.frame import replay_frame
from tests import procs
from tests.paths import ROOT

# /proc/cpuinfo of an RK3588 (Linux 5.10, Rockchip's BSP): cpu0-3 Cortex-A55 (part 0xd05), cpu4-7 Cortex-A76 (0xd0b)
RK3588_CPUINFO = "".join(f"processor\t: {cpu}\nBogoMIPS\t: 48.00\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
                         f"CPU variant\t: {'0x2' if cpu < 4 else '0x4'}\nCPU part\t: {'0xd05' if cpu < 4 else '0xd0b'}"
                         f"\nCPU revision\t: 0\n\n" for cpu in range(8))


def _profile(tmp_path, text: str):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("kernel", ["native", "nbits"])
def test_the_target_pool_in_the_plan_is_the_pool_the_runner_allocates(default_gguf, kernel):
    cfg = config.override(config.load(), {"serve.enabled": True, "model.kernel": kernel})
    spec = replay_frame(cfg).spec
    runner = Runner(cfg.target.dir, spec, RunnerOptions(threads=1, kernel=kernel))
    terms = {(t.process, t.what): t.bytes for t in memory.plan(cfg).terms}
    assert terms[("target", "kv pool")] == runner.pool_bytes
    if kernel == "nbits":
        assert terms[("target", "weights")] == (cfg.target.dir / "weights.bin").stat().st_size


def test_every_process_of_the_pipeline_is_in_the_plan_with_the_channels_it_creates(default_gguf):
    cfg = config.override(config.load(), {"serve.enabled": True})
    out = memory.plan(cfg).as_dict()
    assert set(out["processes"]) == {"launcher", "fork_server", "ingest", "cache_owner", "target", "draft", "output"}
    where = {t["what"]: t["process"] for t in out["terms"] if t["what"].startswith("channel")}
    assert where == {"channel lines": "cache_owner", "channel events": "output", "channel asks": "cache_owner",
                     "channel to_target": "target", "channel from_target": "cache_owner",
                     "channel to_draft": "draft", "channel from_draft": "cache_owner"}
    serial = memory.plan(config.override(config.load(), {"actors.launcher": "serial"})).as_dict()
    assert set(serial["processes"]) == {"launcher"}, "serial: the models live in the launcher's process"


def test_streams_sharing_a_target_add_a_pool_each_and_each_node_is_planned_alone(default_gguf, tmp_path):
    """Three streams on one target: three pools in it, three sets of channels, one process of each role. On two
    nodes, each node is a board with its own target: planned one node at a time (`--node`), with only its
    streams."""
    one = memory.plan(config.load()).as_dict()
    pool = next(t["bytes"] for t in one["terms"] if t["process"] == "target" and t["what"] == "kv pool")
    streams = "".join(f'[[streams]]\nname = "s{i}"\nlog = "x{i}.log"\nnode = "{node}"\n'
                      for i, node in enumerate("aba"))
    on_one = memory.plan(config.load(_profile(tmp_path, streams.replace('node = "b"', 'node = "a"')))).as_dict()
    assert [t["bytes"] for t in on_one["terms"] if t["what"] == "kv pool x 3 streams"] == [3 * pool]
    assert set(on_one["processes"]) == set(one["processes"])          # one process of each role serves them all
    assert {(t["process"], t["bytes"]) for t in on_one["terms"] if t["what"] == "stream state x 2 added"} == {
        (process, 2 * mib << 20) for process, mib in memory.STREAM_MIB.items()}
    assert {t["what"] for t in on_one["terms"] if t["process"] == "cache_owner" and "channel" in t["what"]} == {
        f"channel {ch} s{i}" for ch in ("lines", "from_target", "from_draft") for i in range(3)}
    slots = [t for t in on_one["terms"] if t["what"].startswith("graph slots")]     # model.pass_streams: 2
    assert [(t["process"], t["what"]) for t in slots] == [("target", "graph slots x 1 added")]
    wide = memory.plan(config.override(config.load(_profile(tmp_path, streams.replace('node = "b"', 'node = "a"'))),
                                       {"model.pass_streams": 3})).as_dict()
    assert [t["bytes"] for t in wide["terms"] if t["what"] == "graph slots x 2 added"] == [2 * slots[0]["bytes"]]
    lone = [t for t in on_one["terms"] if t["what"] == "single-stream graph"]       # model.lone_graph (default)
    assert [t["process"] for t in lone] == ["target"] and lone[0]["bytes"] >= memory.NATIVE_SESSION_MIB * memory.MiB
    assert "single-stream graph" not in {t["what"] for t in one["terms"]}        # one stream: the one graph
    two = config.load(_profile(tmp_path, streams))
    with pytest.raises(ConfigError, match="2 nodes .* --node NAME"):
        memory.plan(two)
    a = memory.plan(two, node="a").as_dict()
    assert [t["bytes"] for t in a["terms"] if t["what"].startswith("kv pool")] == [2 * pool]
    assert {t["what"].split()[-1] for t in a["terms"] if t["what"].startswith("channel")} == {"s0", "s2"}
    # the local launcher runs both nodes' groups here: their plans together, the launcher and its fork server once
    b = memory.plan(two, node="b")
    here = memory.host_plan(two, ["a", "b"])
    once = sum(t.bytes for t in b.terms if t.process in ("launcher", "fork_server") and t.what == "process")
    assert here.total == a["total_bytes"] + b.total - once
    assert {"target@a", "target@b", "launcher", "fork_server"} <= {t.process for t in here.terms}
    room = (max(a["total_bytes"], b.total) >> 20) + 50                  # each node fits alone, not both on one host
    small = config.override(two, {"board.ram_mb": room, "board.reserve_mb": 0})
    for node in "ab":
        memory.check(small, node)
    with pytest.raises(ConfigError, match="every node's streams run on this machine .* --launcher ray"):
        memory.check_host(small, ["a", "b"])
    for i in range(3):
        (tmp_path / f"x{i}.log").write_text("a line\n")
    tight = _profile(tmp_path, streams.replace('log = "x', f'log = "{tmp_path}/x') +
                     f"[board]\nram_mb = {room}\nreserve_mb = 0\n")
    started = procs.run([sys.executable, str(ROOT / "run.py"), "replay", "--config", str(tight), "--max-lines", "3"])
    assert started.returncode == 2 and "every node's streams run on this machine" in started.stderr, started.stderr


def test_plan_refuses_a_board_it_does_not_fit_naming_the_key_and_the_engine_refuses_it_before_starting(
        default_gguf, tmp_path):
    path = _profile(tmp_path, '[board]\nname = "tiny"\nram_mb = 400\nreserve_mb = 0\n')
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "plan", "--config", str(path), "--json"])
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and not out["fits"]
    assert out["total_bytes"] > 400 << 20
    assert "change model.gguf first" in out["refusal"] and "400.0 MiB of RAM" in out["refusal"]
    started = procs.run([sys.executable, str(ROOT / "run.py"), "replay", "--config", str(path), "--max-lines", "3"])
    assert started.returncode == 2, started.stderr
    assert "change model.gguf first" in started.stderr and "run.py plan --config" in started.stderr
    assert "rs:" not in started.stdout and "assessment" not in started.stdout
    fits = procs.run([sys.executable, str(ROOT / "run.py"), "plan", "--config", str(path), "--ram", "2G"])
    assert fits.returncode == 0 and fits.stdout.rstrip().endswith("fits"), fits.stdout


def test_a_draft_over_the_npus_domain_is_refused_naming_the_draft(default_gguf):
    cfg = config.load(ROOT / "configs" / "rk3588.toml", {"board.npu_domain_mb": 1}, here=False)
    plan = memory.plan(cfg)
    assert plan.npu_total > 1 << 20 and all(t.process == "draft" for t in plan.terms if t.npu)
    assert "IOMMU domain" in plan.refusal and "change draft.model first" in plan.refusal
    assert not memory.plan(config.load(ROOT / "configs" / "rk3588.toml", here=False)).refusal


def test_one_npu_draft_serves_a_nodes_streams_its_graphs_once_and_a_pool_each(default_gguf, tmp_path):
    """The board's profile (a draft model on the NPU) with three streams: one draft process, its .rknn graphs once,
    a host pool and pass buffers per stream."""
    board = (ROOT / "configs" / "rk3588.toml").read_text()
    one = memory.plan(config.load(ROOT / "configs" / "rk3588.toml", here=False))
    three = memory.plan(config.load(_profile(tmp_path, board + "".join(
        f'[[streams]]\nname = "s{i}"\nlog = "x{i}.log"\n' for i in range(3))), here=False))
    draft = lambda plan: {t.what: t.bytes for t in plan.terms if t.process == "draft"}   # noqa: E731
    alone, shared = draft(one), draft(three)
    assert shared["weights (.rknn)"] == alone["weights (.rknn)"] and shared["process"] == alone["process"]
    assert shared["kv pool (host) x 3 streams"] == 3 * alone["kv pool (host)"]
    assert shared["pass buffers x 3 streams"] == 3 * alone["pass buffers"]
    assert [p for p in three.as_dict()["processes"] if p.startswith("draft")] == ["draft"]


def test_an_int8_npu_draft_holds_one_model_for_every_pass_a_byte_a_linear_weight(default_gguf, monkeypatch, tmp_path):
    """float16: a .rknn per row bucket, each the portable graph's weights at two bytes; int8: one .rknn (the largest
    bucket), its linears at a byte a weight and a quantized embedding table at two; the pools go in once a model.
    Estimates while no .rknn exists; a written one is measured."""
    board = config.load(ROOT / "configs" / "rk3588.toml", here=False)
    draft = lambda plan: {t.what: t.bytes for t in plan.terms if t.process == "draft" and t.npu}   # noqa: E731
    card = board.draft_model.card
    monkeypatch.setattr(memory, "rknn_path", lambda *a: tmp_path / "absent.rknn")
    f16 = draft(memory.plan(board))
    i8 = draft(memory.plan(config.load(ROOT / "configs" / "rk3588.toml", {"draft.npu_dtype": "int8"}, here=False)))
    linear = sum(x["N"] * x["K"] for x in linears(card))
    table = card["embed"]["table"]["N"] * card["embed"]["table"]["K"] if card["embed"]["kind"] != "dense" else 0
    rows = len(buckets(board.model.max_rows))
    assert f16["weights (.rknn)"] == rows * 2 * (linear + table)
    assert i8["weights (.rknn)"] == linear + 2 * table
    assert i8["kv pool inputs"] * rows == f16["kv pool inputs"]
    written = tmp_path / "written.rknn"
    written.write_bytes(b"\0" * 12345)
    monkeypatch.setattr(memory, "rknn_path", lambda *a: written)
    measured = config.load(ROOT / "configs" / "rk3588.toml", {"draft.npu_dtype": "int8"}, here=False)
    assert draft(memory.plan(measured))["weights (.rknn)"] == 12345


def test_the_boards_big_cores_are_checked_against_what_the_kernel_says_they_are():
    kinds = core_kinds(RK3588_CPUINFO)
    assert kinds == {**{c: "cortex-a55" for c in range(4)}, **{c: "cortex-a76" for c in range(4, 8)}}
    board = config.load(ROOT / "configs" / "rk3588.toml", here=False)
    memory.check_cores(board, kinds)
    swapped = config.load(ROOT / "configs" / "rk3588.toml", {"board.big_cpus": "0-7", "actors.target_cpus": "0-3"},
                          here=False)
    with pytest.raises(ConfigError, match="cpu0 is cortex-a55"):
        memory.check_cores(swapped, kinds)
    memory.check_cores(swapped, {})                  # x86 and qemu-user list no parts: nothing to check


@pytest.mark.parametrize("text, size", [("4G", 4 << 30), ("2GiB", 2 << 30), ("512M", 512 << 20), ("1.5 GB", 3 << 29),
                                        ("4096", 4 << 30)])
def test_ram_sizes_read_as_binary_units(text, size):
    assert memory.parse_size(text) == size


def test_a_ram_size_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="expected a size like 4G"):
        memory.parse_size("lots")


def test_the_native_pass_is_planned_as_its_gguf_mapped_and_a_session_of_its_own(default_gguf):
    """kernel = "native": the weights term is the GGUF (read in place, no packed copy) and its norms and biases, the
    session term the native pass's measured one, for the target and for a draft that takes its kernel."""
    cfg = config.override(config.load(), {"model.kernel": "native"})
    terms = {(t.process, t.what): t.bytes for t in memory.plan(cfg).terms}
    gguf = cfg.target.gguf.stat().st_size
    assert gguf < terms[("target", "weights (the GGUF, mapped)")] < gguf + (1 << 20)
    assert terms[("target", "session")] == memory.NATIVE_SESSION_MIB * memory.MiB
    nbits = {(t.process, t.what): t.bytes for t in memory.plan(config.override(config.load(),
                                                                              {"model.kernel": "nbits"})).terms}
    assert sum(terms.values()) < sum(nbits.values())

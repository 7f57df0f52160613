"""Exact on every CPU (docs/design.md, "Greedy identity"): no operator ever sees a single row, the start-up probe
catches a row that depends on its pass's size, and that verdict reaches `doctor`, the journal, /metrics and the bench;
model files are built once however many processes ask at the same time."""
from __future__ import annotations

import dataclasses
import http.client
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from queue import Empty

import numpy as np
import pytest

from bench.chaos import free_port
from kernels import qmatmul
from kernels.ring import RingSpec
from models.graph import PLANT_ENV
from models.runner import Runner, RunnerOptions
from pipeline.decode.engine import Engine
from pipeline.decode.exactness import check
from pipeline.watch import wait_for
from tests import procs
from tests.paths import ROOT
from tests.tiny_gguf import converted_tiny

LOG = ROOT / "data" / "tep_demo.csv"
SPEC = RingSpec(sink=4, window=32, ring=48)
FAULT = "1e-3"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return converted_tiny(tmp_path_factory.mktemp("exactness"), weight_type="Q4_1", tied=False, seed=3)


# -- the rule --------------------------------------------------------------------------------------------------------

def test_no_pass_ever_binds_a_single_row_or_a_single_logit_row(tiny, monkeypatch):
    """Structural, so it holds on a CPU where one row happens to be computed like many: prefill chunks, target-only
    decoding, a chain, a tree, the probe itself."""
    bound: list[tuple[str, tuple]] = []
    real = Runner._bind_in
    monkeypatch.setattr(Runner, "_bind_in", lambda self, name, a: (bound.append((name, a.shape)),
                                                                    real(self, name, a))[1])
    for trees in (False, True):
        runner = Runner(tiny, SPEC, RunnerOptions(threads=1, max_rows=16, kernel="nbits", trees=trees))
        check(runner)
        engine = Engine(runner, None)
        engine.feed(np.arange(3, 40))                                 # chunks of 16, 16 and 5 rows
        engine.generate(np.array([5]), 6)                             # 1-row decode passes, padded
    rows = [shape[0] for name, shape in bound if name in ("input_ids", "logit_rows")]
    assert len(rows) > 40 and min(rows) >= 2


def test_a_row_is_the_same_bits_alone_and_in_any_block_and_tree(tiny):
    for trees in (False, True):
        runner = Runner(tiny, SPEC, RunnerOptions(threads=1, max_rows=16, kernel="nbits", trees=trees))
        quick, thorough = check(runner), check(runner, thorough=True)
        assert quick.invariant and thorough.invariant, quick.where + thorough.where
        assert quick.rows_compared == 10 + 4 * trees and thorough.rows_compared == 2 * (13 + 4 * trees)
        assert quick.trees == thorough.trees == trees


def test_the_probe_catches_a_planted_row_count_fault(tiny, monkeypatch):
    monkeypatch.setenv(PLANT_ENV, FAULT)                 # every row moves by 1e-3 x (rows in its pass)
    verdict = check(Runner(tiny, SPEC, RunnerOptions(threads=1, max_rows=16, kernel="nbits")))
    assert not verdict.invariant and verdict.max_abs_logit > 0
    assert "alone vs row 0 of a 3-row block" in verdict.where     # 1 row padded to 2 equals the 2-row block
    assert "NOT batch invariant" in verdict.line()


def test_the_probe_also_looks_at_attention_over_the_whole_pool_which_a_short_context_does_not_show(tiny,
                                                                                                   monkeypatch):
    """Found on an AVX-512 EPYC at 4 threads: the values product over 600+ columns gives a row other bits among 24
    rows than alone, while every pass at a short context is invariant. The probe runs the products at the pool's full
    width; a family that does not hold there makes the verdict."""
    from models.opcheck import Family
    from pipeline.decode import exactness
    widths = []
    real = exactness.pool_attention
    monkeypatch.setattr(exactness, "pool_attention", lambda card, threads, pool: (widths.append(pool),
                                                                                   real(card, threads, pool))[1])
    runner = Runner(tiny, SPEC, RunnerOptions(threads=1, max_rows=16, kernel="nbits"))
    assert check(runner).invariant and widths == [SPEC.pool_slots]
    monkeypatch.setattr(exactness, "pool_attention", lambda card, threads, pool: Family(
        "Attention products against the whole pool", "", "rows", (1, 24), 4e-5))
    verdict = check(runner)
    assert not verdict.invariant and verdict.max_abs_logit == 4e-5
    assert f"attention over {SPEC.pool_slots} pool columns: a row among [24] rows" in verdict.where


def test_the_probe_leaves_the_runner_as_it_found_it(tiny):
    runner = Runner(tiny, SPEC, RunnerOptions(threads=1, max_rows=16, kernel="nbits"))
    check(runner)
    assert runner.forward_calls == 0 and not runner.ring_k.any() and not runner.sink_v.any()


def test_a_differing_family_fails_the_verdict_unless_the_graph_keeps_it_from_rows():
    """The Softmax with masked columns appended differs on ARM (an emulated Cortex-A76) and on SSE-only x86; the
    graph pads every softmax to one width, so that family is information, while any other differing family fails."""
    from models.opcheck import SOFTMAX_APPENDED, Family
    differs = Family(SOFTMAX_APPENDED, "", "masked columns", (1, 2, 9), 3e-8)
    assert not differs.holds
    assert dataclasses.replace(differs, needed=False).holds
    assert Family("MatMulNBits", "", "rows", (1,), 1e-6).holds            # one row: the padding rule's case
    assert not Family("MatMulNBits", "", "rows", (1, 3), 1e-6).holds


# -- the verdict reaches every report (real model, real processes) --------------------------------------------------

def run_py(*args, env=None) -> subprocess.CompletedProcess:
    return procs.run([sys.executable, str(ROOT / "run.py"), *args], env=env)


def test_doctor_passes_here_and_names_the_platform_and_every_operator_family(default_gguf):
    proc = run_py("doctor", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    assert rep["exact"] and rep["passes"]["chain"]["invariant"] and rep["passes"]["tree"]["invariant"]
    assert rep["platform"]["onnxruntime"] and rep["platform"]["isa"] and rep["platform"]["cpu"]
    families = {op["family"].split(" (")[0] for op in rep["operators"]}
    assert {"MatMulNBits", "MatMul", "ReduceSum", "RMSNorm", "RotaryEmbedding", "SwiGLU", "Attention products",
            "Softmax", "Attention scores, keys appended", "Softmax, masked columns appended",
            "Attention values, zero-weight terms appended", "Attention products against the whole pool"} <= families
    assert all(op["holds"] for op in rep["operators"])          # what the padding rule and the block layout rely on
    if qmatmul.available():                                      # the native pass's two kernels, every path
        assert {"native matmul, every path against the scalar reference",
                "native attention, every path against the scalar reference"} <= families
    assert [op["needed"] for op in rep["operators"] if op["family"] == "Softmax, masked columns appended"] == [False]


@pytest.fixture(scope="module")
def planted():
    return {**os.environ, PLANT_ENV: FAULT}


def test_a_planted_fault_fails_doctor_and_names_the_pass(default_gguf, planted):
    proc = run_py("doctor", env=planted)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the engine's pass: the native one (no padding: 1 row vs 2) or, without the kernel, the graph's (padded: 2 vs 3)
    assert re.search(r"chain graph, [a-z ,]+ \(the engine\) +NOT invariant: position 5 alone vs row 0 of a [23]-row "
                     r"block", proc.stdout), proc.stdout[-3000:]
    assert "NOT exact on this CPU" in proc.stdout


def test_a_planted_fault_reaches_the_journal_metrics_and_healthz(default_gguf, planted, tmp_path):
    port, journal = free_port(), tmp_path / "journal.jsonl"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "serve", str(LOG), "--max-lines", "3",
                             "--http", f"127.0.0.1:{port}", "--zmq", "", "--pub", "", "--quiet-lines",
                             "--archive", str(tmp_path / "archive.sqlite"), "--journal", str(journal)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=planted)
    try:
        health = {}

        def verdict_served() -> bool:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/healthz")
                health.update(json.loads(conn.getresponse().read()))
            except OSError:
                pass
            return health.get("batch_invariant") is not None
        wait_for(verdict_served, "the server's start-up verdict", pids=[proc.pid])
        assert health["batch_invariant"] is False
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        assert "\nringspec_batch_invariant 0\n" in metrics
        assert 'ringspec_platform_info{onnxruntime="' in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = procs.finish(proc, "the server draining")
    first = json.loads(journal.read_text().splitlines()[0])
    assert first["kind"] == "start" and first["exactness"]["invariant"] is False
    assert re.search(r"alone vs row 0 of a [23]-row block", first["exactness"]["where"])     # native: 2; graph: 3
    assert first["platform"]["onnxruntime"]
    assert "ringspec: warning: target on" in err and "NOT batch invariant" in err


def test_a_planted_fault_makes_the_bench_report_instead_of_fail(default_gguf, planted):
    proc = run_py("bench", "--task", "log", "--offsets", "1", "--repeats", "1", "--systems", "suffix_serial",
                  "--draft-model", "none", "--no-llama-cpp", "--json", env=planted)
    assert proc.returncode == 0, proc.stderr[-3000:]        # not exit 3: a CPU (here: a planted fault), not a bug
    out = json.loads(proc.stdout)
    assert out["_meta"]["exactness"]["target_only"]["invariant"] is False
    assert out["log"]["suffix_serial"]["exact_here"] is False
    assert out["_meta"]["platform"]["onnxruntime"]


# -- model files are built once, whoever asks ----------------------------------------------------------------------

def _first_logits(home: str, log: str, barrier, queue) -> None:
    """One process asking for the default model in `home` at the same moment as three others: its first logits."""
    os.environ["RINGSPEC_HOME"] = home
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)                                          # what it says (fetching, converting) goes to `log`
    from models.registry import converted_dir, default_model_path
    barrier.wait()
    runner = Runner(converted_dir(default_model_path(), progress=True), RingSpec(4, 64, 96),
                    RunnerOptions(threads=1, max_rows=8, kernel="nbits"))
    queue.put(Engine(runner, None).feed(np.array([504, 966, 314, 253, 1398])))


def test_four_processes_on_an_empty_cache_fetch_convert_and_build_once_and_agree(default_gguf, tmp_path):
    home = tmp_path / "home"
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_first_logits, args=(str(home), str(tmp_path / f"{i}.err"), barrier, queue))
             for i in range(4)]
    for p in procs:
        p.start()
    results = []

    def all_done() -> bool:
        try:
            results.append(queue.get(timeout=0.5))
        except Empty:
            failed = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            assert not failed, (tmp_path / f"{failed[0]}.err").read_text()[-2000:]
        return len(results) == len(procs)
    wait_for(all_done, "four processes converting one model", pids=[os.getpid()], cpu_budget_s=900,
             progress=lambda: (len(results), sum(f.stat().st_size for f in tmp_path.glob("*.err"))))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(np.array_equal(r, results[0]) for r in results[1:])
    said = [(tmp_path / f"{i}.err").read_text() for i in range(4)]
    assert sum("fetching the default model" in s for s in said) == 1, said      # one fetch
    assert sum("converting " in s for s in said) == 1, said                      # one conversion
    assert [d.name for d in (home / "converted").iterdir() if d.is_dir()] == [f"{default_gguf.stem}-b179c9523d0e"]
    assert not list(home.rglob("*.part"))


def test_a_conversion_killed_half_way_is_redone_not_mistaken_for_finished(default_gguf, tmp_path):
    import shutil
    (tmp_path / "models").mkdir()
    shutil.copy(default_gguf, tmp_path / "models" / Path(default_gguf).name)
    env = {**os.environ, "RINGSPEC_HOME": str(tmp_path)}
    code = "from models.registry import converted_dir, default_model_path; converted_dir(default_model_path())"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    out = tmp_path / "converted" / f"{Path(default_gguf).stem}-b179c9523d0e"
    wait_for(lambda: (out / "weights.bin.part").exists(), "the conversion writing weights.bin.part", pids=[proc.pid],
             poll_s=0.005)
    proc.kill()
    proc.wait()
    from models.registry import _intact
    assert not _intact(out) and not (out / "card.json").exists()
    redo = procs.run([sys.executable, "-c", code + "; print('ok')"], cwd=ROOT, env=env)
    assert redo.returncode == 0 and "ok" in redo.stdout, redo.stderr[-2000:]
    assert _intact(out) and not (out / "weights.bin.part").exists()

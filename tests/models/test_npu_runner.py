"""The fixed-shape runner (what the NPU runs) behaves as the ONNX Runtime runner through a draft, across ring wraps
and row buckets; the NPU has one owner per host; the NPU backend without its runtime fails clearly and lets go."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.npu import NpuBusy, NpuLock
from models.npu_runner import StaticRunner, buckets
from models.runner import Runner, RunnerOptions
from pipeline.decode.drafts.model import ModelDraft
from tests.paths import ROOT
from tests.tiny_gguf import converted_tiny

SPEC = RingSpec(sink=4, window=24, ring=24 + 16)       # wraps several times over the text below


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    return converted_tiny(tmp_path_factory.mktemp("npu"), request.param, weight_type="Q8_0", tied=True, seed=5)


def _drive(runner, text: np.ndarray):
    """A draft over `text` as the draft actor drives it: committed chunks, then one guess per position."""
    draft = ModelDraft(runner, SamplingParams())
    draft.observe(text[:40])                              # a 16-row, 16-row and 8-row catch-up on the first guess
    guesses, rows = [], []
    for t in text[40:]:
        guesses.append(draft.guess([int(t)]))
        rows.append(draft._row.copy())
        draft.observe([int(t)])
    return np.array(guesses), np.array(rows)


def test_the_fixed_shape_runner_guesses_what_the_runtime_runner_guesses_across_ring_wraps(tiny):
    opts = RunnerOptions(threads=1, max_rows=16, accuracy_level=0, batch_invariant=False, kernel="nbits")  # graphs
    text = np.random.default_rng(0).integers(3, 200, 160)
    want = _drive(Runner(tiny, SPEC, opts), text)
    static = StaticRunner(tiny, SPEC, opts, backend="ort")
    got = _drive(static, text)
    assert (got[0] == want[0]).all()
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-3 * np.abs(want[1]).max())
    assert buckets(16) == (1, 4, 16) and set(static.session) == {1, 4, 16}


def test_streams_drafting_on_one_set_of_graphs_guess_as_on_graphs_of_their_own_and_the_npu_is_opened_once(
        tiny, tmp_path, monkeypatch):
    """A node's draft actor serves every stream on one set of graphs (one NPU context): three streams' runners share
    the first's graphs, each with its own pools, and guess what each guesses alone on graphs of its own, their
    passes interleaved. On the NPU only the first takes the host's lock (ONNX Runtime stands in for its runtime
    here); a runner opening graphs of its own beside them is refused."""
    import models.npu_runner as npu_runner
    opts = RunnerOptions(threads=1, max_rows=16, accuracy_level=0, batch_invariant=False)
    texts = [np.random.default_rng(seed).integers(3, 200, 120) for seed in (1, 2, 3)]
    alone = [_drive(StaticRunner(tiny, SPEC, opts, backend="ort"), text) for text in texts]
    monkeypatch.setenv("RINGSPEC_NPU_LOCK", str(tmp_path / "npu.lock"))
    monkeypatch.setattr(npu_runner, "_rknn_bucket", lambda runner: npu_runner._ort_bucket)
    first = StaticRunner(tiny, SPEC, opts, backend="rknn")
    runners = [first] + [StaticRunner(tiny, SPEC, opts, backend="rknn", shares=first) for _ in texts[1:]]
    assert all(r.session is first.session and r.ring_k is not first.ring_k for r in runners[1:])
    with pytest.raises(NpuBusy):
        StaticRunner(tiny, SPEC, opts, backend="rknn")
    drafts = [ModelDraft(r, SamplingParams()) for r in runners]
    for draft, text in zip(drafts, texts):
        draft.observe(text[:40])
    got = [[] for _ in texts]
    for i in range(40, 120):                              # one guess of each stream in turn
        for draft, text, out in zip(drafts, texts, got):
            out.append(draft.guess([int(text[i])]))
            draft.observe([int(text[i])])
    for n, (want, guesses) in enumerate(zip(alone, got)):
        assert list(want[0]) == guesses, f"stream {n}"


def test_one_process_holds_the_npu_and_a_dead_holder_lets_go(tmp_path, monkeypatch):
    lock = tmp_path / "npu.lock"
    monkeypatch.setenv("RINGSPEC_NPU_LOCK", str(lock))
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from models.npu import NpuLock; "
                               "NpuLock().acquire('the other draft'); print('held', flush=True); sys.stdin.read()"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(NpuBusy, match=f"held by pid {holder.pid} \\(the other draft"):
            NpuLock().acquire("this draft")
    finally:
        holder.kill()                                     # as a crash would: no release, the kernel lets go
        holder.wait()
    with NpuLock() as mine:
        mine.acquire("this draft")


def test_the_npu_backend_without_its_runtime_says_what_to_install_and_lets_the_npu_go(tiny, tmp_path,
                                                                                     monkeypatch):
    pytest.importorskip("onnxruntime")
    for name in ("rknnlite", "rknnlite.api", "rknn", "rknn.api"):    # neither runtime, wherever this runs
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setenv("RINGSPEC_NPU_LOCK", str(tmp_path / "npu.lock"))
    with pytest.raises(RuntimeError, match="build-rknn-env.sh"):
        StaticRunner(tiny, SPEC, RunnerOptions(threads=1, max_rows=4), backend="rknn")
    with NpuLock() as after:
        after.acquire("the next one")

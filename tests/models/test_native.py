"""The native pass (`[model] kernel = "native"`, models/native.py) on tiny models: the model's function against the
float64 reference, and every exactness property the whole-model graph has, through the same runner and engines.

References: tests/reference_model.py (float64 numpy, weights dequantized by gguf-py, no code shared with the engine)
for the function; the runner's own outputs alone vs in other passes for exactness (pipeline/decode/exactness.py, the
several-stream replay of tests/models/test_streams.py).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from kernels import qmatmul
from kernels.ring import RingSpec
from models.graph import PLANT_ENV
from models.native import NativeUnavailable, unreadable
from models.runner import Runner, RunnerOptions
from models.streams import Streams
from pipeline import config
from pipeline.decode.assemble import make_engine
from pipeline.decode.exactness import check
from tests.models.test_streams import SPEC, decode_alone, replay_together, texts
from tests.reference_model import ReferenceModel
from tests.tiny_gguf import converted_tiny

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason=qmatmul.MISSING or "built")
NATIVE = RunnerOptions(threads=2, max_rows=16, kernel="native")
# (arch, weight type or llama.cpp mix, width): every type the kernel reads, in the mixes the registry models have
MODELS = [("llama", "Q4_1", 64), ("qwen2", "Q4_K_M", 256), ("qwen2", "Q4_K_M-small", 256), ("llama", "Q5_K", 256),
          ("llama", "Q4_0", 64), ("qwen2", "Q5_1", 64), ("llama", "Q8_0", 64)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return converted_tiny(tmp_path_factory.mktemp("native"), weight_type="Q4_1", tied=False, seed=5)


def engine_of(gguf, keys: dict):
    return make_engine(config.override(config.parse({}), {"model.gguf": str(gguf), "draft.kind": "none", **keys}))


@pytest.mark.parametrize("arch, weights, width", MODELS)
def test_the_native_pass_computes_the_models_function(tmp_path, arch, weights, width):
    """Logits against the float64 reference: within what int8 activations cost. The K-quants' activations are
    quantized per 256 as llama.cpp's Q8_K (MatMulNBits: per 32), about twice its error on these random weights."""
    model_dir = converted_tiny(tmp_path, arch, weight_type=weights, d_model=width, d_ff=2 * width, seed=2)
    gguf = tmp_path / "tiny.gguf"
    ids = np.random.default_rng(1).integers(3, 250, 40)
    ref = ReferenceModel.from_gguf(gguf).logits(ids, np.arange(len(ids)))
    errors = {}
    for kernel in ("nbits", "native"):
        engine = engine_of(gguf, {"model.kernel": kernel, "cache.sink": 0, "cache.window": 64})
        rows = []
        engine.feed(ids, on_logits=lambda start, logits: rows.append(logits.copy()))
        errors[kernel] = np.abs(np.concatenate(rows) - ref).max() / np.abs(ref).max()
    print(f"\n{weights}: largest logit error / largest logit, native {errors['native']:.4f}, "
          f"MatMulNBits {errors['nbits']:.4f}")
    assert errors["native"] < 0.03, errors
    assert errors["native"] < 3 * errors["nbits"] + 1e-3, errors


@pytest.mark.parametrize("trees", [False, True])
def test_a_native_rows_bits_do_not_depend_on_the_rows_beside_it(tiny, trees):
    runner = Runner(tiny, RingSpec(4, 64, 80), RunnerOptions(threads=2, max_rows=16, trees=trees, kernel="native"))
    verdict = check(runner, thorough=True)
    assert verdict.invariant, verdict.where


def test_the_probe_catches_a_planted_row_count_fault_in_the_native_pass(tiny, monkeypatch):
    monkeypatch.setenv(PLANT_ENV, "1e-3")
    verdict = check(Runner(tiny, RingSpec(4, 64, 80), NATIVE))
    assert not verdict.invariant and verdict.max_abs_logit > 0


@pytest.mark.parametrize("draft", ["suffix", "suffix tree"])
def test_greedy_identity_with_a_draft_while_the_ring_wraps_on_the_native_pass(tmp_path, draft):
    converted_tiny(tmp_path, weight_type="Q4_1", tied=False, seed=5)
    keys = {"model.kernel": "native", "cache.sink": 4, "cache.window": 24, "model.max_rows": 8}
    kind, _, tree = draft.partition(" ")
    plain = engine_of(tmp_path / "tiny.gguf", keys)
    drafted = engine_of(tmp_path / "tiny.gguf", {**keys, "draft.kind": kind, "draft.siblings": 2 if tree else 0})
    text = np.tile(np.random.default_rng(4).integers(3, 250, 23), 12)        # repeats: the suffix draft proposes
    accepted = 0
    for start in range(0, len(text), 60):
        a = plain.generate(text[start:start + 60], 12).token_ids
        got = drafted.generate(text[start:start + 60], 12)
        assert a == got.token_ids, f"chunk {start}: {a} vs {got.token_ids}"
        accepted += got.stats.as_dict()["accepted"]
    assert drafted.index.n // drafted.spec.ring >= 5 and accepted > 0


@pytest.mark.parametrize("trees", [False, True])
def test_each_of_three_streams_gets_its_alone_bits_in_shared_native_passes(tiny, trees):
    opts = RunnerOptions(threads=2, max_rows=16, trees=trees, kernel="native")
    recorded = [decode_alone(tiny, opts, text, np.array([5, 6, 7]), 24, score=n == 1)
                for n, text in enumerate(texts(3, 90))]
    streams = Streams(tiny, SPEC, 3, opts, sizes=(1, 2, 3))
    assert replay_together(streams, recorded, delays=[0, 1, 3]) >= 8


def test_a_process_pinned_to_one_cpu_runs_the_native_pass_on_one_thread(tiny):
    """An actor pinned to one CPU (configs/pair.toml's target) gets no second thread to wait on that CPU: the native
    pass's threads are capped by the affinity as ONNX Runtime's are."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        pinned = Runner(tiny, RingSpec(4, 32, 48), NATIVE)
    finally:
        os.sched_setaffinity(0, before)
    assert pinned.session.threads == 1
    assert Runner(tiny, RingSpec(4, 32, 48), NATIVE).session.threads == min(NATIVE.threads, len(before))


def test_a_weight_the_kernel_does_not_read_is_refused_by_name(tmp_path):
    model_dir = converted_tiny(tmp_path, weight_type="F32")
    with pytest.raises(NativeUnavailable, match=r"blk\.0\.attn_q\.weight is F32.*kernel = \"nbits\""):
        Runner(model_dir, RingSpec(4, 32, 48), NATIVE)


def test_auto_runs_the_native_pass_where_it_reads_the_model_and_matmulnbits_where_not(tiny, tmp_path, monkeypatch):
    """`kernel = "auto"` (the default): native on a quantized model; MatMulNBits, with the reason kept, on a float32
    linear and on a machine whose kernel was not built, where "native" named outright is refused."""
    auto, spec = RunnerOptions(threads=2, max_rows=16), RingSpec(4, 32, 48)
    assert auto.kernel == "auto" and config.parse({}).model.kernel == "auto"
    with pytest.raises(ValueError, match="resolve"):
        auto.pool_dtype
    quantized = Runner(tiny, spec, auto)
    assert (quantized.opts.kernel, quantized.opts.pool_dtype, quantized.padded) == ("native", "float16", False)
    assert type(quantized.session).__name__ == "NativeSession"
    floats = Runner(converted_tiny(tmp_path, weight_type="F32"), spec, auto)
    assert (floats.opts.kernel, floats.opts.pool_dtype, floats.padded) == ("nbits", "float32", True)
    assert "is F32" in unreadable(floats.card)
    monkeypatch.setattr(qmatmul, "_qmm", None)                  # a machine without a compiler at install
    monkeypatch.setattr(qmatmul, "MISSING", "the native kernel is not built (no compiler)")
    assert unreadable(quantized.card) == qmatmul.MISSING
    assert Runner(tiny, spec, auto).opts.kernel == "nbits"
    with pytest.raises(NativeUnavailable, match="not built"):
        Runner(tiny, spec, NATIVE)


@pytest.mark.parametrize("pools, within", [("float32", 0.002), ("float16", 0.005)])
def test_the_native_pass_agrees_with_llamacpp_on_the_default_model(default_gguf, fixture_npz, pools, within):
    """llama.cpp's logits (../shared/fixtures) for the default model: mean NLL near llama.cpp's, top-1 agreement,
    and its greedy continuation. With float32 pools within 0.2% on every CPU (AVX-512 Xeon -0.08%, AVX2 EPYC +0.061%;
    MatMulNBits +0.12% and -0.113%: docs/kernel.md). Planted, an RMSNorm epsilon 30 times too large: +0.294%, top-1
    97.81%, refused. float16 pools (the native pass's own, as llama.cpp's cache): every K and V rounded to 11 bits
    moves each token's NLL a little, and int8 activations carry it on; over the fixture's 638 tokens the mean moved
    -0.0029 nats from the float32 pools' (standard error 0.0020; MatMulNBits' float16 pools +0.0007, 0.0022), so
    within 0.5%, about two standard errors of that move (docs/kernel.md). The kernel's own rounding (a 32-block's
    scale in float16, as llama.cpp's) is held exactly by tests/kernels/test_qmatmul.py, not by this mean."""
    from kernels.sampling import SamplingParams
    from tests.pipeline.decode.test_engine_real import llamacpp_agreement
    ids = fixture_npz["token_ids"].astype(np.int64)
    n = len(ids)
    keys = {"model.kernel": "native", "model.kv_dtype": pools, "cache.sink": 0, "cache.window": n + 32}
    _, top1, nll, ref = llamacpp_agreement(engine_of("default", keys), fixture_npz)
    print(f"\nnative pass, {pools} pools: top-1 agreement with llama.cpp {top1:.4f}, mean NLL {nll:.5f} vs "
          f"llama.cpp's {ref:.5f} ({(nll - ref) / ref:+.3%})")
    assert top1 >= 0.98 and abs(nll - ref) / ref <= within, (top1, nll, ref)
    fresh = engine_of("default", keys)
    assert fresh.generate(ids, 16, SamplingParams()).token_ids == fixture_npz["greedy_continuation_ids"][:16].tolist()


# -- the default model: greedy identity with drafts over a wrapping ring, on the native pass ------------------------

from tests.pipeline.decode.test_engine_real import POLICY, draft_gguf, run_stream, stream_ids  # noqa: E402,F401


@pytest.fixture(scope="module")
def native_target_only(stream_ids):
    return run_stream(engine_of("default", {**POLICY, "model.kernel": "native"}), stream_ids)


@pytest.mark.parametrize("draft", ["model", "hybrid tree"])
def test_greedy_identity_with_each_draft_while_the_ring_wraps_on_the_default_model(draft, stream_ids,
                                                                                   native_target_only, draft_gguf):
    """The target and the draft both on the native pass (a draft takes the target's kernel): every generation is
    target-only's, token for token, while the stream wraps the ring and proposals are rejected."""
    kind, _, tree = draft.partition(" ")
    engine = engine_of("default", {**POLICY, "model.kernel": "native", "draft.kind": kind,
                                   "draft.siblings": 2 if tree else 0, "draft.model": str(draft_gguf),
                                   "draft.length": 5})
    outputs, stats = run_stream(engine, stream_ids)
    assert outputs == native_target_only[0]
    assert engine.index.n // engine.spec.ring >= 10
    assert sum(s["rejections"] for s in stats) >= 5 and sum(s["rejections_after_wrap"] for s in stats) >= 1


def test_a_model_whose_gguf_moved_runs_natively_from_where_it_is_now(tmp_path):
    """The converted directory is keyed by the GGUF's content; the card is pointed at the file it was asked for, so
    the native pass reads blocks that exist (the first file deleted)."""
    from models.convert import load_card
    from models.registry import converted_dir
    from tests.tiny_gguf import write_tiny_gguf
    first, second = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path in (first, second):
        path.parent.mkdir()
        write_tiny_gguf(path, weight_type="Q4_1", seed=11)
    converted_dir(first)
    first.unlink()
    model_dir = converted_dir(second)
    assert load_card(model_dir)["source"]["path"] == str(second.resolve())
    Runner(model_dir, RingSpec(4, 32, 48), NATIVE)

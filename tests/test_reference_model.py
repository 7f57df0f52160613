"""The float64 reference is right: it equals transformers on tiny GGUFs, llama.cpp on the real model, and its ring
policy reduces to full causal attention wherever the policy hides nothing."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from gguf import GGUFReader

from models.subset import layer_subset
from tests.reference_model import ReferenceModel
from tests.tiny_gguf import tiny_vocab, write_tiny_gguf

torch = pytest.importorskip("torch", reason="needs torch (the test extra)")

# ---------------------------------------------------------------------------------------------------- helpers

def _rms_norm64(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rope64(self, x, position_ids):
    head_dim, base = self.config.head_dim, self.config.rope_parameters["rope_theta"]
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = position_ids[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _eager_attention64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    from transformers.models.llama.modeling_llama import repeat_kv
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@pytest.fixture
def hf_float64(monkeypatch):
    """Build the transformers twin of a tiny GGUF in float64 throughout.

    transformers' eager path rounds RMSNorm, the RoPE angles and the softmax to float32 even in a float64 model
    (about 1e-7 relative, 2e-6 on these logits); these patches keep its formulas and drop only that rounding.
    """
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", _eager_attention64)
    monkeypatch.setattr(modeling_qwen2, "eager_attention_forward", _eager_attention64)

    def build(described: dict):
        config = described["hf_config"]
        cls = LlamaForCausalLM if config.model_type == "llama" else Qwen2ForCausalLM
        model = cls(config).to(torch.float64).eval()
        model.load_state_dict({k: v.double() for k, v in described["state_dict"].items()}, strict=True)
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.forward = types.MethodType(_rms_norm64, module)
            elif type(module).__name__.endswith("RotaryEmbedding"):
                module.forward = types.MethodType(_rope64, module)
        return model
    return build


def _hf_logits(model, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(tokens)[None], position_ids=torch.from_numpy(positions)[None])
    return out.logits[0].numpy()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "llama.gguf"
    write_tiny_gguf(path, "llama", n_layers=2, tied=True)
    return ReferenceModel.from_gguf(path)


@pytest.fixture(scope="module")
def real_reference(default_gguf):
    return ReferenceModel.from_gguf(default_gguf)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


# ---------------------------------------------------------------------------------------------------- tiny models

@pytest.mark.parametrize("arch,qkv_bias,tied,weight_type", [
    ("llama", False, True, "F32"),
    ("llama", False, False, "F32"),
    ("llama", True, False, "Q4_1"),
    ("qwen2", True, True, "F32"),
    ("qwen2", True, False, "F32"),
    ("qwen2", True, False, "Q8_0"),
    ("qwen2", False, True, "Q4_0"),
])
def test_reference_equals_transformers_on_tiny_gguf(tmp_path, hf_float64, arch, qkv_bias, tied, weight_type):
    path = tmp_path / f"{arch}.gguf"
    described = write_tiny_gguf(path, arch, qkv_bias=qkv_bias, tied=tied, weight_type=weight_type, seed=3)
    ref = ReferenceModel.from_gguf(path)
    assert ref.config.tied == tied and ref.config.rope_style == {"llama": "interleaved", "qwen2": "neox"}[arch]
    hf = hf_float64(described)
    tokens = np.random.default_rng(7).integers(0, ref.config.vocab_size, 48)
    for start in (0, 70_000):
        positions = np.arange(start, start + len(tokens), dtype=np.int64)
        np.testing.assert_allclose(ref.logits(tokens, positions), _hf_logits(hf, tokens, positions), rtol=0, atol=1e-6)


def test_wrong_rope_pairing_is_detected(tmp_path, hf_float64):
    """The comparison above has teeth: NeoX pairs on llama's permuted Q/K rows give different logits."""
    path = tmp_path / "llama.gguf"
    described = write_tiny_gguf(path, "llama")
    ref = ReferenceModel.from_gguf(path)
    wrong = ref.with_config(rope_style="neox")
    tokens = np.arange(3, 35)
    positions = np.arange(len(tokens))
    expected = _hf_logits(hf_float64(described), tokens, positions)
    assert np.abs(wrong.logits(tokens, positions) - expected).max() > 1e-2


def test_tiny_gguf_carries_tokenizer_metadata(tmp_path):
    path = tmp_path / "qwen2.gguf"
    write_tiny_gguf(path, "qwen2")
    fields = GGUFReader(str(path)).fields
    tokens, token_types, merges = tiny_vocab()
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert fields["tokenizer.ggml.tokens"].contents() == tokens
    assert fields["tokenizer.ggml.merges"].contents() == merges
    got_types = fields["tokenizer.ggml.token_type"].contents()
    assert [tokens[i] for i, t in enumerate(got_types) if t == 3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert "<|im_start|>" in fields["tokenizer.chat_template"].contents()
    assert fields["qwen2.context_length"].contents() == 2048


# ---------------------------------------------------------------------------------------------------- ring policy

@pytest.mark.parametrize("sink", [0, 4])
def test_ring_with_window_covering_everything_is_full_causal(tiny_llama, sink):
    tokens = np.random.default_rng(0).integers(0, tiny_llama.config.vocab_size, 40)
    positions = np.arange(40)
    full = tiny_llama.logits(tokens, positions)
    np.testing.assert_array_equal(tiny_llama.logits(tokens, positions, sink=sink, window=40), full)
    np.testing.assert_array_equal(tiny_llama.logits(tokens, positions, sink=sink, window=1000), full)


def test_rows_whose_history_fits_in_sinks_plus_window_match_full_causal(tiny_llama):
    sink, window, n = 4, 12, 40
    tokens = np.random.default_rng(1).integers(0, tiny_llama.config.vocab_size, n)
    positions = np.arange(n)
    full = tiny_llama.logits(tokens, positions)
    ring = tiny_llama.logits(tokens, positions, sink=sink, window=window)
    fits = positions <= sink + window - 1          # u - W + 1 <= S: nothing between the sinks and the window
    np.testing.assert_allclose(ring[fits], full[fits], rtol=0, atol=1e-12)
    assert np.abs(ring[~fits] - full[~fits]).max(axis=-1).min() > 1e-6   # past that, eviction changes every row


def test_ring_logits_depend_on_window_positions_only_through_differences(tiny_llama):
    """Sinks stay at 0..S-1 and window rows are scored against them from S + W - 1, so sliding the non-sink tokens
    far along (past 2**31, where float32 angles would be off by radians) leaves every logit unchanged."""
    sink, window = 3, 8
    tokens = np.random.default_rng(2).integers(0, tiny_llama.config.vocab_size, sink + 20)
    near = np.concatenate([np.arange(sink), np.arange(50, 70)])
    far = np.concatenate([np.arange(sink), np.arange(50, 70) + 3_000_000_000])
    np.testing.assert_allclose(tiny_llama.logits(tokens, far, sink, window),
                               tiny_llama.logits(tokens, near, sink, window), rtol=0, atol=1e-6)


def test_visibility_follows_the_definition():
    positions = np.array([0, 1, 2, 10, 11, 12, 13])
    visible = ReferenceModel.visibility(positions, sink=2, window=3)
    # row at u = 13 sees the sinks 0, 1 and [11, 13]; not 2 (neither sink nor in window) nor 10
    assert visible[6].tolist() == [True, True, False, False, True, True, True]
    # row at u = 10: the jump from 2 evicted everything but the sinks
    assert visible[3].tolist() == [True, True, False, True, False, False, False]
    assert not np.triu(ReferenceModel.visibility(positions, 2, None), 1).any()


def test_logits_tree_rows_equal_the_linear_pass_of_each_ancestor_path(tiny_llama):
    rng = np.random.default_rng(3)
    context = rng.integers(0, tiny_llama.config.vocab_size, 20)
    context_positions = np.arange(20)
    tree_tokens = rng.integers(0, tiny_llama.config.vocab_size, 6)
    parent = np.array([-1, 0, 0, 1, -1, 4])           # two roots; node 2 is node 1's sibling
    sink, window = 2, 8
    got = tiny_llama.logits_tree(context, context_positions, tree_tokens, parent, sink, window)
    for node, path in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [4], [4, 5]]):
        tokens = np.concatenate([context, tree_tokens[path]])
        positions = np.arange(len(tokens))
        expected = tiny_llama.logits(tokens, positions, sink, window)[-1]
        np.testing.assert_allclose(got[node], expected, rtol=0, atol=1e-12)


def test_layer_subset_keeps_the_first_blocks_exactly(tmp_path):
    src, dst = tmp_path / "full.gguf", tmp_path / "draft.gguf"
    write_tiny_gguf(src, "qwen2", n_layers=4, weight_type="Q4_1", tied=False)
    layer_subset(src, dst, keep=2)
    full, draft = ReferenceModel.from_gguf(src), ReferenceModel.from_gguf(dst)
    assert draft.config == dataclasses.replace(full.config, n_layers=2)
    first_two = full.with_config(n_layers=2)
    tokens = np.arange(3, 30)
    np.testing.assert_array_equal(draft.logits(tokens, np.arange(len(tokens))),
                                  first_two.logits(tokens, np.arange(len(tokens))))
    src_fields, dst_fields = GGUFReader(str(src)).fields, GGUFReader(str(dst)).fields
    assert dst_fields["qwen2.block_count"].contents() == 2
    for key, field in src_fields.items():
        if not key.startswith("GGUF.") and key != "qwen2.block_count":
            assert dst_fields[key].types == field.types and dst_fields[key].contents() == field.contents(), key
    src_tensors = {t.name: t for t in GGUFReader(str(src)).tensors}
    for t in GGUFReader(str(dst)).tensors:
        assert t.tensor_type == src_tensors[t.name].tensor_type
        assert bytes(t.data) == bytes(src_tensors[t.name].data), t.name


# ---------------------------------------------------------------------------------------------------- real model

def test_reference_agrees_with_llamacpp_on_the_real_model(real_reference, fixture_npz):
    """639 tokens, full causal: top-1 >= 95%, mean NLL within 1%, and teacher-forced greedy continuation identical."""
    tokens = fixture_npz["token_ids"].astype(np.int64)
    continuation = fixture_npz["greedy_continuation_ids"].astype(np.int64)
    n = len(tokens)
    sequence = np.concatenate([tokens, continuation])
    logits = real_reference.logits(sequence, np.arange(len(sequence)))
    top1 = np.mean(logits[:n].argmax(axis=-1) == fixture_npz["topk_ids"][:, 0])
    nll_ref = -_log_softmax(logits[:n - 1])[np.arange(n - 1), tokens[1:]].mean()
    nll_cpp = -fixture_npz["next_token_logprob"].astype(np.float64).mean()
    assert top1 >= 0.95, top1
    assert abs(nll_ref - nll_cpp) / nll_cpp <= 0.01, (nll_ref, nll_cpp)
    # greedy decoding is a function of the prefix, so argmax along llama.cpp's own continuation decides identity
    np.testing.assert_array_equal(logits[n - 1:n - 1 + len(continuation)].argmax(axis=-1), continuation)


def test_real_model_ring_rows_with_full_history_match_full_causal(real_reference, fixture_npz):
    sink, window = 4, 60
    tokens = fixture_npz["token_ids"][:100].astype(np.int64)
    positions = np.arange(len(tokens))
    full = real_reference.logits(tokens, positions)
    ring = real_reference.logits(tokens, positions, sink=sink, window=window)
    fits = positions <= sink + window - 1
    np.testing.assert_allclose(ring[fits], full[fits], rtol=0, atol=1e-9)
    assert not np.allclose(ring[~fits], full[~fits])


def test_truncated_real_model_loads_and_runs(real_reference, default_gguf, tmp_path):
    dst = layer_subset(default_gguf, tmp_path / "draft.gguf", keep=3)
    draft = ReferenceModel.from_gguf(dst)
    assert draft.config == dataclasses.replace(real_reference.config, n_layers=3)
    for name in ("token_embd.weight", "blk.2.attn_q.weight", "blk.2.ffn_down.weight"):
        np.testing.assert_array_equal(draft.dequantized(name), real_reference.dequantized(name))
    tokens = np.arange(100, 140)
    first_three = real_reference.with_config(n_layers=3)
    np.testing.assert_array_equal(draft.logits(tokens, np.arange(40)), first_three.logits(tokens, np.arange(40)))
    assert np.isfinite(draft.logits(tokens, np.arange(40))).all()

"""A small llama over a sub-vocabulary of the target's tokens: its shape, and writing it as a GGUF the converter reads.

Owns the draft's architecture (transformers' LlamaForCausalLM at a small size, tied embeddings), the vocabulary map
(draft id -> target id; draft id 0 stands for every target token outside the sub-vocabulary and is never proposed)
and the GGUF export: llama.cpp's layout (Q/K rows permuted for interleaved RoPE), Q8_0 matrices, the target's
tokenizer metadata copied, the map stored under TARGET_IDS. Needs torch and transformers (the `train` extra). Never
trains and never runs the ONNX model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from .subset import copy_field

TARGET_IDS = "ringspec.draft.target_ids"    # GGUF key: int32 array, target id of each draft id (-1 for "other")
OTHER = 0                                    # the draft id of every token outside the sub-vocabulary


@dataclass(frozen=True)
class DraftShape:
    vocab: int = 4096          # draft ids, "other" included
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 768
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    context: int = 2048


def training_stack():
    """torch and transformers' llama (the train extra), imported on first use: the one place they are imported, so
    the engine runs without them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    return torch, LlamaConfig, LlamaForCausalLM


def build(shape: DraftShape, seed: int = 0):
    """A freshly initialised draft (transformers LlamaForCausalLM, float32, tied head)."""
    torch, LlamaConfig, LlamaForCausalLM = training_stack()

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_ff,
                      num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads,
                      num_key_value_heads=shape.n_kv_heads, head_dim=shape.d_model // shape.n_heads,
                      max_position_embeddings=shape.context, rms_norm_eps=shape.rms_eps,
                      rope_parameters={"rope_type": "default", "rope_theta": shape.rope_base},
                      tie_word_embeddings=True, attn_implementation="sdpa", dtype="float32")
    return LlamaForCausalLM(cfg)


def snap_to_q8(model) -> None:
    """Round every matrix of `model` through Q8_0 in place, so the model holds exactly what `export` writes (figures
    measured after this are the exported draft's)."""
    torch = training_stack()[0]

    q8 = GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                w = p.detach().cpu().numpy().astype(np.float32)
                p.copy_(torch.from_numpy(dequantize(quantize(w, q8), q8).reshape(w.shape)))


def vocab_map(target_ids: np.ndarray, target_vocab: int) -> np.ndarray:
    """target id -> draft id (OTHER outside the sub-vocabulary)."""
    to_draft = np.full(target_vocab, OTHER, np.int64)
    ids = np.asarray(target_ids)
    to_draft[ids[ids >= 0]] = np.flatnonzero(ids >= 0)
    return to_draft


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' rows -> llama.cpp's (pair (j, j + d/2) becomes (2j, 2j + 1)), as convert_hf_to_gguf does."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def export(model, shape: DraftShape, target_ids: np.ndarray, target_gguf, out, meta: dict | None = None) -> Path:
    """Write `model` as a llama GGUF at `out`: Q8_0 matrices, float32 norms, the target's tokenizer fields, the map.
    Returns the path. The file is written beside `out` and renamed into place."""

    out = Path(out)
    tmp = out.with_suffix(".part")
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = GGUFWriter(str(tmp), "llama")
    w.add_name("ringspec-draft")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.d_model)
    w.add_block_count(shape.n_layers)
    w.add_feed_forward_length(shape.d_ff)
    w.add_head_count(shape.n_heads)
    w.add_head_count_kv(shape.n_kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_dimension_count(shape.d_model // shape.n_heads)
    w.add_file_type(7)                                   # mostly Q8_0
    w.add_quantization_version(2)
    w.add_key_value(TARGET_IDS, [int(x) for x in target_ids], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    for key, value in (meta or {}).items():
        w.add_key_value(f"ringspec.draft.{key}", str(value), GGUFValueType.STRING)
    reader = GGUFReader(str(target_gguf))               # the tokenizer the draft's ids are a subset of
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            copy_field(w, key, field)

    def put(name: str, array: np.ndarray, heads: int | None = None) -> None:
        if heads is not None:
            array = permute_qk(array, heads)
        if array.ndim == 2:
            w.add_tensor(name, quantize(array, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, np.ascontiguousarray(array))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(shape.n_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", sd[p + "self_attn.q_proj.weight"], shape.n_heads)
        put(b + "attn_k.weight", sd[p + "self_attn.k_proj.weight"], shape.n_kv_heads)
        put(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out

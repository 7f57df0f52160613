"""Tiny GGUF models with known HF twins, and layer truncation of a real GGUF.

`write_tiny_gguf` writes a random llama or qwen2 model the way llama.cpp's convert_hf_to_gguf would (llama Q/K rows
permuted for interleaved RoPE, qwen2 left alone) and returns the transformers config and state dict of the same
function, so a GGUF consumer can be checked against transformers without any download. torch and transformers are
imported only when that twin is asked for, so the fast tier runs where neither is installed (an ARM64 gateway).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from models.convert import convert
from models.quant import BLOCK_BYTES, BLOCK_WEIGHTS
from models.draftnet import permute_qk  # transformers' Q/K rows -> llama.cpp's, as convert_hf_to_gguf does

CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # ids 0, 1, 2 as in SmolLM2
BOS_ID, EOS_ID = 1, 2
MERGES = ["Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he", "r e", "Ġ s", "a t", "e n", "o r", "Ġ c", "i s",
          "Ġ o", "Ġ w", "e d", "Ġ 0", "Ġ 1", "A L", "AL M"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Mixes of types as llama.cpp's Q4_K_M writes them (llama-quant.cpp): the 1.5B's (Q6_K for attn_v and ffn_down of some
# layers and the output, Q4_K elsewhere, the embedding included) and the 0.5B's (Q5_0 where a row of 896 is not a
# multiple of 256, Q8_0 output); tensor name suffix -> type, first match wins, "*" the rest.
MIXES = {"Q4_K_M": {"attn_v.weight": "Q6_K", "ffn_down.weight": "Q6_K", "output.weight": "Q6_K", "*": "Q4_K"},
         "Q4_K_M-small": {"token_embd.weight": "Q5_0", "output.weight": "Q8_0", "attn_v.weight": "Q4_K",
                          "ffn_down.weight": "Q6_K", "attn_q.weight": "Q5_0", "*": "Q5_0"}}
WEIGHT_TYPES = ("F32",) + QUANT_TYPES + tuple(MIXES)
# general.file_type (llama_ftype) of a file whose 2-D weights are all of that type (Q4_K_M: 15)
FILE_TYPES = {"F32": 0, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 12, "Q5_K": 16, "Q6_K": 18,
              "Q4_K_M": 15, "Q4_K_M-small": 15}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges): control tokens, the 256 byte tokens, then one token per merge."""
    tokens = CONTROL_TOKENS + [bytes_to_unicode()[b] for b in range(256)]
    for merge in MERGES:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens, merge
        tokens.append(left + right)
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))
    return tokens, types, list(MERGES)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of permute_qk."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def converted_tiny(root, arch: str = "llama", **kw):
    """A tiny GGUF (`write_tiny_gguf`'s keywords) written into `root` and converted beside it: the model directory."""
    write_tiny_gguf(root / "tiny.gguf", arch, **kw)
    convert(root / "tiny.gguf", root / "tiny", progress=False)
    return root / "tiny"


def write_tiny_gguf(path, arch: str = "llama", *, n_layers: int = 2, d_model: int = 64, n_heads: int = 4,
                    n_kv_heads: int = 2, d_ff: int = 128, qkv_bias: bool | None = None, tied: bool = True,
                    rope_base: float = 10000.0, rms_eps: float = 1e-5, context_length: int = 2048, seed: int = 0,
                    weight_type: str = "F32") -> dict:
    """Write a random `arch` model to `path`; return a `Described` {"hf_config", "state_dict", "tokens", "merges"}: the
    same function in transformers' naming (unpermuted q/k, dequantized values). qkv_bias defaults to qwen2's
    (True) or llama's (False) convention."""
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"arch must be llama or qwen2, not {arch!r}")
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {WEIGHT_TYPES}")
    qkv_bias = (arch == "qwen2") if qkv_bias is None else qkv_bias
    head_dim = d_model // n_heads
    tokens, token_types, merges = tiny_vocab()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def linear(out_dim: int, in_dim: int) -> np.ndarray:
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(dim: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(dim)).astype(np.float32)

    def bias(dim: int) -> np.ndarray:
        return (0.5 * rng.standard_normal(dim)).astype(np.float32)

    # Every tensor in HF layout and naming first; GGUF names and layout are derived from it below.
    hf: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((vocab, d_model)).astype(np.float32)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        hf[p + "input_layernorm.weight"] = norm(d_model)
        hf[p + "self_attn.q_proj.weight"] = linear(n_heads * head_dim, d_model)
        hf[p + "self_attn.k_proj.weight"] = linear(n_kv_heads * head_dim, d_model)
        hf[p + "self_attn.v_proj.weight"] = linear(n_kv_heads * head_dim, d_model)
        if qkv_bias:
            hf[p + "self_attn.q_proj.bias"] = bias(n_heads * head_dim)
            hf[p + "self_attn.k_proj.bias"] = bias(n_kv_heads * head_dim)
            hf[p + "self_attn.v_proj.bias"] = bias(n_kv_heads * head_dim)
        hf[p + "self_attn.o_proj.weight"] = linear(d_model, n_heads * head_dim)
        hf[p + "post_attention_layernorm.weight"] = norm(d_model)
        hf[p + "mlp.gate_proj.weight"] = linear(d_ff, d_model)
        hf[p + "mlp.up_proj.weight"] = linear(d_ff, d_model)
        hf[p + "mlp.down_proj.weight"] = linear(d_model, d_ff)
    hf["model.norm.weight"] = norm(d_model)
    if not tied:
        hf["lm_head.weight"] = linear(vocab, d_model)

    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(context_length)
    writer.add_embedding_length(d_model)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(d_ff)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_file_type(FILE_TYPES[weight_type])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_quantization_version(2)

    state: dict[str, np.ndarray] = {}

    def put(gguf_name: str, hf_name: str, permute_heads: int | None = None) -> None:
        """Write hf[hf_name] as gguf_name (permuted, quantized) and record the values the GGUF really holds."""
        w = hf[hf_name]
        if permute_heads is not None:
            w = permute_qk(w, permute_heads)
        qtype = type_of(gguf_name, weight_type)
        if w.ndim == 2 and qtype != "F32" and w.shape[1] % BLOCK_WEIGHTS[qtype] == 0:
            gtype = GGMLQuantizationType[qtype]
            # gguf-py quantizes the legacy types; the K-quants get random blocks at the float weights' scale
            raw = random_blocks(rng, qtype, w.shape, float(w.std())) if qtype.endswith("_K") else quantize(w, gtype)
            writer.add_tensor(gguf_name, raw, raw_dtype=gtype)
            w = dequantize(raw, gtype).reshape(w.shape)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(w, dtype=np.float32))
        if permute_heads is not None:
            w = unpermute_qk(w, permute_heads)
        state[hf_name] = w

    put("token_embd.weight", "model.embed_tokens.weight")
    for i in range(n_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        heads_q = n_heads if arch == "llama" else None
        heads_k = n_kv_heads if arch == "llama" else None
        put(b + "attn_norm.weight", p + "input_layernorm.weight")
        put(b + "attn_q.weight", p + "self_attn.q_proj.weight", heads_q)
        put(b + "attn_k.weight", p + "self_attn.k_proj.weight", heads_k)
        put(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        if qkv_bias:
            put(b + "attn_q.bias", p + "self_attn.q_proj.bias", heads_q)
            put(b + "attn_k.bias", p + "self_attn.k_proj.bias", heads_k)
            put(b + "attn_v.bias", p + "self_attn.v_proj.bias")
        put(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight")
        put(b + "ffn_up.weight", p + "mlp.up_proj.weight")
        put(b + "ffn_down.weight", p + "mlp.down_proj.weight")
    put("output_norm.weight", "model.norm.weight")
    if not tied:
        put("output.weight", "lm_head.weight")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    # transformers' side: Qwen2 always has q/k/v biases, Llama with attention_bias also has an o_proj bias.
    for i in range(n_layers):
        p = f"model.layers.{i}.self_attn."
        if arch == "qwen2" and not qkv_bias:
            for proj, dim in (("q", n_heads), ("k", n_kv_heads), ("v", n_kv_heads)):
                state[p + f"{proj}_proj.bias"] = np.zeros(dim * head_dim, dtype=np.float32)
        if arch == "llama" and qkv_bias:
            state[p + "o_proj.bias"] = np.zeros(d_model, dtype=np.float32)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]

    return Described(tokens=tokens, merges=merges,
                     twin=lambda: _hf_twin(state, arch, vocab, d_model, d_ff, n_layers, n_heads, n_kv_heads, head_dim,
                                           context_length, rms_eps, rope_base, tied, qkv_bias))


def type_of(gguf_name: str, weight_type: str) -> str:
    """The type `weight_type` gives a tensor: itself, or its mix's rule for the name."""
    mix = MIXES.get(weight_type)
    if mix is None:
        return weight_type
    return next((t for suffix, t in mix.items() if gguf_name.endswith(suffix)), mix["*"])


def random_blocks(rng: np.random.Generator, qtype: str, shape: tuple[int, int], std: float) -> np.ndarray:
    """Random `qtype` blocks for a weight of `shape` whose values have mean ~0 and standard deviation ~std: random
    codes and sub-block scales, the float16 d (and dmin, set to centre the values) scaled to match."""
    rows, cols = shape
    raw = rng.integers(0, 256, (rows, cols // BLOCK_WEIGHTS[qtype], BLOCK_BYTES[qtype]), dtype=np.uint8)
    d_at, dmin_at = (208, None) if qtype == "Q6_K" else (0, 2)

    def values(d: float, dmin: float) -> np.ndarray:
        raw[..., d_at:d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if dmin_at is not None:
            raw[..., dmin_at:dmin_at + 2] = np.frombuffer(np.float16(dmin).tobytes(), np.uint8)
        return dequantize(raw.reshape(rows, -1), GGMLQuantizationType[qtype])

    ratio = 0.0 if dmin_at is None else -values(1.0, 0.0).mean() / values(0.0, 1.0).mean()
    d = std / values(1.0, ratio).std()
    values(d, ratio * d)
    return raw.reshape(rows, -1)


class Described(dict):
    """What write_tiny_gguf wrote: "tokens", "merges", and on first access "hf_config" and "state_dict" (the
    transformers twin: torch and transformers are imported then)."""

    def __missing__(self, key):
        if key not in ("hf_config", "state_dict"):
            raise KeyError(key)
        self["hf_config"], self["state_dict"] = self["twin"]()
        return self[key]


def _hf_twin(state, arch, vocab, d_model, d_ff, n_layers, n_heads, n_kv_heads, head_dim, context_length, rms_eps,
             rope_base, tied, qkv_bias):
    import torch
    from transformers import LlamaConfig, Qwen2Config
    common = dict(vocab_size=vocab, hidden_size=d_model, intermediate_size=d_ff, num_hidden_layers=n_layers,
                  num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
                  max_position_embeddings=context_length, rms_norm_eps=float(np.float32(rms_eps)),
                  rope_parameters={"rope_type": "default", "rope_theta": float(np.float32(rope_base))},
                  tie_word_embeddings=tied, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                  attn_implementation="eager", dtype="float32")
    if arch == "llama":
        hf_config = LlamaConfig(attention_bias=qkv_bias, **common)
    else:
        hf_config = Qwen2Config(**common)
    return hf_config, {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}



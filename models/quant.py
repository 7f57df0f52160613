"""GGUF quantized blocks -> ONNX Runtime `MatMulNBits` operands, exactly.

Owns the bit-level mapping of Q4_0, Q4_1 and Q8_0 blocks (32 weights each) onto MatMulNBits' packed layout; every
other type is dequantized to float32. Never rounds or re-quantizes a weight: the packed form computes the same numbers.

MatMulNBits computes w = scale * (q - zp) with zp = 2^(bits-1) by default. Q4_0 (w = d*(q-8)) and Q8_0
(w = d*q, q signed) map directly. Q4_1 (w = d*q + m) does not: a float zero point is exact but slow, so we use
w = d*(q-8) + (8d + m): MatMulNBits on the first term plus a block-sum correction x_blocksum @ C with C = 8d + m.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gg_dequantize

QUANT_BLOCK = 32          # weights per quantized block: Q4_0, Q4_1 and Q8_0 alike (llama.cpp's QK4_0, QK8_0)
NBITS_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}


@dataclass
class Packed:
    bits: int
    packed: np.ndarray        # uint8 [N, K/32, 16 or 32]
    scales: np.ndarray        # float32 [N * K/32]
    offsets: np.ndarray | None  # float32 [K/32, N]: per-block additive term (Q4_1 only)


def _f16(raw: np.ndarray, start: int) -> np.ndarray:
    return raw[..., start:start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles_to_ort(qs: np.ndarray) -> np.ndarray:
    """GGUF: byte j holds weights j (low) and j+16 (high). ORT: byte i holds weights 2i (low) and 2i+1 (high)."""
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)           # [..., 32] in weight order
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def pack(raw: np.ndarray, qtype: str, n_out: int, k_in: int) -> Packed:
    """raw: GGUF block bytes of a weight [n_out, k_in] (uint8 rows of blocks)."""
    nb = k_in // QUANT_BLOCK
    blocks = np.ascontiguousarray(raw).reshape(n_out, nb, -1)
    if qtype == "Q4_0":
        return Packed(4, _nibbles_to_ort(blocks[..., 2:18]), _f16(blocks, 0).reshape(-1), None)
    if qtype == "Q4_1":
        d, m = _f16(blocks, 0), _f16(blocks, 2)
        offsets = (8.0 * d.astype(np.float64) + m).astype(np.float32).T.copy()   # [nb, N]
        return Packed(4, _nibbles_to_ort(blocks[..., 4:20]), d.reshape(-1), offsets)
    if qtype == "Q8_0":
        q = blocks[..., 2:34].view(np.int8).astype(np.int16) + 128               # signed -> zp 128
        return Packed(8, q.astype(np.uint8), _f16(blocks, 0).reshape(-1), None)
    raise ValueError(f"{qtype} has no exact MatMulNBits form")


def concat(parts: list[Packed]) -> Packed:
    """Stack several weights along the output axis (fused QKV, fused gate/up)."""
    offsets = [p.offsets for p in parts]
    return Packed(parts[0].bits, np.concatenate([p.packed for p in parts]),
                  np.concatenate([p.scales for p in parts]),
                  None if offsets[0] is None else np.concatenate(offsets, axis=1))


def dequantize(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Any GGUF type -> float32 array of `shape` (numpy order)."""

    if qtype in ("F32", "F16", "BF16") and raw.dtype != np.uint8:
        return np.asarray(raw, dtype=np.float32).reshape(shape)
    return gg_dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32).reshape(shape)


def embedding_rows(raw: np.ndarray, qtype: str, vocab: int, d: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Q8_0 embeddings stay int8 with per-block scales (gathered then scaled in the graph); others -> float32."""
    if qtype == "Q8_0":
        blocks = np.ascontiguousarray(raw).reshape(vocab, d // QUANT_BLOCK, 34)
        return blocks[..., 2:34].view(np.int8).reshape(vocab, d).copy(), _f16(blocks, 0)   # [V, d], [V, d/32]
    return dequantize(raw, qtype, (vocab, d)), None

"""GGUF quantized blocks -> ONNX Runtime `MatMulNBits` operands, exactly.

Owns the bit-level mapping of every quantized type a common GGUF holds (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
Q6_K) onto MatMulNBits' packed layout; any other type is dequantized to float32. Never rounds or re-quantizes a
weight: the packed form computes the same numbers.

MatMulNBits computes w = scale * (code - zp) per block of `block` weights (zp = 2^(bits-1) unless given); a format
with mins adds a per-block term, x's block sums times `offsets`. Each type's form (`FORMS`), its real-valued weight
after llama.cpp's `ggml-quants.c` (dequantize_row_*), and why the form is exact:

| type | format's weight | bits/block | code | zp | scale | offset |
|---|---|---|---|---|---|---|
| Q4_0 | d*(q-8), q 4-bit | 4/32 | q | 8 | d | - |
| Q4_1 | d*q + m | 4/32 | q | 8 | d | 8d + m (rounded to float32: the one inexact form, kept for the default model) |
| Q5_0 | d*(q-16), q 5-bit | 8/32 | q+112 | 128 | d | - |
| Q5_1 | d*q + m | 8/32 | q+128 | 128 | d | m |
| Q8_0 | d*q, q int8 | 8/32 | q+128 | 128 | d | - |
| Q4_K | (d*sc)*q - dmin*m, 6-bit sc, m per 32 | 4/32 | q | 0 (given) | d*sc | -dmin*m |
| Q5_K | (d*sc)*q - dmin*m, q 5-bit | 8/32 | q+128 | 128 | d*sc | -dmin*m |
| Q6_K | d*sc*(q-32), int8 sc per 16, q 6-bit | 8/16 | q+96 | 128 | d*sc | - |

Exact because d, dmin and m are float16 (11 significant bits) and sc, m are integers of at most 8 bits: d*sc and
dmin*m need at most 19 significant bits, so they are float32 values, and scale*(code - zp) needs at most 23 (Q6_K:
11 + 7 + 5), so the dequantized term is a float32 value too. The offset is a separate term: a weight's two terms
are each exact; their sum is what the format means. A non-finite d or dmin is refused, naming the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gg_dequantize

from kernels.qmatmul import BLOCK_BYTES, BLOCK_WEIGHTS   # the blocks' layouts: one table for both readers

QK_K = 256                # weights per K-quant super-block (llama.cpp's QK_K)


@dataclass(frozen=True)
class Form:
    """How one GGUF type sits in MatMulNBits."""
    bits: int             # 4 or 8
    block: int            # weights per scale: 16 or 32
    zero_point: int       # the code of weight 0 (2^(bits-1) is MatMulNBits' default; otherwise given as an input)
    offsets: bool         # a per-block additive term

    @property
    def default_zero_point(self) -> bool:
        return self.zero_point == 1 << (self.bits - 1)


FORMS = {"Q4_0": Form(4, 32, 8, False), "Q4_1": Form(4, 32, 8, True), "Q5_0": Form(8, 32, 128, False),
         "Q5_1": Form(8, 32, 128, True), "Q8_0": Form(8, 32, 128, False), "Q4_K": Form(4, 32, 0, True),
         "Q5_K": Form(8, 32, 128, True), "Q6_K": Form(8, 16, 128, False)}
NBITS_TYPES = {name: form.bits for name, form in FORMS.items()}


class QuantError(ValueError):
    """A quantized tensor whose blocks cannot be used (a non-finite scale), naming it."""


@dataclass
class Packed:
    form: Form
    packed: np.ndarray              # uint8 [N, K/block, block*bits/8]
    scales: np.ndarray              # float32 [N * K/block]
    zero_points: np.ndarray | None  # uint8 [N, ceil(K/block * bits/8)], only where the form's zp is not the default
    offsets: np.ndarray | None      # float32 [K/block, N]: the per-block additive term

    @property
    def bits(self) -> int:
        return self.form.bits


@dataclass
class Codes:
    """A weight's blocks decoded: w = scale * (code - form.zero_point) + offset, per block of form.block weights."""
    codes: np.ndarray               # uint8 [N, nb, block]
    scales: np.ndarray              # float32 [N, nb]
    offsets: np.ndarray | None      # float32 [N, nb]


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[..., start:start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-weight nibble layout: byte j holds weight j (low) and j+16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 fifth bits (a little-endian uint32: bit j is weight j's) -> [..., 32] of 0/16."""
    return (np.unpackbits(qh, axis=-1, bitorder="little") << 4).astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's twelve bytes -> eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (mix & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, m


def decode(raw: np.ndarray, qtype: str, n_out: int, k_in: int) -> Codes:
    """raw: GGUF block bytes of a weight [n_out, k_in] -> its codes, scales and offsets in `FORMS[qtype]`."""
    per_row = k_in // BLOCK_WEIGHTS[qtype]
    b = np.ascontiguousarray(raw).reshape(n_out, per_row, BLOCK_BYTES[qtype])
    if qtype == "Q4_0":
        return Codes(_low_high(b[..., 2:18]), _f16(b, 0), None)
    if qtype == "Q4_1":
        d, m = _f16(b, 0), _f16(b, 2)
        return Codes(_low_high(b[..., 4:20]), d, (8.0 * d.astype(np.float64) + m).astype(np.float32))
    if qtype == "Q5_0":                                        # code - 128 = q - 16
        q = _low_high(b[..., 6:22]) | _high_bits(b[..., 2:6])
        return Codes(q + np.uint8(112), _f16(b, 0), None)
    if qtype == "Q5_1":
        q = _low_high(b[..., 8:24]) | _high_bits(b[..., 4:8])
        return Codes(q + np.uint8(128), _f16(b, 0), _f16(b, 2))
    if qtype == "Q8_0":
        return Codes((b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8), _f16(b, 0), None)
    if qtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b, 0)[..., None], _f16(b, 2)[..., None]
        sc, m = _k_scales(b[..., 4:16])
        qs = b[..., 16:144] if qtype == "Q4_K" else b[..., 48:176]
        # 64 weights per 32 bytes: sub-block 2j is the low nibbles of bytes 32j.., sub-block 2j+1 their high nibbles
        q = np.stack([qs.reshape(*qs.shape[:-1], 4, 32) & 0x0F, qs.reshape(*qs.shape[:-1], 4, 32) >> 4], axis=-2)
        q = q.reshape(n_out, per_row, 8, 32)
        if qtype == "Q5_K":                                    # sub-block s's fifth bits: bit s of qh[0..31]
            qh = b[..., 16:48]
            q = q | (((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4).astype(np.uint8)
            q = q + np.uint8(128)
        return Codes(q.reshape(n_out, per_row * 8, 32), (d * sc).reshape(n_out, -1),
                     (-(dmin * m)).reshape(n_out, -1))
    if qtype == "Q6_K":
        ql, qh = b[..., 0:128].reshape(n_out, per_row, 2, 64), b[..., 128:192].reshape(n_out, per_row, 2, 32)
        sc = b[..., 192:208].view(np.int8).astype(np.float32)
        lo = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=-2)
        hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-2)             # [N, nb, 2, 4, 32]
        q = (lo | (hi << 4)) + np.uint8(96)                                      # code - 128 = q - 32
        return Codes(q.reshape(n_out, per_row * 16, 16), (_f16(b, 208)[..., None] * sc).reshape(n_out, -1), None)
    raise ValueError(f"{qtype} has no exact MatMulNBits form")


def pack(raw: np.ndarray, qtype: str, n_out: int, k_in: int, name: str = "weight") -> Packed:
    """raw: GGUF block bytes of a weight [n_out, k_in] (uint8 rows of blocks) -> its MatMulNBits operands."""
    form = FORMS.get(qtype)
    if form is None:
        raise ValueError(f"{qtype} has no exact MatMulNBits form")
    c = decode(raw, qtype, n_out, k_in)
    bad = ~np.isfinite(c.scales) if c.offsets is None else ~(np.isfinite(c.scales) & np.isfinite(c.offsets))
    if bad.any():
        row, blk = (int(i) for i in np.argwhere(bad)[0])
        raise QuantError(f"{name} ({qtype}): row {row}, block {blk} of {form.block} weights has a non-finite scale "
                         f"({int(bad.sum())} such blocks); the file is damaged")
    codes = c.codes
    if form.bits == 4:
        codes = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    nb = codes.shape[1]
    zp = None
    if not form.default_zero_point:
        per = (nb * form.bits + 7) // 8
        value = form.zero_point if form.bits == 8 else form.zero_point * 0x11
        zp = np.full((n_out, per), value, np.uint8)
    offsets = None if c.offsets is None else np.ascontiguousarray(c.offsets.astype(np.float32).T)
    return Packed(form, np.ascontiguousarray(codes), c.scales.astype(np.float32).reshape(-1), zp, offsets)


def concat(parts: list[Packed]) -> Packed:
    """Stack several weights of one form along the output axis (fused QKV, fused gate/up)."""
    if len({p.form for p in parts}) != 1:
        raise ValueError("only weights of one form stack into one MatMulNBits")
    offsets, zps = [p.offsets for p in parts], [p.zero_points for p in parts]
    return Packed(parts[0].form, np.concatenate([p.packed for p in parts]), np.concatenate([p.scales for p in parts]),
                  None if zps[0] is None else np.concatenate(zps),
                  None if offsets[0] is None else np.concatenate(offsets, axis=1))


def dequantize(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Any GGUF type -> float32 array of `shape` (numpy order)."""

    if qtype in ("F32", "F16", "BF16") and raw.dtype != np.uint8:
        return np.asarray(raw, dtype=np.float32).reshape(shape)
    return gg_dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32).reshape(shape)

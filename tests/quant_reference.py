"""The real-valued weights of GGUF quantized blocks, in float64, block by block: a reference for models/quant.py.

Written apart from the packer, as a scalar transcription of llama.cpp's `dequantize_row_*` (ggml-quants.c; the block
layouts of ggml-common.h): plain loops over bytes, Python integers and floats, one block at a time. Each weight comes
back as its two exact terms (main, offset): w = main + offset, main = (the block's scale) x (its integer), offset the
block's additive term (-dmin*m, m or 0). Both terms are exact in float64 (a float16 times integers of a few bits), so a
packed form that reproduces them reproduces the format's real weight. llama.cpp and gguf-py round main + offset to
float32; this reference does not.
"""
from __future__ import annotations

import struct

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _f16(b: bytes, at: int) -> float:
    return struct.unpack_from("<e", b, at)[0]


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    """ggml's get_scale_min_k4."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def block_terms(b: bytes, qtype: str) -> list[tuple[float, float]]:
    """One block's weights as (main, offset) pairs, in weight order."""
    y: list[tuple[float, float]] = []
    if qtype in ("Q4_0", "Q4_1"):
        d = _f16(b, 0)
        m = _f16(b, 2) if qtype == "Q4_1" else 0.0
        qs = b[4:20] if qtype == "Q4_1" else b[2:18]
        zero = 0 if qtype == "Q4_1" else 8
        lo = [(d * ((qs[j] & 0x0F) - zero), m) for j in range(16)]
        hi = [(d * ((qs[j] >> 4) - zero), m) for j in range(16)]
        return lo + hi
    if qtype in ("Q5_0", "Q5_1"):
        d = _f16(b, 0)
        m = _f16(b, 2) if qtype == "Q5_1" else 0.0
        at = 4 if qtype == "Q5_1" else 2
        qh = struct.unpack_from("<I", b, at)[0]
        qs = b[at + 4:at + 20]
        zero = 0 if qtype == "Q5_1" else 16
        lo, hi = [], []
        for j in range(16):
            xh0 = ((qh >> j) << 4) & 0x10
            xh1 = (qh >> (j + 12)) & 0x10
            lo.append((d * (((qs[j] & 0x0F) | xh0) - zero), m))
            hi.append((d * (((qs[j] >> 4) | xh1) - zero), m))
        return lo + hi
    if qtype == "Q8_0":
        d = _f16(b, 0)
        return [(d * q, 0.0) for q in struct.unpack_from("<32b", b, 2)]
    if qtype in ("Q4_K", "Q5_K"):
        d, dmin, scales = _f16(b, 0), _f16(b, 2), b[4:16]
        qh = b[16:48] if qtype == "Q5_K" else bytes(32)
        ql = b[48:176] if qtype == "Q5_K" else b[16:144]
        u1, u2, is_ = 1, 2, 0
        for j in range(0, 256, 64):
            sc, m = _scale_min_k4(is_, scales)
            d1, m1 = d * sc, dmin * m
            sc, m = _scale_min_k4(is_ + 1, scales)
            d2, m2 = d * sc, dmin * m
            q = ql[j // 2:j // 2 + 32]
            y += [(d1 * ((q[l] & 0xF) + (16 if qh[l] & u1 else 0)), -m1) for l in range(32)]
            y += [(d2 * ((q[l] >> 4) + (16 if qh[l] & u2 else 0)), -m2) for l in range(32)]
            is_ += 2
            u1 <<= 2
            u2 <<= 2
        return y
    if qtype == "Q6_K":
        ql, qh = b[0:128], b[128:192]
        sc = struct.unpack_from("<16b", b, 192)
        d = _f16(b, 208)
        out = [0.0] * 256
        for half in range(2):
            lq, hq, s, base = ql[64 * half:], qh[32 * half:], sc[8 * half:], 128 * half
            for l in range(32):
                is_ = l // 16
                q1 = ((lq[l] & 0xF) | (((hq[l] >> 0) & 3) << 4)) - 32
                q2 = ((lq[l + 32] & 0xF) | (((hq[l] >> 2) & 3) << 4)) - 32
                q3 = ((lq[l] >> 4) | (((hq[l] >> 4) & 3) << 4)) - 32
                q4 = ((lq[l + 32] >> 4) | (((hq[l] >> 6) & 3) << 4)) - 32
                out[base + l] = d * s[is_ + 0] * q1
                out[base + l + 32] = d * s[is_ + 2] * q2
                out[base + l + 64] = d * s[is_ + 4] * q3
                out[base + l + 96] = d * s[is_ + 6] * q4
        return [(w, 0.0) for w in out]
    raise ValueError(f"no reference for {qtype}")


def weight_terms(raw: bytes, qtype: str, n_out: int, k_in: int) -> tuple[list[list[float]], list[list[float]]]:
    """A weight [n_out, k_in] stored as `raw` (rows of blocks) -> (main, offset), each n_out lists of k_in floats."""
    size = BLOCK_BYTES[qtype]
    main, offset = [], []
    row_bytes = len(raw) // n_out
    for r in range(n_out):
        row = raw[r * row_bytes:(r + 1) * row_bytes]
        terms = [t for at in range(0, row_bytes, size) for t in block_terms(row[at:at + size], qtype)]
        assert len(terms) == k_in, (len(terms), k_in)
        main.append([t[0] for t in terms])
        offset.append([t[1] for t in terms])
    return main, offset

"""Rotary position embedding: float64 angle tables, sink query positions, and a float64 reference rotation.

Keys are stored rotated at their absolute positions, so a score depends only on u - v (the text distance). Angles
u * theta_j are formed in float64 and only then reduced to float32 cos/sin: past a million tokens a float32 product
is off by tenths of a radian, while the float64 product is exact to ~1e-9 rad up to 2^33.
"""
from __future__ import annotations

import numpy as np


def rope_inv_freq(head_dim: int, base: float) -> np.ndarray:
    """theta_j = base^(-2j/D) for j in [0, D/2), float64."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    return float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_tables(positions, inv_freq: np.ndarray, out_cos=None, out_sin=None):
    """cos and sin of u * theta_j, shape [T, D/2]; returns (out_cos, out_sin).

    Invariant: the angle is the float64 product of the exact int64 position (< 2^53) and theta_j; cos/sin are
    evaluated in float64 and rounded once into the output dtype (float32 for the graph, float64 for a reference).
    """
    pos = np.asarray(positions, dtype=np.int64)
    angle = pos.astype(np.float64)[:, None] * inv_freq[None, :]
    shape = angle.shape
    out_cos = np.empty(shape, np.float32) if out_cos is None else out_cos
    out_sin = np.empty(shape, np.float32) if out_sin is None else out_sin
    np.cos(angle, out=out_cos)  # float64 loop, cast on store
    np.sin(angle, out=out_sin)
    return out_cos, out_sin


def sink_query_positions(row_pos, sink: int, window: int, out=None) -> np.ndarray:
    """Position at which to rotate the second query of each row, the one scored against the sink keys: min(u, S+W-1).

    StreamingLLM numbers positions within the cache: sinks at 0..S-1, the W window keys after them, the query last.
    A window key's cache distance equals its text distance u - v, so window keys and the main query keep their
    absolute positions. Only the sinks differ: sink i sits at cache distance min(u, S+W-1) - i, which a query rotated
    at min(u, S+W-1) reproduces against sink keys left rotated at their own positions 0..S-1.
    """
    return np.minimum(np.asarray(row_pos, dtype=np.int64), sink + window - 1, out=out)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairing: str) -> np.ndarray:
    """Rotate x [..., T, D] by the tables cos, sin [T, D/2], in float64 (a reference, not a runtime kernel).

    pairing "interleaved": pairs (x[2i], x[2i+1]), as llama.cpp and llama-family GGUF (Q/K rows permuted for it);
    pairing "neox": pairs (x[i], x[i + D/2]), as qwen2 and Hugging Face llama.
    """
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(cos, dtype=np.float64)
    s = np.asarray(sin, dtype=np.float64)
    h = x.shape[-1] // 2
    if pairing == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    elif pairing == "neox":
        a, b = x[..., :h], x[..., h:]
    else:
        raise ValueError(f"unknown pairing {pairing!r}")
    ra, rb = a * c - b * s, a * s + b * c
    out = np.empty_like(x)
    if pairing == "interleaved":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :h], out[..., h:] = ra, rb
    return out


def rope_tables_float32(positions, inv_freq: np.ndarray, out_cos=None, out_sin=None):
    """What a plain implementation does, kept only as a baseline to measure against: the angle u * theta_j formed in
    float32 (off by tenths of a radian near 10,000,000). Never use it for inference."""
    angle = np.asarray(positions, np.int64).astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    out_cos = np.empty(angle.shape, np.float32) if out_cos is None else out_cos
    out_sin = np.empty(angle.shape, np.float32) if out_sin is None else out_sin
    np.cos(angle, out=out_cos)
    np.sin(angle, out=out_sin)
    return out_cos, out_sin

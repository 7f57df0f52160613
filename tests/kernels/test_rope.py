"""RoPE tables: exact float64 angles, relative-position scores for both pairings, StreamingLLM sink distances."""
from __future__ import annotations

from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.rope import apply_rope, rope_inv_freq, rope_tables, sink_query_positions

PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")


def exact_angle(u: int, theta: float) -> Fraction:
    return Fraction(u) * Fraction(theta)  # both exact: the float64 theta is a dyadic rational


def reduced(angle: Fraction) -> float:
    """angle mod 2*pi, to far better than float64, by argument reduction in 80-digit decimals."""
    getcontext().prec = 80
    a = Decimal(angle.numerator) / Decimal(angle.denominator)
    return float(a - (a / (2 * PI)).to_integral_value(rounding="ROUND_FLOOR") * 2 * PI)


def rotate(x, positions, inv_freq, pairing, dtype=np.float32):
    t, half = len(positions), inv_freq.shape[0]
    cos, sin = rope_tables(np.array(positions, dtype=np.int64), inv_freq,
                           np.empty((t, half), dtype), np.empty((t, half), dtype))
    return apply_rope(x, cos, sin, pairing)


def test_rope_inv_freq_is_base_to_minus_2j_over_d():
    inv = rope_inv_freq(64, 1e5)
    assert inv.dtype == np.float64 and inv.shape == (32,)
    assert inv[0] == 1.0
    assert inv.tolist() == pytest.approx([1e5 ** (-2 * j / 64) for j in range(32)], rel=1e-15)


@pytest.mark.parametrize("u", [10_000_019, 2**31 + 17])
def test_float64_angles_are_exact_where_float32_products_are_off_by_tenths_of_a_radian(u):
    inv = rope_inv_freq(64, 1e5)
    cos, sin = rope_tables(np.array([u], dtype=np.int64), inv, np.empty((1, 32), np.float32),
                           np.empty((1, 32), np.float32))
    ref = [reduced(exact_angle(u, th)) for th in inv.tolist()]
    assert cos.dtype == np.float32
    assert np.abs(cos[0] - np.cos(ref)).max() < 1e-6
    assert np.abs(sin[0] - np.sin(ref)).max() < 1e-6
    # the same angles as float32 products (float32 position times float32 theta)
    angle32 = np.float32(u) * inv.astype(np.float32)
    error32 = [abs(float(Fraction(float(a)) - exact_angle(u, th))) for a, th in zip(angle32, inv.tolist())]
    assert max(error32) > 0.1
    a32 = angle32.astype(np.float64)
    assert np.hypot(np.cos(a32) - np.cos(ref), np.sin(a32) - np.sin(ref)).max() > 0.1  # the rotation is wrong


@settings(max_examples=60, deadline=None)
@given(u=st.integers(0, 2**33), v=st.integers(0, 2**33), pairing=st.sampled_from(["interleaved", "neox"]),
       seed=st.integers(0, 2**32 - 1))
def test_score_depends_only_on_position_difference(u, v, pairing, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, 64))
    inv = rope_inv_freq(64, 1e5)
    m = min(u, v)  # the same pair shifted back to start at 0: float32 tables at huge positions still agree
    far = float(rotate(q, [u], inv, pairing)[0] @ rotate(k, [v], inv, pairing)[0])
    near = float(rotate(q, [u - m], inv, pairing)[0] @ rotate(k, [v - m], inv, pairing)[0])
    assert abs(far - near) < 1e-5 * np.linalg.norm(q) * np.linalg.norm(k)


def test_pairings_differ_by_the_gguf_row_permutation():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8))
    inv = rope_inv_freq(8, 1e4)
    cos, sin = rope_tables(np.array([0, 5, 11]), inv, np.empty((3, 4)), np.empty((3, 4)))
    perm = np.stack([np.arange(4), np.arange(4) + 4], axis=1).reshape(-1)  # halves -> adjacent pairs
    assert np.allclose(apply_rope(x[..., perm], cos, sin, "interleaved"), apply_rope(x, cos, sin, "neox")[..., perm])
    assert not np.allclose(apply_rope(x, cos, sin, "interleaved"), apply_rope(x, cos, sin, "neox"))
    assert np.allclose(np.linalg.norm(apply_rope(x, cos, sin, "neox"), axis=-1), np.linalg.norm(x, axis=-1))


@pytest.mark.parametrize("pairing", ["interleaved", "neox"])
@pytest.mark.parametrize("u", [2, 5, 9, 10, 11, 57, 10_000_000, 2**31 + 3])
def test_sink_query_position_reproduces_streamingllm_cache_distances(u, pairing):
    S, W, D = 4, 6, 16
    inv = rope_inv_freq(D, 1e4)
    # StreamingLLM: keep the sinks and the W most recent positions, number them by their place in the cache
    kept = list(range(min(S, u + 1))) + list(range(max(S, u - W + 1), u + 1))
    cache_pos = {v: i for i, v in enumerate(kept)}
    assert cache_pos[u] == sink_query_positions(np.array([u]), S, W)[0] == min(u, S + W - 1)
    rng = np.random.default_rng(u % 1000)
    q, keys = rng.standard_normal((1, D)), rng.standard_normal((len(kept), D))
    q_cache = rotate(q, [cache_pos[u]], inv, pairing, np.float64)
    want = [float(q_cache[0] @ rotate(k[None], [cache_pos[v]], inv, pairing, np.float64)[0])
            for v, k in zip(kept, keys)]
    # ringspec: keys rotated at their absolute positions; sinks scored against a query rotated at min(u, S+W-1)
    q_abs = rotate(q, [u], inv, pairing, np.float64)[0]
    q_sink = rotate(q, sink_query_positions(np.array([u]), S, W), inv, pairing, np.float64)[0]
    got = [float((q_sink if v < S else q_abs) @ rotate(k[None], [v], inv, pairing, np.float64)[0])
           for v, k in zip(kept, keys)]
    assert np.allclose(got, want, rtol=0, atol=1e-5)


def test_sink_query_positions_fills_int64_buffer_past_int32():
    out = np.empty(4, dtype=np.int64)
    got = sink_query_positions(np.array([0, 7, 8, 2**40], dtype=np.int64), 4, 5, out=out)
    assert got is out and out.tolist() == [0, 7, 8, 8]

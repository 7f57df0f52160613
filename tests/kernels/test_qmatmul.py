"""The native quantized matmul's scalar reference against independent references, and its Python face.

References: tests/quant_reference.py (llama.cpp's dequantize_row_* transcribed as float64 loops, apart from the
kernel) for the weights, and a numpy transcription of the stated activation quantization (kernels/qmatmul.py: int8
per block of 32 or 256, d = amax/127, round to nearest even). Dot products over them in float64 are what the kernel
computes up to its float32 rounding, whose bound is derived in `float_bound`; against the unquantized activations
the kernel is within the quantization's stated bound, amax/254 a value. Every SIMD path equals this reference bit
for bit: tests/kernels/test_qmatmul_paths.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernels import qmatmul
from tests.models.test_quant import EXTREME_F16, random_blocks, with_scales
from tests.quant_reference import weight_terms

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason=qmatmul.MISSING or "built")
TYPES = qmatmul.TYPES
EPS = 2.0 ** -23


def quantized(x: np.ndarray, block: int) -> np.ndarray:
    """The activations as the kernel quantizes them, in float64: d * q per value (numpy, written apart)."""
    xb = x.reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint(xb * (np.float32(127) / amax)), -127, 127)
    q = np.where(amax > 0, q, 0)
    d = (amax / np.float32(127)).astype(np.float32)
    if block == 32:                             # stored as float16, as llama.cpp's Q8_0/Q8_1 (within its range)
        d = np.where(d <= 65504, d.astype(np.float16).astype(np.float32), d)
    return (d.astype(np.float64) * q).reshape(x.shape)


def terms(raw: np.ndarray, qtype: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    main, offset = weight_terms(raw.tobytes(), qtype, n, k)
    return np.array(main), np.array(offset)


def float_bound(main: np.ndarray, offset: np.ndarray, xq: np.ndarray, qtype: str) -> np.ndarray:
    """|kernel - exact| per element: each block's term is a few roundings of its exact value (dx*d, the integer to
    float, the product, the K-quants' difference: 4 at most) and the sum over nb blocks adds one rounding of the
    partial sum a block: (nb + 4) eps of the sum of the terms' magnitudes."""
    nb = main.shape[1] // qmatmul.BLOCK_WEIGHTS[qtype]
    return (nb + 4) * EPS * (np.abs(xq) @ (np.abs(main) + np.abs(offset)).T)


def run(raw, qtype, x, path="scalar", threads=1):
    out = np.zeros((x.shape[0], raw.shape[0]), np.float32)
    assert qmatmul.matmul(raw, qtype, x, out, threads=threads, path=path) == path
    return out


@pytest.mark.parametrize("qtype", TYPES)
def test_the_reference_equals_float64_dots_over_the_formats_weights_and_the_quantized_activations(qtype):
    rng = np.random.default_rng(TYPES.index(qtype))
    n, k = 6, 512
    raw = random_blocks(rng, qtype, n * k // qmatmul.BLOCK_WEIGHTS[qtype]).reshape(n, -1)
    main, offset = terms(raw, qtype, n, k)
    x = (rng.standard_normal((3, k)) * [[1e-3], [1.0], [300.0]]).astype(np.float32)
    xq = quantized(x, qmatmul.ACT_BLOCK[qtype])
    exact = xq @ (main + offset).T
    got = run(raw, qtype, x)
    assert np.all(np.abs(got - exact) <= float_bound(main, offset, xq, qtype))


@pytest.mark.parametrize("qtype", TYPES)
def test_a_tables_rows_are_the_formats_weights_rounded_once_to_float32(qtype):
    """`rows` (the token table's lookup): every weight is one float32 rounding of its exact value (the products of a
    float16 scale and a code are exact in float32; only the last operation rounds), in any order of ids."""
    rng = np.random.default_rng(60 + TYPES.index(qtype))
    n, k = 7, 512
    raw = random_blocks(rng, qtype, n * k // qmatmul.BLOCK_WEIGHTS[qtype]).reshape(n, -1)
    main, offset = terms(raw, qtype, n, k)
    ids = np.array([3, 0, 6, 3, 5], np.int64)
    got = qmatmul.rows(raw, qtype, ids, np.zeros((len(ids), k), np.float32))
    assert np.array_equal(got, (main + offset)[ids].astype(np.float32))


@pytest.mark.parametrize("qtype", TYPES)
def test_extreme_float16_scales_are_read_exactly(qtype):
    """Subnormal, largest and zero scales: the kernel's own float16 decoding against Python's."""
    rng = np.random.default_rng(40 + TYPES.index(qtype))
    n, k = 5, 256
    raw = with_scales(random_blocks(rng, qtype, n * k // qmatmul.BLOCK_WEIGHTS[qtype]), qtype,
                      EXTREME_F16 * 20).reshape(n, -1)
    main, offset = terms(raw, qtype, n, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    xq = quantized(x, qmatmul.ACT_BLOCK[qtype])
    got = run(raw, qtype, x).astype(np.float64)
    exact = xq @ (main + offset).T
    finite = np.isfinite(exact)
    assert np.all(np.abs(got - exact)[finite] <= float_bound(main, offset, xq, qtype)[finite])


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K", "Q6_K", "Q8_0"])
def test_the_reference_is_within_the_activation_quantizations_stated_bound(qtype):
    """Against the unquantized activations: |x - d q| <= amax/254 + 127 amax 2^-11/127 a value (rounding, and a
    32-block's scale rounded to float16), so the error is at most sum_blocks that * sum |w| over the block, plus the
    float rounding."""
    rng = np.random.default_rng(7)
    n, k = 4, 768
    bw, ab = qmatmul.BLOCK_WEIGHTS[qtype], qmatmul.ACT_BLOCK[qtype]
    raw = random_blocks(rng, qtype, n * k // bw).reshape(n, -1)
    main, offset = terms(raw, qtype, n, k)
    w = main + offset
    x = rng.standard_normal((2, k)).astype(np.float32)
    amax = np.abs(x.reshape(2, -1, ab)).max(axis=-1)                                    # [M, blocks]
    w_abs = np.abs(w).reshape(n, -1, ab).sum(axis=-1)                                   # [N, blocks]
    per_value = amax / 254 + (amax * 2.0 ** -11 if ab == 32 else 0)
    bound = per_value @ w_abs.T + float_bound(main, offset, quantized(x, ab), qtype) + 1e-12
    got = run(raw, qtype, x)
    exact = x.astype(np.float64) @ w.T
    assert np.all(np.abs(got - exact) <= bound)
    assert np.any(np.abs(got - exact) > bound / 100), "the bound is not vacuous: the quantization is seen"


def test_a_non_finite_activation_makes_only_its_rows_outputs_nan():
    rng = np.random.default_rng(3)
    raw = random_blocks(rng, "Q4_K", 16 * 2).reshape(16, -1)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[1, 7] = np.inf
    got = run(raw, "Q4_K", x, path=qmatmul.paths()[0])
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()


def test_bad_shapes_and_types_get_a_readable_error():
    raw = np.zeros((4, 144), np.uint8)
    x, out = np.zeros((1, 256), np.float32), np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="not a type the native kernel reads"):
        qmatmul.matmul(raw, "IQ2_XS", x, out)
    with pytest.raises(ValueError, match="whole number of Q4_K blocks"):
        qmatmul.matmul(raw, "Q4_K", np.zeros((1, 200), np.float32), out)
    with pytest.raises(ValueError, match=r"w must be uint8 \[N, 144\]"):
        qmatmul.matmul(raw[:, :100], "Q4_K", x, out)
    with pytest.raises(ValueError, match="out must hold"):
        qmatmul.matmul(raw, "Q4_K", x, np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="float32"):
        qmatmul.matmul(raw, "Q4_K", x.astype(np.float64), out)
    with pytest.raises(ValueError, match="no path"):
        qmatmul.matmul(raw, "Q4_K", x, out, path="sse9")

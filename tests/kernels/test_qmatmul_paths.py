"""Every SIMD path of the native quantized matmul computes the scalar reference's bits (kernels/native/qmm.h).

The reference itself is held to dequantized dot products by tests/kernels/test_qmatmul.py; here each path this CPU
runs (a path it lacks is skipped, named) is compared with the scalar path bit for bit, as uint32, on random GGUF blocks
with ordinary and extreme float16 scales, activation rows with a NaN, an infinity, all zeros, huge and tiny
magnitudes and equal magnitudes (every int8 code at 127 or +-127: where a saturating pair sum or an overflowing int16
sum would show), row counts across the tile sizes, column counts with tails, and 1..3 threads.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels import qmatmul
from tests.models.test_quant import random_blocks, with_scales

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason=qmatmul.MISSING)

SIMD_PATHS = [p for p in qmatmul._PATH_IDS if p != "scalar"]
TYPES = qmatmul.TYPES
ROWS = (1, 2, 3, 4, 5, 8, 9, 17, 64, 130)
EXTREME = [65504.0, -65504.0, 6e-5, 2.0 ** -24, -(2.0 ** -24), 0.0, -0.0, 1.0, -3.5]


def _need(path: str) -> None:
    if path not in qmatmul.paths():
        pytest.skip(f"this CPU does not run the {path} path (it runs {', '.join(qmatmul.paths())})")


def _weights(rng: np.random.Generator, qtype: str, n: int, k: int) -> np.ndarray:
    """[n, row bytes]: random bytes, half the blocks with ordinary scales, half with every extreme float16 in turn."""
    blocks = random_blocks(rng, qtype, n * k // qmatmul.BLOCK_WEIGHTS[qtype])
    blocks[1::2] = with_scales(blocks[1::2], qtype, itertools.cycle(EXTREME))
    return blocks.reshape(n, -1)


def _activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """m rows: normal ones, and in turn a row with a NaN, one with an infinity, all zeros, huge, tiny (subnormal),
    one value throughout (every code +127: integer sums at their largest), equal magnitudes of random signs, and
    scales mixed block to block."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    specials = [
        lambda r: r.__setitem__(k // 3, np.nan),
        lambda r: r.__setitem__(k - 1, -np.inf),
        lambda r: r.__setitem__(slice(None), 0.0),
        lambda r: r.__imul__(np.float32(3e37)),
        lambda r: r.__imul__(np.float32(1e-42)),
        lambda r: r.__setitem__(slice(None), 1.5),
        lambda r: r.__setitem__(slice(None), np.where(rng.random(k) < 0.5, -2.5, 2.5)),
        lambda r: r.__imul__(np.repeat(np.float32(10.0) ** rng.integers(-30, 30, k // 32), 32).astype(np.float32)),
    ]
    for i in range(1, m, 2):            # every other row special, the first row ordinary
        specials[(i // 2) % len(specials)](x[i])
    return x


def _run(w, qtype, x, path, threads=1, extra=3):
    """out [M, N + extra] with the extra columns preset: the path must leave them alone."""
    out = np.full((x.shape[0], w.shape[0] + extra), 7.0, np.float32)
    ran = qmatmul.matmul(w, qtype, x, out, threads=threads, path=path)
    assert ran == path
    np.testing.assert_array_equal(out[:, w.shape[0]:], 7.0, err_msg=f"{path} wrote past column N")
    return out[:, :w.shape[0]]


def _same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=what)


def _k(qtype: str) -> int:
    return qmatmul.BLOCK_WEIGHTS[qtype] * (3 if qtype.endswith("_K") else 9)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("path", SIMD_PATHS)
def test_every_path_equals_the_scalar_reference_bit_for_bit(path, qtype):
    """Any rows, columns with tails past a tile of 8 (and N < 8), 1..3 threads: the scalar path's bits."""
    _need(path)
    rng = np.random.default_rng(TYPES.index(qtype))
    k = _k(qtype)
    for n in (43, 5):
        w = _weights(rng, qtype, n, k)
        for m in ROWS if n == 43 else (1, 9):
            x = _activations(rng, m, k)
            want = _run(w, qtype, x, "scalar")
            for threads in (1, 2, 3):
                _same_bits(_run(w, qtype, x, path, threads), want, f"{path} {qtype} M={m} N={n} threads={threads}")


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("path", SIMD_PATHS)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(path, qtype):
    """Each row of a 17-row call (tiles of several sizes) equals that row alone, and that row among other rows in
    another order: no path picks anything by the number of rows."""
    _need(path)
    rng = np.random.default_rng(100 + TYPES.index(qtype))
    k = _k(qtype)
    w = _weights(rng, qtype, 27, k)
    x = _activations(rng, 17, k)
    together = _run(w, qtype, x, path)
    order = rng.permutation(17)
    shuffled = _run(w, qtype, np.ascontiguousarray(x[order]), path, threads=2)
    for m in range(17):
        _same_bits(_run(w, qtype, x[m:m + 1], path)[0], together[m], f"{path} {qtype} row {m} alone")
    _same_bits(shuffled, together[order], f"{path} {qtype} rows reordered")

"""The native attention (kernels/attention.py, kernels/native/attn.h): a row's bits are its own, every path's bits are
the reference path's, and the values are attention's, held to a float64 softmax written from the definition.

Shapes are the models' (SmolLM2's 9 heads over 3 of 64, Qwen2.5's 12 over 2 and 14 over 2 of 128), with sink slots
or none, a ring view, a recent section, chains and token trees, float32 and float16 pools, both rotation pairings.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernels import qmatmul
from kernels.attention import Heads, Scratch, attention, reference
from kernels.ring import NEG

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason=qmatmul.MISSING)

SHAPES = {"smollm2": Heads(9, 3, 64, True), "qwen-1.5b": Heads(12, 2, 128, False), "qwen-0.5b": Heads(14, 2, 64,
                                                                                                        False),
          "odd": Heads(5, 1, 24, True)}      # no model's: five heads a group (4 + 1), a head size of 16 + 8


class Case:
    """Random inputs of one pass: T rows, S sinks, C ring slots (some masked), P recent positions, a chain (causal
    over the new rows) or a tree (row r's path: its ancestors 0..r in steps, then itself)."""

    def __init__(self, heads: Heads, T: int, S: int = 4, C: int = 40, P: int = 3, kv=np.float32, tree: bool = False,
                 seed: int = 0):
        rng = np.random.default_rng(seed)
        H, KVH, D = heads.H, heads.KVH, heads.D
        self.heads, self.T, self.kv = heads, T, np.dtype(kv)
        self.qkv = rng.standard_normal((T, (H + 2 * KVH) * D)).astype(np.float32) * 2
        angles = rng.uniform(0, 2 * np.pi, (2, T, D // 2))
        self.tables = tuple(f(a).astype(np.float32) for a in angles for f in (np.cos, np.sin))
        self.sinks = tuple(rng.standard_normal((S, KVH, D)).astype(kv) for _ in range(2))
        self.ring = tuple(rng.standard_normal((C, KVH, D)).astype(kv) for _ in range(2))
        self.recent = tuple(rng.standard_normal((KVH, P, D)).astype(kv) for _ in range(2))
        self.path = None
        if tree:               # row r: ancestors r//2, r//4, ..., 0 (by depth), then itself, then itself again
            paths = []
            for r in range(T):
                chain = [r]
                while chain[-1]:
                    chain.append(chain[-1] // 2)
                chain = chain[::-1]
                paths.append(chain + [r] * (T - len(chain)))
            self.path = np.array(paths, np.int64)
        W = T
        self.mask = np.zeros((T, S + C + P + W), np.float32)
        self.mask[:, S + C // 3:S + C // 2] = NEG                    # ring slots not yet written
        for r in range(T):
            if tree:                                                  # each path entry once: its depth's column
                depth = int(np.argmax(self.path[r] == r))
                self.mask[r, S + C + P + depth + 1:] = NEG
            else:
                self.mask[r, S + C + P + r + 1:] = NEG
        self.new = tuple(np.zeros((KVH, T, D), kv) for _ in range(2))
        self.o = np.zeros((T, H * D), np.float32)

    def run(self, rows=None, threads=1, path="", scratch=None) -> tuple[np.ndarray, ...]:
        R = self.T if rows is None else rows
        self.o.fill(np.nan)
        attention(self.heads, self.qkv, self.tables, self.mask[:R], self.recent, self.sinks, self.ring, *self.new,
                  self.o, rows=R, path=self.path, threads=threads, kernel_path=path, scratch=scratch)
        return self.o[:R].copy(), self.new[0].copy(), self.new[1].copy()

    def prefix(self, n: int) -> "Case":
        """The same inputs cut to the first n rows (a chain: row n-1 sees what it saw among T rows)."""
        other = object.__new__(Case)
        vars(other).update(vars(self))
        S, C, P = self.sinks[0].shape[0], self.ring[0].shape[0], self.recent[0].shape[1]
        other.T, other.qkv, other.tables = n, self.qkv[:n], tuple(t[:n] for t in self.tables)
        other.mask = np.ascontiguousarray(self.mask[:n, :S + C + P + n])
        other.new = tuple(np.zeros_like(a[:, :n]) for a in self.new)
        other.o = np.zeros((n, self.o.shape[1]), np.float32)
        return other


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.dtype == np.float16 else np.uint32)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("kv", [np.float32, np.float16])
@pytest.mark.parametrize("tree", [False, True])
def test_every_path_and_thread_count_gives_the_reference_paths_bits(name, kv, tree):
    case = Case(SHAPES[name], 7, kv=kv, tree=tree)
    ref = case.run(path="scalar")
    for path in qmatmul.paths():
        for threads in (1, 2, 4):
            got = case.run(path=path, threads=threads)
            for a, b in zip(got, ref):
                assert np.array_equal(_bits(a), _bits(b)), (path, threads)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(name, kv):
    """Row r of a 9-row chain equals the last row of the first r + 1 rows' pass, and the rows asked alone (`rows`),
    at 1 and 3 threads: what a verify block and single-token decoding each compute."""
    case = Case(SHAPES[name], 9, kv=kv, seed=1)
    whole = case.run(threads=3)
    for r in range(9):
        for threads in (1, 3):
            alone = case.prefix(r + 1).run(threads=threads)
            assert np.array_equal(_bits(alone[0][r]), _bits(whole[0][r])), (r, threads)
            assert np.array_equal(_bits(alone[1][:, r]), _bits(whole[1][:, r]))
    first = case.run(rows=2)
    assert np.array_equal(_bits(first[0]), _bits(whole[0][:2]))


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("kv", [np.float32, np.float16])
@pytest.mark.parametrize("tree, S", [(False, 4), (True, 4), (False, 0)])
def test_the_output_is_attention_over_the_visible_columns(name, kv, tree, S):
    """Against a float64 softmax over the visible columns (kernels.attention.reference, from the definition): within
    a few float32 roundings (the dot products', the exponential's 2 ulp, the sums'), attending to the new rows' K/V
    as the pool holds them; those within the pool type's rounding of a key rotated in float64."""
    case = Case(SHAPES[name], 6, S=S, kv=kv, tree=tree, seed=2)
    o, k, v = case.run()
    ref_o, ref_k, ref_v = reference(case.heads, case.qkv, case.tables, case.mask, case.recent, case.sinks, case.ring,
                                    path=case.path, new=(k, v))
    assert np.abs(o - ref_o).max() <= 2e-6 * max(1.0, np.abs(ref_o).max())
    tol = 1e-3 if kv == np.float16 else 1e-6                      # K rotated in float32, then rounded to the pool
    assert np.allclose(k.astype(np.float64), ref_k.astype(np.float64), rtol=tol, atol=tol)
    assert np.array_equal(_bits(v), _bits(ref_v))                 # V is stored as it came, rounded once


def test_new_rows_are_rounded_to_a_float16_pool_as_numpy_rounds():
    """Rounding to nearest, ties to even, subnormals, and overflow to infinity from 65520 on."""
    heads = Heads(2, 1, 8, False)
    values = np.array([0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, -70000.0, 6.1e-5, 6.0e-8, 5.96e-8, 2.98e-8,
                       1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 3e-6, -3e-6, 0.1, 1e-20, 2048.5], np.float32)
    for start in range(0, len(values), 8):
        case = Case(heads, 1, S=0, C=1, P=0, kv=np.float16)
        v = np.zeros(8, np.float32)
        chunk = values[start:start + 8]
        v[:len(chunk)] = chunk
        case.qkv[0, 3 * 8:] = v
        _, _, new_v = case.run()
        with np.errstate(over="ignore"):
            assert np.array_equal(_bits(new_v[0, 0]), _bits(v.astype(np.float16))), v


def test_a_masked_column_weighs_nothing_whatever_it_holds():
    """A ring slot no row sees may hold anything (a slot not yet written, a NaN, an infinity in one of a key's values,
    so that its dot is infinite): the output does not change. The masked run shares its blocks of eight columns with
    seen ones (ring slots 13..19 of 40)."""
    case = Case(SHAPES["smollm2"], 3, seed=3)
    before = case.run()[0]
    S, C = case.sinks[0].shape[0], case.ring[0].shape[0]
    for pool in case.ring:
        pool[C // 3 + 2:C // 2] = np.nan
        pool[C // 3, :, 0], pool[C // 3 + 1, :, 5] = np.inf, -np.inf         # the rest of those two slots finite
    assert np.array_equal(_bits(case.run()[0]), _bits(before))
    assert S + C // 3 < case.mask.shape[1] and (case.mask[:, S + C // 3:S + C // 2] == NEG).all()


def test_bad_shapes_get_a_readable_error():
    case = Case(SHAPES["smollm2"], 3)
    with pytest.raises(ValueError, match=r"mask must be float32 \[3, 50\]"):
        attention(case.heads, case.qkv, case.tables, case.mask[:, 1:], case.recent, case.sinks, case.ring, *case.new,
                  case.o)
    with pytest.raises(ValueError, match="one pool type a call"):
        attention(case.heads, case.qkv, case.tables, case.mask, case.recent, case.sinks,
                  tuple(a.astype(np.float16) for a in case.ring), *case.new, case.o)
    with pytest.raises(ValueError, match="multiple of 8"):
        Heads(4, 2, 60, False)
    bad_path = np.full((3, 3), 7, np.int64)
    with pytest.raises(ValueError, match="outside the pass"):
        attention(case.heads, case.qkv, case.tables, case.mask, case.recent, case.sinks, case.ring, *case.new,
                  case.o, path=bad_path)


def test_the_scratch_is_reused_across_calls():
    case, scratch = Case(SHAPES["qwen-1.5b"], 4), Scratch()
    case.run(scratch=scratch)
    buf = scratch.buf
    case.run(rows=2, scratch=scratch)
    assert scratch.buf is buf

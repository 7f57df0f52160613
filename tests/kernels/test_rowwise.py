"""The native pass's row-wise SwiGLU (kernels/native/qmm_ops.c, qmm_avx2.c): its exp is held to float64's exp, every
path's bits to the reference's (and the reference's on AArch64, under qemu, to x86's), and the whole to silu(gate) *
up in float64."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from kernels import qmatmul
from tests.kernels.test_qmatmul_neon import QEMU, cross_compile, needs

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the native kernel is not built")


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of float32's spacing at want (want in float64)."""
    return np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)


def test_swiglus_exp_is_within_two_ulp_of_exp_where_it_is_finite_and_keeps_the_special_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-87.0, 88.0, 200_000), rng.uniform(-1, 1, 20_000), np.linspace(-87, 88, 70_001),
                        [0.0, -0.0, 1e-30, -1e-30, 0.5 * np.log(2), -0.5 * np.log(2)]]).astype(np.float32)
    got, want = qmatmul.expf(x), np.exp(x.astype(np.float64))      # all normal: exp(-87) > 2^-126
    assert _ulps(got, want).max() <= 2.0                            # 0.97 measured over 2.7M values (2026-12-07)
    assert qmatmul.expf(np.float32([0.0]))[0] == 1.0
    special = np.float32([np.inf, -np.inf, 88.5, 1e30, -87.5, -1e30, np.nan])
    got = qmatmul.expf(special)
    assert list(got[:-1]) == [np.inf, 0.0, np.inf, np.inf, 0.0, 0.0] and np.isnan(got[-1])


def _gates(rng, T: int, F: int) -> np.ndarray:
    gu = (rng.standard_normal((T, 2 * F)) * rng.choice([0.1, 3.0, 30.0, 100.0], (T, 2 * F))).astype(np.float32)
    flat = gu.reshape(-1)
    for v in (np.nan, np.inf, -np.inf, 0.0, -0.0, 88.2, -88.2, 87.1, -87.1):  # each SIMD lane meets a special value
        flat[rng.integers(0, flat.size)] = v
    return gu


@pytest.mark.parametrize("F", [1, 7, 8, 9, 16, 37, 1536])
def test_every_swiglu_path_equals_the_reference_bit_for_bit(F):
    rng = np.random.default_rng(F)
    for T in (1, 3):
        gu = _gates(rng, T, F)
        want = qmatmul.swiglu(gu, np.empty((T, F), np.float32), path="scalar")
        for path in qmatmul.paths():
            got = qmatmul.swiglu(gu, np.full((T, F), 7.0, np.float32), path=path)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (path, T)


def test_swiglu_is_silu_of_the_gate_times_up():
    rng = np.random.default_rng(1)
    gu = (rng.standard_normal((4, 2 * 896)) * 4).astype(np.float32)
    got = qmatmul.swiglu(gu, np.empty((4, 896), np.float32))
    g, up = gu[:, :896].astype(np.float64), gu[:, 896:].astype(np.float64)
    want = g / (1 + np.exp(-g)) * up
    assert np.abs(got - want).max() <= 4e-7 * np.abs(want).max()


@needs
def test_the_swiglu_reference_gives_x86s_bits_on_aarch64(tmp_path):
    """kernels/native/qmm_ops.c cross-compiled statically (tests/kernels/swiglu_check.c) and run under qemu-aarch64
    as the RK3588's big core: multiplies, adds, a division and rintf, no fused multiply-add, so the ISA does not
    enter (libm's expf, before, was each platform's own)."""
    exe = cross_compile(tmp_path / "swiglu_check", "swiglu_check.c", "qmm_ops.c", "qmm_ref.c")
    gu = _gates(np.random.default_rng(5), 3, 1000)
    (tmp_path / "in").write_bytes(np.int32([3, 1000]).tobytes() + gu.tobytes())
    run = subprocess.run([QEMU, "-cpu", "cortex-a76", str(exe), str(tmp_path / "in"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    arm = np.frombuffer((tmp_path / "out").read_bytes(), np.float32).reshape(3, 1000)
    x86 = qmatmul.swiglu(gu, np.empty((3, 1000), np.float32), path="scalar")
    assert np.array_equal(arm.view(np.uint32), x86.view(np.uint32))

"""The native attention's reference computes the same bits on AArch64 as on x86: kernels/native/attn.c (with
tests/kernels/attn_check.c) cross-compiled statically and run under qemu-aarch64 as the RK3588's big core, on passes
of the three models' head shapes, against this machine's scalar path. Every float operation is attn.h's (no fused
multiply-add, our own exponential), so the bits do not depend on the ISA. Skipped, with the reason, without the cross
compiler or qemu (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user). No timing is asserted.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from kernels import qmatmul
from tests.kernels.test_attention import SHAPES, Case, _bits
from tests.kernels.test_qmatmul_neon import QEMU, cross_compile, needs

pytestmark = [needs, pytest.mark.skipif(not qmatmul.available(), reason=qmatmul.MISSING)]


@pytest.fixture(scope="module")
def attn_check(tmp_path_factory):
    return cross_compile(tmp_path_factory.mktemp("arm") / "attn_check", "attn_check.c", "attn.c")


def _write(case: Case, path) -> None:
    H, KVH, D = case.heads.H, case.heads.KVH, case.heads.D
    S, C, P = case.sinks[0].shape[0], case.ring[0].shape[0], case.recent[0].shape[1]
    W = 0 if case.path is None else case.path.shape[1]
    head = np.array([case.T, case.T, H, KVH, D, S, C, P, W, int(case.heads.interleaved), int(case.kv == np.float16)],
                    np.int32)
    parts = [head, np.array([1.0 / np.sqrt(D)], np.float32), case.qkv, *case.tables, case.mask]
    parts += [] if case.path is None else [case.path]
    parts += [*case.recent, *case.sinks, *case.ring]
    path.write_bytes(b"".join(np.ascontiguousarray(p).tobytes() for p in parts))


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("kv, tree", [(np.float32, False), (np.float16, True)])
def test_the_attention_reference_gives_x86s_bits_on_aarch64(attn_check, tmp_path, name, kv, tree):
    case = Case(SHAPES[name], 6, kv=kv, tree=tree, seed=4)
    _write(case, tmp_path / "in")
    run = subprocess.run([QEMU, "-cpu", "cortex-a76", str(attn_check), str(tmp_path / "in"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    o, k, v = case.run(path="scalar")
    raw = (tmp_path / "out").read_bytes()
    arm_o = np.frombuffer(raw[:o.nbytes], np.float32).reshape(o.shape)
    arm_k = np.frombuffer(raw[o.nbytes:o.nbytes + k.nbytes], case.kv).reshape(k.shape)
    arm_v = np.frombuffer(raw[o.nbytes + k.nbytes:], case.kv).reshape(v.shape)
    for arm, x86 in ((arm_o, o), (arm_k, k), (arm_v, v)):
        assert np.array_equal(_bits(arm), _bits(x86))

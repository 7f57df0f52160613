"""The NEON dotprod path (kernels/native/qmm_neon.c) equals the scalar reference byte for byte, checked on this x86
machine under user-mode emulation of the RK3588's big core: tests/kernels/qmm_check.c is cross-compiled statically
with the reference and the path, and run by qemu-aarch64. Skipped, with the reason, without the cross compiler or
qemu (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user). About 10 s under emulation; no timing is asserted.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "kernels" / "native"
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")


needs = pytest.mark.skipif(not (CC and QEMU), reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 on PATH "
                                                     "(apt-get install gcc-aarch64-linux-gnu qemu-user)")


def cross_compile(exe: Path, harness: str, *sources: str) -> Path:
    """tests/kernels/`harness` with kernels/native's `sources`, built for AArch64 statically, with the flags setup.py
    gives the module (no fused multiply-add, no fast math); the tests run it under qemu-aarch64."""
    subprocess.run([CC, "-O3", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math", "-static", f"-I{NATIVE}",
                    str(ROOT / "tests" / "kernels" / harness), *(str(NATIVE / s) for s in sources), "-lm", "-o",
                    str(exe)], check=True, capture_output=True, timeout=300)
    return exe


@pytest.fixture(scope="module")
def qmm_check(tmp_path_factory) -> Path:
    """The check, built once for both CPUs."""
    return cross_compile(tmp_path_factory.mktemp("neon") / "qmm_check", "qmm_check.c", "qmm_ref.c", "qmm_neon.c")


@needs
@pytest.mark.parametrize("cpu", ["cortex-a76", "max"])
def test_neon_dotprod_path_equals_the_reference_bit_for_bit_under_qemu(qmm_check, cpu):
    run = subprocess.run([QEMU, "-cpu", cpu, str(qmm_check)], capture_output=True, text=True, timeout=300)
    assert "lacks asimddp" not in run.stdout, f"qemu's {cpu} has no dotprod: the path did not run"
    verdicts = dict(re.findall(r"^(Q\w+) (OK|FAIL):", run.stdout, re.M))
    assert verdicts == {t: "OK" for t in TYPES}, run.stdout
    assert run.returncode == 0, run.stdout + run.stderr

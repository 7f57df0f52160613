"""Builds ringspec's one native extension, the quantized matmul (kernels/native/, loaded by kernels/qmatmul.py).

Everything else about the package is in pyproject.toml. The extension is optional: without a working C compiler the
install still succeeds, says why in one block, and the models run on ONNX Runtime's MatMulNBits (`[model] kernel`).
"""
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("kernels/native")
# -ffp-contract=off: no fused multiply-add, in the reference or any SIMD path (their bits must be equal: qmm.h).
# Each SIMD file sets its own target (#pragma GCC target) and is run only on a CPU that has it.
FLAGS = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing", "-pthread"]


class OptionalBuild(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as e:              # no compiler, no Python headers: say so, install the rest
            self._warn(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            self._warn(e)

    @staticmethod
    def _warn(e: Exception) -> None:
        print(f"\n*** ringspec: the native quantized matmul was not built ({type(e).__name__}: {e}).\n"
              "*** Install a C compiler (Debian: apt-get install build-essential) and rerun `pip install -e .`;\n"
              "*** until then the models run on ONNX Runtime's MatMulNBits (`python run.py doctor` says which).\n",
              file=sys.stderr)


setup(ext_modules=[Extension("kernels._qmm", sources=sorted(str(p) for p in NATIVE.glob("*.c")),
                             depends=[str(p) for p in NATIVE.glob("*.h")], extra_compile_args=FLAGS, extra_link_args=["-pthread"])],
      cmdclass={"build_ext": OptionalBuild})

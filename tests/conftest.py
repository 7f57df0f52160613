"""Shared fixtures: the real default model (fetched once into the shared cache) and paths to shared data."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared"
os.environ.setdefault("RINGSPEC_LLAMA_CPP_BUILD", "0")   # a test's bench never builds llama.cpp (bench/llama_build.py)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    from models.registry import default_model_path
    return default_model_path()


@pytest.fixture(scope="session")
def default_pool_bytes() -> int:
    """Bytes of one K or V element in the default profile's pools: its kernel is "auto", and the default model's
    linears are Q4_1, which the native kernel reads where it is built (float16 pools), else MatMulNBits (float32)."""
    from kernels import qmatmul
    return 2 if qmatmul.available() else 4


@pytest.fixture(scope="session")
def fixture_npz():
    import numpy as np
    path = SHARED / "fixtures" / "llamacpp_smollm2_tep.npz"
    if not path.exists():
        pytest.fail(f"missing {path}: the tests expect ../shared beside the checkout")
    return np.load(path)


@pytest.fixture(scope="session")
def rknn_python() -> Path:
    """rknn-toolkit2's venv (the NPU's converter and simulator), built on first use by bench/build-rknn-env.sh:
    about a minute where pip finds torch 2.13.0's CPU wheel on disk, as on this machine kind. A machine that cannot
    build it (no network) skips the NPU tests with the reason, unless CI is set: then they fail."""
    import os
    import subprocess
    from models.registry import rknn_python as where
    python = where()
    if not python.exists():
        proc = subprocess.run(["bash", str(ROOT / "bench" / "build-rknn-env.sh"), str(python.parents[1])],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not python.exists():
            reason = f"bench/build-rknn-env.sh failed: {(proc.stderr or proc.stdout)[-1500:]}"
            if os.environ.get("CI"):
                pytest.fail(reason)
            pytest.skip(reason)
    return python


def pytest_collection_modifyitems(config, items):
    """The two tiers. A test on the real model (it asks for `default_gguf`, itself or through a fixture) or in the NPU
    toolkit's venv belongs to the integration tier, marked `slow` like the tests marked by hand; the rest, on tiny
    models and plain arrays, is the fast tier (`pytest -m "not slow"`), which needs no torch, transformers or ray
    (an ARM64 gateway runs it: bench/arm64-rootfs.sh). CI runs both. A third tier, `pair` (tests/models/test_pair.py,
    the Qwen2.5 1.5B target and 0.5B draft), runs only with `-m pair`."""
    for item in items:
        if {"default_gguf", "rknn_python"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # The pair tier runs only when asked for by name (-m pair): the default suite never fetches its 1.6 GB.
    if "pair" not in (config.option.markexpr or ""):
        skip = pytest.mark.skip(reason="the Qwen2.5 pair tier: python -m pytest -m pair")
        for item in items:
            if "pair" in item.keywords:
                item.add_marker(skip)

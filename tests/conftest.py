"""Shared fixtures: the real default model (fetched once into the shared cache) and paths to shared data."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    from models.registry import default_model_path
    return default_model_path()


@pytest.fixture(scope="session")
def fixture_npz():
    import numpy as np
    path = SHARED / "fixtures" / "llamacpp_smollm2_tep.npz"
    if not path.exists():
        pytest.fail(f"missing {path}: the tests expect ../shared beside the checkout")
    return np.load(path)

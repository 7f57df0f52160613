"""GGUF files: open, validate and describe a llama-family model (llama, qwen2).

Owns reading the header, the architecture hyper-parameters and the raw tensor blocks. Never builds graphs, never
dequantizes for inference (the converter decides what stays quantized), never touches streams.

The header is walked here with `struct` over a memory map (`read_header`), every length checked against the file:
the `gguf` package's GGUFReader builds a numpy view per part of every metadata value, ~147,000 of them for the
tokenizer of a 151k vocabulary, which took 5.9 of a native start's 6.0 s (docs/kernel.md). Layout: the GGUF
specification (ggml's docs/gguf.md): magic, version, tensor count, metadata count; key-value pairs; tensor infos
(name, dims innermost first, type, offset from the aligned data start).
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_LAZY = "tokenizer."          # metadata GGUFModel reads only on request: the vocabulary and merges, most of a header
SUPPORTED_ARCHS = {"llama": "interleaved", "qwen2": "neox"}  # architecture -> RoPE pairing


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the reason in words."""


_SCALARS = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
            12: "<f8"}                                  # GGUF value type -> numpy dtype; 8 is a string, 9 an array
_STRING, _ARRAY = 8, 9
_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}      # a tensor of these is its elements; any other type, its bytes


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str                   # GGML type name: "Q4_K", "F32", ...
    shape: tuple[int, ...]      # numpy order: (rows, cols) = (out_features, in_features) for a weight
    offset: int                 # of its first byte in the file
    nbytes: int


@dataclass(frozen=True)
class Header:
    version: int
    meta: dict[str, object]     # the kept keys' values: int, float, bool, str or a list of them
    tensors: dict[str, TensorInfo]


def read_header(path: str | os.PathLike, keep: Callable[[str], bool] = lambda key: True) -> Header:
    """The metadata values of the keys `keep` accepts (the others skipped by their lengths) and the tensor table of a
    little-endian GGUF v2/v3. Raises GGUFError naming the file and what is wrong; reads nothing past its end."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise GGUFError(f"{path}: truncated: {size} bytes, shorter than a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            walk = _Walk(buf, size, path)
            try:
                return walk.header(keep)
            except UnicodeDecodeError as exc:
                raise GGUFError(f"{path}: corrupt GGUF: a string at byte {walk.at} is not UTF-8 ({exc.reason})")


class _Walk:
    """A cursor over the header's bytes: each read checked against the file's end."""

    def __init__(self, buf, size: int, path):
        self.buf, self.size, self.path, self.at = buf, size, path, 0

    def take(self, n: int) -> int:
        if n < 0 or self.at + n > self.size:
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF: the header needs bytes {self.at}..{self.at + n} "
                            f"but the file has {self.size}")
        self.at += n
        return self.at - n

    def unpack(self, fmt: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))

    def string(self, decode: bool = True) -> str | None:
        (n,) = self.unpack("<Q")
        at = self.take(n)
        return self.buf[at:at + n].decode("utf-8") if decode else None

    def value(self, kind: int, decode: bool):
        if kind == _STRING:
            return self.string(decode)
        if kind in _SCALARS:
            at = self.take(np.dtype(_SCALARS[kind]).itemsize)
            return np.frombuffer(self.buf, _SCALARS[kind], 1, at)[0].item() if decode else None
        if kind != _ARRAY:
            raise GGUFError(f"{self.path}: corrupt GGUF: value type {kind} at byte {self.at - 4} is not one of GGUF's")
        item, n = self.unpack("<IQ")
        if item in _SCALARS:
            at = self.take(n * np.dtype(_SCALARS[item]).itemsize)
            return np.frombuffer(self.buf, _SCALARS[item], n, at).tolist() if decode else None
        if item != _STRING:
            raise GGUFError(f"{self.path}: corrupt GGUF: an array of type {item} at byte {self.at - 12} (arrays hold "
                            "numbers or strings)")
        values = [self.string(decode) for _ in range(n)]    # each at least 8 bytes: n is bounded by the file
        return values if decode else None

    def header(self, keep: Callable[[str], bool]) -> Header:
        magic, version, n_tensors, n_kv = self.unpack("<4sIQQ")
        if magic != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic bytes)")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (2 and 3 are; a big-endian file "
                            "reads as a huge version)")
        if 24 + 13 * n_kv + 32 * n_tensors > self.size:     # the smallest entry and tensor info: 13 and 32 bytes
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF: its header counts {n_tensors} tensors and {n_kv} "
                            f"metadata entries, more than {self.size} bytes can hold")
        meta = {}
        for _ in range(n_kv):
            key = self.string()
            (kind,) = self.unpack("<I")
            wanted = keep(key) or key == "general.alignment"
            value = self.value(kind, wanted)
            if wanted:
                meta[key] = value
        alignment = meta.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0:
            raise GGUFError(f"{self.path}: corrupt GGUF: general.alignment is {alignment!r}")
        infos = [self.tensor_info() for _ in range(n_tensors)]
        start = -(-self.at // alignment) * alignment
        tensors = {}
        for name, dims, type_id, offset in infos:
            if name in tensors:
                raise GGUFError(f"{self.path}: corrupt GGUF: tensor {name!r} is listed twice")
            try:
                kind = GGMLQuantizationType(type_id)
                block, block_bytes = GGML_QUANT_SIZES[kind]
            except (ValueError, KeyError):
                raise GGUFError(f"{self.path}: tensor {name!r} has type {type_id}, not a GGML type this reader knows")
            n = int(np.prod(dims, dtype=object))
            if dims[0] % block:                              # dims: 1 to 4 of them (tensor_info)
                raise GGUFError(f"{self.path}: corrupt GGUF: tensor {name!r} rows of {dims[0]} are not whole "
                                f"{kind.name} blocks of {block}")
            tensors[name] = TensorInfo(name, kind.name, tuple(reversed(dims)), start + offset, n // block * block_bytes)
        return Header(version, meta, tensors)

    def tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string()
        (n_dims,) = self.unpack("<I")
        if not 1 <= n_dims <= 4:
            raise GGUFError(f"{self.path}: corrupt GGUF: tensor {name!r} has {n_dims} dimensions (1 to 4 are possible)")
        dims = self.unpack(f"<{n_dims}Q")
        type_id, offset = self.unpack("<IQ")
        return name, dims, type_id, offset


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float
    rope_pairing: str          # "interleaved" (llama GGUF: Q/K rows permuted for adjacent pairs) or "neox" (qwen2)
    qkv_bias: bool
    tied_embeddings: bool

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


class GGUFModel:
    """An opened GGUF: `config`, `field(name)`, `tensor(name)` (raw blocks as stored), `tensor_type(name)`,
    `tensor_shape(name)` and `tensors` (the table). The tokenizer's metadata is read only when asked for."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise GGUFError(f"{self.path}: no such file")
        header = read_header(self.path, keep=lambda key: not key.startswith(_LAZY))
        self._meta, self.tensors, self._lazy_read = header.meta, header.tensors, False
        self._file = np.memmap(self.path, np.uint8, mode="r")
        for t in self.tensors.values():
            if t.offset + t.nbytes > self._file.size:
                raise GGUFError(f"{self.path}: truncated: tensor {t.name!r} ends at byte {t.offset + t.nbytes} but "
                                f"the file has {self._file.size}")
        self.config = self._read_config()

    def field(self, name: str, default=None):
        if name.startswith(_LAZY) and not self._lazy_read:
            self._meta.update(read_header(self.path, keep=lambda key: key.startswith(_LAZY)).meta)
            self._lazy_read = True
        return self._meta.get(name, default)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> np.ndarray:
        """Its elements (a float or integer type) or its bytes, one row of blocks a row (a quantized type): a view of
        the mapped file."""
        t = self._info(name)
        data = self._file[t.offset:t.offset + t.nbytes]
        if t.type in _FLOAT_TYPES:
            return data.view(_FLOAT_TYPES[t.type]).reshape(t.shape)
        return data.reshape(*t.shape[:-1], -1)

    def tensor_type(self, name: str) -> str:
        return self._info(name).type

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Numpy order: (rows, cols) = (out_features, in_features) for a weight."""
        return self._info(name).shape

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing")
        return self.tensors[name]

    def _read_config(self) -> ModelConfig:
        arch = self.field("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise GGUFError(f"{self.path}: architecture {arch!r} is not supported (supported: "
                            f"{', '.join(SUPPORTED_ARCHS)})")

        def get(key: str, kind: type = int, default=None):
            value = self.field(f"{arch}.{key}", default)
            if value is None:
                raise GGUFError(f"{self.path}: metadata {arch}.{key} is missing")
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
                raise GGUFError(f"{self.path}: metadata {arch}.{key} is {value!r}, not a positive {kind.__name__}")
            return kind(value)

        n_heads, d_model = get("attention.head_count"), get("embedding_length")
        n_kv_heads = get("attention.head_count_kv", default=n_heads)
        if n_heads % n_kv_heads:
            raise GGUFError(f"{self.path}: {n_heads} attention heads do not share {n_kv_heads} key/value heads evenly")
        return ModelConfig(
            arch=arch, n_layers=get("block_count"), d_model=d_model, d_ff=get("feed_forward_length"),
            n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=get("rope.dimension_count", default=d_model // n_heads),
            vocab_size=self.tensor_shape("token_embd.weight")[0], context_length=get("context_length", default=2048),
            rope_base=get("rope.freq_base", float, 10000.0), rms_eps=get("attention.layer_norm_rms_epsilon", float),
            rope_pairing=SUPPORTED_ARCHS[arch], qkv_bias=self.has_tensor("blk.0.attn_q.bias"),
            tied_embeddings=not self.has_tensor("output.weight"))

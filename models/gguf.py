"""GGUF files: open, validate and describe a llama-family model (llama, qwen2).

Owns reading the header, the architecture hyper-parameters and the raw tensor blocks. Never builds graphs, never
dequantizes for inference (the converter decides what stays quantized), never touches streams.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

SUPPORTED_ARCHS = {"llama": "interleaved", "qwen2": "neox"}  # architecture -> RoPE pairing


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the reason in words."""


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
    """An opened GGUF: `config`, `field(name)`, `tensor(name)` (raw blocks as stored) and `tensor_type(name)`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise GGUFError(f"{self.path}: no such file")
        with open(self.path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise GGUFError(f"{self.path}: not a GGUF file (bad magic bytes)")
        try:
            self.reader = GGUFReader(self.path)
        except Exception as exc:  # the reader raises assorted errors on truncated files; name the file and cause
            raise GGUFError(f"{self.path}: corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None
        self._tensors = {t.name: t for t in self.reader.tensors}
        self._check_complete()
        self.config = self._read_config()

    def field(self, name: str, default=None):
        f = self.reader.fields.get(name)
        if f is None:
            return default
        return f.contents()

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> np.ndarray:
        if name not in self._tensors:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing")
        return self._tensors[name].data

    def tensor_type(self, name: str) -> str:
        return self._tensors[name].tensor_type.name

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Numpy order: (rows, cols) = (out_features, in_features) for a weight."""
        return tuple(int(s) for s in reversed(self._tensors[name].shape.tolist()))

    def _check_complete(self) -> None:
        size = self.path.stat().st_size
        for t in self.reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise GGUFError(f"{self.path}: truncated: tensor {t.name!r} ends at byte {end} but the file has {size}")

    def _read_config(self) -> ModelConfig:
        arch = self.field("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise GGUFError(f"{self.path}: architecture {arch!r} is not supported (supported: "
                            f"{', '.join(SUPPORTED_ARCHS)})")

        def need(key):
            value = self.field(f"{arch}.{key}")
            if value is None:
                raise GGUFError(f"{self.path}: metadata {arch}.{key} is missing")
            return value

        n_heads, d_model = int(need("attention.head_count")), int(need("embedding_length"))
        head_dim = int(self.field(f"{arch}.rope.dimension_count", d_model // n_heads))
        vocab = self.tensor_shape("token_embd.weight")[0]
        return ModelConfig(
            arch=arch, n_layers=int(need("block_count")), d_model=d_model, d_ff=int(need("feed_forward_length")),
            n_heads=n_heads, n_kv_heads=int(self.field(f"{arch}.attention.head_count_kv", n_heads)),
            head_dim=head_dim, vocab_size=vocab, context_length=int(self.field(f"{arch}.context_length", 2048)),
            rope_base=float(self.field(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=float(need("attention.layer_norm_rms_epsilon")), rope_pairing=SUPPORTED_ARCHS[arch],
            qkv_bias=self.has_tensor("blk.0.attn_q.bias"), tied_embeddings=not self.has_tensor("output.weight"))

"""A pass on ringspec's own kernels: the runner's layer loop over the native matmul and the native attention.

Owns the native pass (`[model] kernel = "native"`): the GGUF's quantized tensors read as stored (memory-mapped: the
resident weights are the file's pages, not a packed copy), every linear on `kernels.qmatmul`, each stream's attention
on `kernels.attention` (sinks, ring, recent section, new rows or a token tree's paths, float32 or float16 pools read
in place), the row-wise norms, SwiGLU, embedding and surprisal in the same native module. It speaks the whole-model
session's contract: the same input and output names bound the same way (`NativeSession.io_binding()`), so
models/runner.py and models/streams.py drive it unchanged. Never decides what a pass holds: the runner binds, this
computes.

Why a layer loop of our own (issue 56's spike, figures in docs/models.md): a custom op inside the graph through
onnxruntime-extensions' PyOp cost 186 us a call at 1 row and 749 us at 4 (113 calls a 1.5B pass: 21-85 ms, more
than the pass). Attention was one ONNX Runtime session a layer until it cost a fifth of the 1.5B's pass (13.1 ms of
72.5 and 2.2 ms binding it, on an AVX2 EPYC: docs/kernel.md); it is native now.

Exactness: every linear, row-wise operation and attention row is computed in one fixed order whatever the rows beside
it, the threads or the SIMD path (kernels/native/qmm.h, attn.h), so a lone row needs no padding row (the runner gives
none on this kernel).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernels import attention, qmatmul

from .convert import LAYER_LINEARS, head_source, linear_sources
from .gguf import GGUFModel
from .graph import planted_fault


class NativeUnavailable(RuntimeError):
    """The native pass cannot run this model here (the kernel not built, a weight type it does not read)."""


def unreadable(card: dict) -> str:
    """Why the native pass cannot run this converted model here ("" when it can): the kernel not built, the GGUF it
    was converted from gone, or a linear of a type the kernel does not read (a float32 or float16 weight). `[model]
    kernel = "auto"` runs MatMulNBits then (models/runner.py `RunnerOptions.resolved`)."""
    if not qmatmul.available():
        return qmatmul.MISSING
    source = Path(card["source"]["path"])
    if not source.exists():
        return (f"the native pass reads the GGUF the model was converted from, {source}, which is gone: convert the "
                f"model again, or use [model] kernel = \"nbits\"")
    stat = source.stat()
    return _unread_types(str(source), stat.st_size, stat.st_mtime_ns, card["config"]["n_layers"],
                         card["config"]["tied_embeddings"])


@functools.lru_cache(maxsize=16)
def _unread_types(source: str, size: int, mtime_ns: int, n_layers: int, tied: bool) -> str:
    """The first linear of `source` the kernel does not read, said ("" if none); keyed by the file's size and time."""
    model = GGUFModel(source)
    for name in linear_sources(n_layers, tied):
        if model.tensor_type(name) not in qmatmul.BLOCK_BYTES:
            return (f"{Path(source).name}: {name} is {model.tensor_type(name)}, a type the native kernel does not read "
                    f"({', '.join(qmatmul.TYPES)}); use [model] kernel = \"nbits\"")
    return ""


@dataclass
class Part:
    qtype: str
    w: np.ndarray             # uint8 [N, row bytes]: the GGUF tensor's rows as stored (a view of the mapped file)
    col: int                  # its first output column in the linear's output


@dataclass
class Linear:
    K: int
    N: int
    parts: list[Part]
    bias: np.ndarray | None   # float32 [N]

    def __post_init__(self):
        self.weights = qmatmul.weights([(p.w, p.qtype, p.col) for p in self.parts], self.K)   # checked once; one
        self.nbytes = sum(p.w.nbytes for p in self.parts)                                    # call: x quantized once


def _quantized(model: GGUFModel, name: str) -> tuple[str, np.ndarray]:
    qtype = model.tensor_type(name)
    rows, k = model.tensor_shape(name)
    raw = np.asarray(model.tensor(name))
    return qtype, raw.reshape(rows, k // qmatmul.BLOCK_WEIGHTS[qtype] * qmatmul.BLOCK_BYTES[qtype])


class NativeWeights:
    """Every linear of a converted model, read from the GGUF it was converted from; norms and biases from the
    converted weights (float32, small)."""

    def __init__(self, model_dir: Path, card: dict):
        if reason := unreadable(card):
            raise NativeUnavailable(reason)
        self.gguf = GGUFModel(card["source"]["path"])   # dropped after: the tensors' views hold the mapped file
        self._stored = np.memmap(model_dir / "weights.bin", np.uint8, mode="r")
        self.card = card
        cfg = card["config"]
        self.layers = []
        for i, layer in enumerate(card["layers"]):
            linears = {key: self._linear([f"blk.{i}.{s}.weight" for s in sources], layer[key])
                       for key, sources in LAYER_LINEARS.items()}
            self.layers.append((self.stored(layer["attn_norm"]), self.stored(layer["ffn_norm"]), linears))
        self.head = self._linear([head_source(cfg["tied_embeddings"])], card["linears"][card["head"]])
        self.output_norm = self.stored(card["output_norm"])
        emb_type = self.gguf.tensor_type("token_embd.weight")
        if emb_type in qmatmul.BLOCK_BYTES:
            self.embed_type, self.embed = _quantized(self.gguf, "token_embd.weight")
        else:                                   # a float table: its rows as float32, gathered by numpy
            self.embed_type, self.embed = "", np.asarray(self.gguf.tensor("token_embd.weight"))
        del self.gguf

    def stored(self, name: str) -> np.ndarray:
        meta = self.card["tensors"][name]
        return self._stored[meta["offset"]:meta["offset"] + meta["nbytes"]].view(meta["dtype"]).reshape(meta["shape"])

    def _linear(self, sources: list[str], spec: dict) -> Linear:
        parts, col = [], 0
        for name in sources:
            qtype, w = _quantized(self.gguf, name)
            parts.append(Part(qtype, w, col))
            col += w.shape[0]
        if col != spec["N"]:
            raise NativeUnavailable(f"{sources}: {col} output rows in the GGUF, {spec['N']} in the card: convert again")
        return Linear(spec["K"], spec["N"], parts, self.stored(spec["bias"]) if spec.get("bias") else None)


class _Address:
    """Memory at an address, as numpy reads it (the array interface, protocol 3): writable, C order."""

    def __init__(self, typestr: str, shape: tuple, ptr: int):
        self.__array_interface__ = {"version": 3, "typestr": typestr, "shape": shape, "data": (ptr, False)}


class NativeBinding:
    """The whole-model session's IOBinding, recorded: each name's array, a view of the address bound. A name bound
    again at the same address, type and shape keeps its view (the pools, the outputs: most names every pass); a
    moved one (a ring view, a mask of another width) gets a new view in place of the old, so the binding holds one
    view a name however long it runs."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self._bound: dict[str, tuple] = {}          # name -> (typestr, shape, address) of its view

    def bind_input(self, name: str, device: str, device_id: int, dtype, shape, ptr: int) -> None:
        key = (np.dtype(dtype).str, tuple(shape), ptr)
        if self._bound.get(name) != key:
            # through the array interface: a ctypes array of the size would add a type to ctypes' own cache, never
            # emptied, for every new size (masks and ring views come in thousands)
            self.arrays[name], self._bound[name] = np.asarray(_Address(*key)), key

    bind_output = bind_input


class NativeSession:
    """Runs a pass bound through `io_binding()` (the graph's names, models/graph.py `build_graph`)."""

    def __init__(self, model_dir: Path, card: dict, sink: int, ring: int, threads: int, kv_dtype: str = "float32",
                 tree: bool = False, streams: int = 1):
        self.weights = NativeWeights(Path(model_dir), card)
        self.cfg = cfg = card["config"]
        self.threads, self.streams, self.sink = threads, streams, sink
        self.heads = attention.Heads(cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"],
                                     cfg["rope_pairing"] == "interleaved")
        self.tags = [""] if streams == 1 else [f".s{n}" for n in range(streams)]
        self.pools = [[tuple(f"{pool}.{i}{tag}" for pool in ("sink_k", "sink_v", "ring_k", "ring_v"))
                       for tag in self.tags] for i in range(cfg["n_layers"])]      # layer -> stream -> pools' names
        no_sinks = np.zeros((0, cfg["n_kv_heads"], cfg["head_dim"]), kv_dtype)
        self.no_sinks = (no_sinks, no_sinks)
        self.scratch = qmatmul.Scratch()
        self.attention_scratch = attention.Scratch()
        self._rows = 0
        self._fault = planted_fault()
        self.timing: dict[str, list] | None = None   # label -> [seconds, calls, bytes read]: bench/opprofile.py
        self._t = 0.0

    def io_binding(self) -> NativeBinding:
        return NativeBinding()

    def _buffers(self, T: int) -> None:
        """Activations for T rows, grown (never per pass) when a larger pass comes."""
        if T <= self._rows:
            return
        cfg = self.cfg
        d, F, H, KVH, D = cfg["d_model"], cfg["d_ff"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        self._rows = T
        self.h, self.x = np.zeros((T, d), np.float32), np.zeros((T, d), np.float32)
        self.delta = np.zeros((T, d), np.float32)
        self.qkv = np.zeros((T, (H + 2 * KVH) * D), np.float32)
        self.o = np.zeros((T, H * D), np.float32)
        self.gate_up, self.act = np.zeros((T, 2 * F), np.float32), np.zeros((T, F), np.float32)

    def linear(self, lin: Linear, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        qmatmul.run(lin.weights, x, out, threads=self.threads, scratch=self.scratch)
        if self.timing is not None:
            self._tick(f"matmul {'+'.join(p.qtype for p in lin.parts)} K{lin.K} N{lin.N}", lin.nbytes)
        if lin.bias is not None:
            out += lin.bias
        return out

    def _tick(self, label: str, nbytes: int = 0) -> None:
        """Profiling only: the time since the last tick goes to `label`."""
        now = time.perf_counter()
        entry = self.timing.setdefault(label, [0.0, 0, 0])
        entry[0] += now - self._t
        entry[1] += 1
        entry[2] += nbytes
        self._t = now

    def run_with_iobinding(self, io: NativeBinding) -> None:
        a, cfg, w = io.arrays, self.cfg, self.weights
        timed = self.timing is not None
        if timed:
            self._t = time.perf_counter()
        ids = a["input_ids"]
        T, eps = len(ids), cfg["rms_eps"]
        self._buffers(T)
        h, x, delta = self.h[:T], self.x[:T], self.delta[:T]
        qkv, o = self.qkv[:T], self.o[:T]
        gate_up, act = self.gate_up[:T], self.act[:T]
        if w.embed_type:
            qmatmul.rows(w.embed, w.embed_type, ids, h)
        else:
            h[:] = w.embed[ids]
        if self._fault:            # the planted fault of the exactness tests (models/graph.py `planted_fault`)
            h += np.float32(self._fault * T)
        KVH = cfg["n_kv_heads"]
        new_k, new_v = a["new_k"], a["new_v"]
        streams = self._streams(a, T)
        for i, (attn_norm, ffn_norm, lin) in enumerate(w.layers):
            qmatmul.rmsnorm(h, attn_norm, eps, x)
            self.linear(lin["qkv"], x, qkv)
            if timed:
                self._tick("norms, residual, embedding")
            self._attend(a, i, streams, qkv, o, new_k[i * KVH:(i + 1) * KVH], new_v[i * KVH:(i + 1) * KVH])
            if timed:
                self._tick("attention")
            self.linear(lin["o"], o, delta)
            h += delta
            qmatmul.rmsnorm(h, ffn_norm, eps, x)
            self.linear(lin["gate_up"], x, gate_up)
            qmatmul.swiglu(gate_up, act)
            if timed:
                self._tick("norms, residual, embedding")
            self.linear(lin["down"], act, delta)
            h += delta
        rows, logits = a["logit_rows"], a["logits"][0]
        M = len(rows)
        once = M == 2 and rows[0] == rows[1]               # the runner's 1-row head, its row twice: computed once
        m = 1 if once else M
        np.take(h, rows[:m], axis=0, out=self.delta[:m])
        qmatmul.rmsnorm(self.delta[:m], w.output_norm, eps, self.x[:m])
        self.linear(w.head, self.x[:m], logits[:m])
        if once:
            logits[1] = logits[0]
        if "nll" in a:
            qmatmul.nll(logits, a["targets"], a["nll"])
        if timed:
            self._tick("head rows, surprisal")

    def _streams(self, a: dict, T: int) -> list[tuple]:
        """What each stream's attention reads in every layer of this pass: (its first row, rows, tables, mask,
        recent pools, path), each stream's rows in slot order (its mask's rows), as the runner bound them."""
        tables, t0, out = (a["cos"], a["sin"], a["cos_sink"], a["sin_sink"]), 0, []
        for tag in self.tags:
            mask = a[f"mask{tag}"]
            t1 = t0 + len(mask)
            out.append((t0, t1, tuple(t[t0:t1] for t in tables), mask, a[f"recent_k{tag}"], a[f"recent_v{tag}"],
                        a.get(f"path{tag}")))
            t0 = t1
        if t0 != T:
            raise ValueError(f"the streams' masks hold {t0} rows, the pass {T}")
        return out

    def _attend(self, a: dict, i: int, streams: list[tuple], qkv: np.ndarray, o: np.ndarray, new_k: np.ndarray,
                new_v: np.ndarray) -> None:
        """Layer i's attention, stream by stream, against its own pools, recent section and path. The first
        layer's calls are checked with readable errors; the later layers' have the same shapes and types."""
        KVH = self.cfg["n_kv_heads"]
        heads = slice(i * KVH, (i + 1) * KVH)                      # layer i's kv heads in a recent section
        for (t0, t1, tables, mask, recent_k, recent_v, path), names in zip(streams, self.pools[i]):
            sinks = (a[names[0]], a[names[1]]) if self.sink else self.no_sinks
            attention.attention(self.heads, qkv[t0:t1], tables, mask, (recent_k[heads], recent_v[heads]), sinks,
                                (a[names[2]], a[names[3]]), new_k, new_v, o[t0:t1], first=t0, path=path,
                                threads=self.threads, scratch=self.attention_scratch, checked=i > 0)

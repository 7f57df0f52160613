"""A pass on ringspec's own quantized matmul: the runner's layer loop, ONNX Runtime for attention only.

Owns the native pass (`[model] kernel = "native"`): the GGUF's quantized tensors read as stored (memory-mapped: the
resident weights are the file's pages, not a packed copy), every linear on `kernels.qmatmul`, the row-wise norms,
SwiGLU, embedding and surprisal in the same native module, and one ONNX Runtime session of one layer's attention
(models/graph.py `build_attention_graph`) run once a layer. It speaks the whole-model session's contract: the same
input and output names bound the same way (`NativeSession.io_binding()`), so models/runner.py and models/streams.py
drive it unchanged. Never decides what a pass holds: the runner binds, this computes.

Why this split (issue 56's spike, /work figures in docs/models.md): a custom op inside the graph through
onnxruntime-extensions' PyOp cost 186 us a call at 1 row and 749 us at 4 (113 calls a 1.5B pass: 21-85 ms, more
than the pass), while a session run through IOBinding costs ~6 us: so the runner loops over layers itself.

Exactness: every linear and row-wise operation computes each row in one fixed order whatever the rows beside it
(kernels/native/qmm.h); attention is the whole-model graph's own nodes, whose rows are batch invariant from 2 rows
(the runner's padding rule still gives a 1-row pass its padding row).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from kernels import qmatmul

from .convert import LAYER_LINEARS, head_source
from .filelock import build_once
from .gguf import GGUFModel
from .graph import GRAPH_VERSION, build_attention_graph, planted_fault


class NativeUnavailable(RuntimeError):
    """The native pass cannot run this model here (the kernel not built, a weight type it does not read)."""


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
        self.operands = [(p.w, p.qtype, p.col) for p in self.parts]     # one call: the input quantized once
        self.nbytes = sum(p.w.nbytes for p in self.parts)


def _quantized(model: GGUFModel, name: str) -> tuple[str, np.ndarray]:
    qtype = model.tensor_type(name)
    if qtype not in qmatmul.BLOCK_BYTES:
        raise NativeUnavailable(f"{model.path.name}: {name} is {qtype}, a type the native kernel does not read "
                                f"({', '.join(qmatmul.TYPES)}); use [model] kernel = \"nbits\"")
    rows, k = model.tensor_shape(name)
    raw = np.asarray(model.tensor(name))
    return qtype, raw.reshape(rows, k // qmatmul.BLOCK_WEIGHTS[qtype] * qmatmul.BLOCK_BYTES[qtype])


class NativeWeights:
    """Every linear of a converted model, read from the GGUF it was converted from; norms and biases from the
    converted weights (float32, small)."""

    def __init__(self, model_dir: Path, card: dict):
        if not qmatmul.available():
            raise NativeUnavailable(qmatmul.MISSING)
        source = Path(card["source"]["path"])
        if not source.exists():
            raise NativeUnavailable(f"the native pass reads the GGUF {model_dir.name} was converted from, {source}, "
                                    "which is gone: convert the model again, or use [model] kernel = \"nbits\"")
        self.gguf = GGUFModel(source)   # dropped after: its parsed metadata (the tokenizer's) is ~150 MB for a
        # 49k vocabulary, the tensors' views hold only the mapped file
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


def attention_graph_path(model_dir: Path, sink: int, ring: int, kv_dtype: str, tree: bool, streams: int) -> Path:
    kv = {"float16": "kv16", "float32": "kv32"}[kv_dtype]
    return model_dir / (f"attention_v{GRAPH_VERSION}_S{sink}_R{ring}_{kv}" + ("_tree" if tree else "") +
                        (f"_x{streams}" if streams > 1 else "") + ".onnx")


class NativeBinding:
    """The whole-model session's IOBinding, recorded: each name's array, and which were bound since the last pass
    (the runner rebinds only what moved; the attention bindings follow it)."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self.fresh: set[str] = set()
        self.pad = False            # this pass's row 1 is row 0's padding row (set by models/runner.py)
        self._views: dict[tuple, np.ndarray] = {}

    def _view(self, dtype, shape, ptr: int) -> np.ndarray:
        key = (np.dtype(dtype).str, tuple(shape), ptr)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 4096:              # bounded: a long run binds many ring views
                self._views.clear()
            count = int(np.prod(shape)) if len(shape) else 1
            buf = (np.ctypeslib.ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)
            view = self._views[key] = np.frombuffer(buf, dtype).reshape(shape)
        return view

    def bind_input(self, name: str, device: str, device_id: int, dtype, shape, ptr: int) -> None:
        self.arrays[name] = self._view(dtype, shape, ptr)
        self.fresh.add(name)

    bind_output = bind_input


class NativeSession:
    """Runs a pass bound through `io_binding()` (the graph's names, models/graph.py `build_graph`)."""

    def __init__(self, model_dir: Path, card: dict, sink: int, ring: int, threads: int, kv_dtype: str = "float32",
                 tree: bool = False, streams: int = 1):
        self.weights = NativeWeights(Path(model_dir), card)
        self.cfg = cfg = card["config"]
        self.threads, self.streams = threads, streams
        self.tags = [""] if streams == 1 else [f".s{n}" for n in range(streams)]
        path = attention_graph_path(Path(model_dir), sink, ring, kv_dtype, tree, streams)
        if not path.exists():
            build_once(path, lambda part: onnx.save(build_attention_graph(card, sink, ring, kv_dtype, tree, streams),
                                                    part), guard=Path(model_dir) / "graphs")
        so = ort.SessionOptions()
        # One thread: a layer's attention is a few small products (a decode row against the pool), where waking
        # ONNX Runtime's pool costs more than it splits (the 135M: 253 us a layer at 2 threads without spinning);
        # the matmul's own threads do the pass's heavy work.
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.enable_mem_pattern = False
        self.attention = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.scratch = qmatmul.Scratch()
        self._rows = 0
        self._fault = planted_fault()
        self.timing: dict[str, list] | None = None   # label -> [seconds, calls, bytes read]: bench/opprofile.py
        self._t = 0.0

    def io_binding(self) -> NativeBinding:
        binding = NativeBinding()
        binding.layers = [self.attention.io_binding() for _ in range(self.cfg["n_layers"])]
        binding.held = [{} for _ in range(self.cfg["n_layers"])]    # name -> (address, shape, dtype) bound there
        return binding

    def _buffers(self, T: int) -> None:
        """Activations for T rows, grown (never per pass) when a larger pass comes."""
        if T <= self._rows:
            return
        cfg = self.cfg
        d, F, H, KVH, D = cfg["d_model"], cfg["d_ff"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        self._rows = T
        self.h, self.x = np.zeros((T, d), np.float32), np.zeros((T, d), np.float32)
        self.delta = np.zeros((T, d), np.float32)
        self.qkv = np.zeros((1, T, (H + 2 * KVH) * D), np.float32)
        self.o = np.zeros((1, T, H * D), np.float32)
        self.gate_up, self.act = np.zeros((T, 2 * F), np.float32), np.zeros((T, F), np.float32)

    def linear(self, lin: Linear, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        qmatmul.matmul_parts(lin.operands, x, out, threads=self.threads, scratch=self.scratch)
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
        # A 1-row pass's padding row (models/runner.py) is there for attention only: the linears and row-wise
        # operations give a row the same bits alone, so they run on row 0 and attention gets its copy.
        pad = io.pad and T == 2
        R = 1 if pad else T
        self._buffers(T)
        h, x, delta = self.h[:R], self.x[:R], self.delta[:R]
        qkv, o = self.qkv[:, :T], self.o[:, :T]
        gate_up, act = self.gate_up[:R], self.act[:R]
        if w.embed_type:
            qmatmul.rows(w.embed, w.embed_type, ids[:R], h)
        else:
            h[:] = w.embed[ids[:R]]
        if self._fault:            # the planted fault of the exactness tests (models/graph.py `planted_fault`)
            h += np.float32(self._fault * T)
        KVH = cfg["n_kv_heads"]
        new_k, new_v = a["new_k"], a["new_v"]
        for i, (attn_norm, ffn_norm, lin) in enumerate(w.layers):
            qmatmul.rmsnorm(h, attn_norm, eps, x)
            self.linear(lin["qkv"], x, qkv[0, :R])
            if pad:
                qkv[0, 1] = qkv[0, 0]
            att = io.layers[i]
            if timed:
                self._tick("norms, residual, embedding")
            self._bind_layer(io, att, i, qkv, o, new_k[i * KVH:(i + 1) * KVH], new_v[i * KVH:(i + 1) * KVH])
            if timed:
                self._tick("attention binding")
            self.attention.run_with_iobinding(att)
            if timed:
                self._tick("attention (ONNX Runtime)")
            self.linear(lin["o"], o[0, :R], delta)
            h += delta
            qmatmul.rmsnorm(h, ffn_norm, eps, x)
            self.linear(lin["gate_up"], x, gate_up)
            qmatmul.swiglu(gate_up, act)
            if timed:
                self._tick("norms, residual, embedding")
            self.linear(lin["down"], act, delta)
            h += delta
        io.fresh.clear()
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

    def _bind_layer(self, io: NativeBinding, att, i: int, qkv, o, new_k, new_v) -> None:
        """Layer i's attention binding: this pass's rows, and whatever the runner bound anew since the last pass;
        an array already bound there at the same address and shape is left as it is (a decode step's buffers are
        the last step's): binding costs microseconds a name, comparing nanoseconds."""
        a, held = io.arrays, io.held[i]
        if i == 0:                  # the names every layer binds alike, keyed once a pass
            shared = [(n, a[n]) for n in ("cos", "sin", "cos_sink", "sin_sink")]
            shared += [(n, a[n]) for tag in self.tags for n in (f"mask{tag}", f"path{tag}") if n in a]
            io.shared = [(n, t, (t.ctypes.data, t.shape)) for n, t in [("qkv", qkv), *shared]]
            io.shared_out = [("o", o, (o.ctypes.data, o.shape))]
        for name, t, key in io.shared:
            if held.get(name) != key:
                att.bind_input(name, "cpu", 0, t.dtype, t.shape, key[0])
                held[name] = key
        for name, t, key in io.shared_out:
            if held.get(name) != key:
                att.bind_output(name, "cpu", 0, t.dtype, t.shape, key[0])
                held[name] = key
        KVH = self.cfg["n_kv_heads"]
        layer = [(f"recent_k{tag}", a[f"recent_k{tag}"]) for tag in self.tags] + \
                [(f"recent_v{tag}", a[f"recent_v{tag}"]) for tag in self.tags]
        for name, whole in layer:
            t = whole[i * KVH:(i + 1) * KVH]
            key = (whole.ctypes.data + i * KVH * whole.strides[0] if whole.size else 0, t.shape)
            if held.get(name) != key:
                att.bind_input(name, "cpu", 0, t.dtype, t.shape, t.ctypes.data)
                held[name] = key
        for tag in self.tags:
            for kind in ("sink_k", "sink_v", "ring_k", "ring_v"):
                name = f"{kind}.{i}{tag}"
                if name in io.fresh:
                    t = a[name]
                    att.bind_input(f"{kind}.0{tag}", "cpu", 0, t.dtype, t.shape, t.ctypes.data)
        for name, t in (("new_k", new_k), ("new_v", new_v)):
            key = (t.ctypes.data, t.shape)
            if held.get(name) != key:
                att.bind_output(name, "cpu", 0, t.dtype, t.shape, key[0])
                held[name] = key

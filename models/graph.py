"""ONNX graph of one forward pass over T new rows against fixed-capacity sink and ring KV pools (static shapes).

Owns the computation: embedding, RMSNorm (the residual add fused in), fused QKV, RoPE from host-made cos/sin tables,
masked attention over [S sink slots | the first C of R ring slots | P recent positions | T new rows], SwiGLU, head.
Never decides which slot holds what: the host passes the per-row mask, the rotation tables and the recent positions'
K/V (copied from the pool), binds as many ring slots as the mask covers, and receives the new rows' K/V as outputs
to write where it chooses. K/V may be float16 (half the pool; cast to float32 per pass): the new rows are then
rounded to float16 before any row attends to them, so a pool read and a same-pass read still agree.

Sinks stay rotated at their own positions; each row scores them with a second query rotated at min(u, S+W-1)
(`cos_sink`/`sin_sink`), so they sit at StreamingLLM's positions within the cache; the host never hands a sink to a
later row in its section, where it would be scored at its text distance (pipeline/decode/blocks.py). Window keys are
rotated at their absolute positions, so only position differences matter (docs/design.md, "Positions and RoPE").
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from kernels.ring import NEG

from .filelock import build_once

MS = "com.microsoft"
GRAPH_VERSION = 6          # part of every graph file name: a changed builder never reuses an old file
PLANT_ENV = "RINGSPEC_PLANT_ROW_FAULT"   # tests only: EPS builds graphs whose rows depend on the pass's size
STALE_DAYS = 7            # graphs of other builder versions untouched this long are deleted when a graph is built
STATIC_RECENT = 32         # recent-section columns of a static graph (an NPU host pads it, masked)
_END = np.iinfo(np.int64).max
# The softmax of a dynamic graph runs over a fixed width, pool + recent + SOFTMAX_ROWS columns, masked padding after a
# pass's own: ONNX Runtime's Softmax groups a row's columns into SIMD sums by the row's width on ARM (NEON), so masked
# columns appended (a block's later rows, a 1-row pass's padding row) changed a row's weights there (up to 3e-8, and
# whole-pass logits up to 1.04 apart on an emulated Cortex-A76: `doctor`). The most rows a pass may carry.
SOFTMAX_ROWS = 64
# Pool values: the values product against a pool (a sum over up to S + R columns) runs as KVH x G products of T
# rows, not KVH products of G x T rows: at 4 intra-op threads ONNX Runtime 1.32 splits the latter by its row count, so a
# row among 4..17 rows got other bits than alone once about 300 columns were visible (up to 5e-5: an AVX-512 EPYC, and
# an emulated Cortex-A76, the RK3588 profile's four big cores); the former is invariant from 2 rows at 2 and 4 threads,
# and on x86 at 2 threads gives the same bits as the latter.
_NP2ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "uint8": TensorProto.UINT8,
            "int8": TensorProto.INT8, "int64": TensorProto.INT64}


class _Builder:
    def __init__(self, card: dict, weights_file: str, portable_from: Path | None = None):
        self.card, self.weights_file = card, weights_file
        self.portable = portable_from is not None     # standard operators, float weights held in the graph
        self.model_dir = portable_from
        self.nodes: list = []
        self.inits: dict[str, TensorProto] = {}
        self.n = 0

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs):
        self.n += 1
        outs = [f"{op_type.lower()}_{self.n}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def weight(self, name: str) -> str:
        """An initializer stored in the shared weights file (external data: nothing is copied into the graph); a
        portable graph holds its own copy."""
        if name not in self.inits and self.portable:
            self.inits[name] = onnx.numpy_helper.from_array(self.array(name), name)
        if name not in self.inits:
            meta = self.card["tensors"][name]
            t = TensorProto(name=name, data_type=_NP2ONNX[meta["dtype"]], dims=meta["shape"])
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", self.weights_file), ("offset", meta["offset"]),
                               ("length", meta["nbytes"])):
                t.external_data.add(key=key, value=str(value))
            self.inits[name] = t
        return name

    def array(self, name: str) -> np.ndarray:
        meta = self.card["tensors"][name]
        return np.fromfile(self.model_dir / self.weights_file, np.dtype(meta["dtype"]), meta["nbytes"] //
                           np.dtype(meta["dtype"]).itemsize, offset=meta["offset"]).reshape(meta["shape"])

    def dense(self, spec: dict, name: str) -> str:
        """A MatMulNBits weight as float32 W^T [K, N] for a plain MatMul: w = scale x (code - zero point), plus the
        per-block offset (models/quant.py's packing, undone)."""
        if name not in self.inits:
            self.inits[name] = onnx.numpy_helper.from_array(np.ascontiguousarray(unpacked(self.array, spec).T), name)
        return name

    def matmul(self, a: str, bmat: str, alpha: float = 1.0, trans_b: bool = False, slot_major: bool = False) -> str:
        """a @ b (b transposed: trans_b; b laid out [slot, KVH, D], read as [KVH, slot, D]: slot_major), x alpha:
        FusedMatMul, or Transpose, MatMul and Mul in standard operators."""
        if not self.portable:
            return self.op("FusedMatMul", [a, bmat], domain=MS, alpha=alpha, transB=int(trans_b),
                           transBatchB=int(slot_major))
        perm = {(False, False): None, (True, False): [0, 2, 1], (False, True): [1, 0, 2], (True, True): [1, 2, 0]}
        order = perm[(trans_b, slot_major)]
        y = self.op("MatMul", [a, bmat if order is None else self.op("Transpose", [bmat], perm=order)])
        return y if alpha == 1.0 else self.op("Mul", [y, self.const(alpha, np.float32)])

    def const(self, value, dtype=np.int64) -> str:
        name = f"const_{len(self.inits)}"
        self.inits[name] = onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        return name

    def linear(self, x: str, spec: dict, accuracy_level: int) -> str:
        if spec["kind"] == "concat":            # parts of several packed forms, one node each (models/convert.py)
            y = self.op("Concat", [self.linear(x, part, accuracy_level) for part in spec["parts"]], axis=-1)
        elif spec["kind"] == "nbits" and self.portable:
            y = self.op("MatMul", [x, self.dense(spec, spec["B"] + ".dense")])
        elif spec["kind"] == "nbits":
            block = spec.get("block", 32)
            operands = [x, self.weight(spec["B"]), self.weight(spec["scales"])]
            if spec.get("zero_points"):
                operands.append(self.weight(spec["zero_points"]))
            y = self.op("MatMulNBits", operands, domain=MS, K=spec["K"], N=spec["N"], bits=spec["bits"],
                        block_size=block, accuracy_level=accuracy_level)
            if spec.get("offsets"):
                # the per-block additive term: x's block sums times the offsets (models/quant.py)
                blocks = self.op("Reshape", [x, self.const([1, -1, spec["K"] // block, block])])
                sums = self.op("ReduceSum", [blocks, self.const([-1])], keepdims=0)
                y = self.op("Add", [y, self.op("MatMul", [sums, self.weight(spec["offsets"])])])
        else:
            y = self.op("MatMul", [x, self.weight(spec["W"])])
        if spec.get("bias"):
            y = self.op("Add", [y, self.weight(spec["bias"])])
        return y

    def norm(self, h: str, delta: str | None, gamma: str, eps: float) -> tuple[str, str]:
        """RMSNorm of the residual stream h (+ delta, added here: one fused node) -> (normed, new h)."""
        if self.portable:                                   # x / sqrt(mean(x^2) + eps) * gamma
            h = h if delta is None else self.op("Add", [h, delta])
            mean = self.op("ReduceMean", [self.op("Mul", [h, h])], axes=[-1], keepdims=1)
            rms = self.op("Sqrt", [self.op("Add", [mean, self.const(eps, np.float32)])])
            return self.op("Mul", [self.op("Div", [h, rms]), gamma]), h
        if delta is None:
            return self.op("SimplifiedLayerNormalization", [h, gamma], axis=-1, epsilon=eps, stash_type=1), h
        out = self.op("SkipSimplifiedLayerNormalization", [h, delta, gamma], n_out=4, domain=MS, epsilon=eps)
        self.nodes[-1].output[1:3] = ["", ""]                            # mean and 1/std: not needed
        return out[0], out[3]

    def cast(self, x: str, to: int) -> str:
        """x as element type `to`; x itself when the K/V type is already float32."""
        return x if to == TensorProto.FLOAT and self.kv == TensorProto.FLOAT else self.op("Cast", [x], to=to)

    def rope(self, x: str, cos: str, sin: str, heads: int, interleaved: bool) -> str:
        if not self.portable:
            return self.op("RotaryEmbedding", [x, "position_ids", cos, sin], domain=MS,
                           interleaved=int(interleaved), num_heads=heads)
        # row r rotates each pair (a, b) of each head by its angle: (a cos - b sin, b cos + a sin); the pairs are
        # (2i, 2i+1) interleaved, else (i, i + D/2)
        D = self.card["config"]["head_dim"]
        c = self.op("Unsqueeze", [cos, self.const([1, 3] if interleaved else [1])])     # [T, 1, D/2(, 1)]
        s = self.op("Unsqueeze", [sin, self.const([1, 3] if interleaved else [1])])
        if interleaved:
            t = self.op("Reshape", [x, self.const([-1, heads, D // 2, 2])])
            a, b = self.op("Split", [t, self.const([1, 1])], n_out=2, axis=-1)
        else:
            t = self.op("Reshape", [x, self.const([-1, heads, D])])
            a, b = self.op("Split", [t, self.const([D // 2, D // 2])], n_out=2, axis=-1)
        ra = self.op("Sub", [self.op("Mul", [a, c]), self.op("Mul", [b, s])])
        rb = self.op("Add", [self.op("Mul", [b, c]), self.op("Mul", [a, s])])
        return self.op("Reshape", [self.op("Concat", [ra, rb], axis=-1), self.const([1, -1, heads * D])])


def build_graph(card: dict, T: int | None, sink: int, ring: int, accuracy_level: int = 4, kv_dtype: str = "float32",
                weights_file: str = "weights.bin", tree: bool = False, row_fault: float = 0.0,
                portable_from: Path | None = None, streams: int = 1) -> onnx.ModelProto:
    """One pass over T rows (None: a symbolic row count) against `sink` + `ring` pool slots.

    `logit_rows` (int64 [M]) picks the rows whose logits are computed: all of them to verify a block, only the last
    to prefill a chunk (the head is the largest matmul of a small model). A static graph (T given) has M = T.
    `targets` (int64 [M]) and the output `nll` (float32 [M]): -log softmax(logits[m])[targets[m]], the surprisal of
    each logit row's next token when the host knows it (a scored prefill: M = T floats out, not T x V logits). A
    row's log-softmax is one row's work on one thread (MLAS), so `nll` is as batch invariant as the logits. Not in a
    portable graph.

    tree: a token tree's verify pass. Input `path` (int64 [T, W]) lists row r's root path (its ancestors' rows, then
    r; any row as padding), and row r's section is [recent | new rows path[r]]: every row sees its visible columns
    contiguous and in position order, exactly as the chain through its path lays them out, so a tree row computes
    bit for bit what that chain's row computes (a shared section would put a sibling's own column after its masked
    cousins, and the softmax sums in SIMD lanes by column). The mask's section columns are then by depth.

    row_fault: a planted fault for the exactness tests (`PLANT_ENV`): adds row_fault x T to every row's residual
    stream, so a row depends on how many rows share its pass, as a CPU-specific kernel choice can make it.

    streams: how many streams' rows the pass carries (a dynamic chain or tree graph). Rows are grouped by stream, in
    stream order; stream n has its own inputs (`mask.s{n}`, `recent_k.s{n}`, `sink_k.{layer}.s{n}`, ...: the single
    stream's names + ".s{n}") and its rows attend only its own pools and rows, through the nodes a single stream's
    pass has (`_StreamAttention`); embedding, linears, norms and head run once over every row. `new_k`/`new_v` hold
    every row in pass order. A stream's rows therefore get the bits they get alone (tests/models/test_streams.py).

    portable_from: the model directory whose weights the graph then holds itself, dequantized to float32, in
    standard ONNX operators only (no com.microsoft op: MatMul for MatMulNBits and FusedMatMul, RMSNorm and RoPE
    spelt out): what an NPU toolkit converts (rknn-toolkit2). Static shapes (T given), a chain's pass.
    """
    if portable_from is not None and (T is None or tree):
        raise ValueError("a portable graph has static shapes and a chain's rows: give T, not a tree")
    cfg = card["config"]
    L, H, KVH, D = cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    G, d, V = H // KVH, cfg["d_model"], cfg["vocab_size"]
    S, R = sink, ring
    rows = T if T is not None else "T"
    cols = S + R + STATIC_RECENT + T if T is not None else "N"
    b = _Builder(card, weights_file, portable_from)
    f32 = TensorProto.FLOAT                                # activations
    kv = b.kv = _NP2ONNX[kv_dtype]                         # K/V: the pool, the recent section, the new rows' output
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [rows])]
    inputs += [helper.make_tensor_value_info(n, f32, [rows, D // 2]) for n in ("cos", "sin", "cos_sink", "sin_sink")]
    if tree and T is not None:
        raise ValueError("a tree pass needs the dynamic graph")
    if streams > 1 and (T is not None or b.portable):
        raise ValueError("a pass over several streams needs the dynamic graph")
    # Per stream: its mask, its recent section, its pools (and a tree's paths); names carry ".s{n}" when streams > 1.
    names = [_StreamNames(n if streams > 1 else None) for n in range(streams)]
    per_stream = []
    for nm in names:               # symbolic dims named per stream: ONNX Runtime holds equal names to equal sizes
        dim = (lambda x: x) if streams == 1 else (lambda x: x if isinstance(x, int) else f"{x}{nm.tag}")
        per_stream.append([helper.make_tensor_value_info(nm.mask, f32, [dim(rows), dim(cols)])])
        if tree:
            per_stream[-1].append(helper.make_tensor_value_info(nm.path, TensorProto.INT64, [dim(rows), dim("W")]))
        per_stream[-1] += [helper.make_tensor_value_info(n, kv, [L * KVH, dim("P") if T is None else STATIC_RECENT, D])
                           for n in (nm.recent_k, nm.recent_v)]
        per_stream[-1] += [helper.make_tensor_value_info(nm.pool(k, i), kv, [S if k.startswith("sink") else
                                                                            (dim("C") if T is None else R), KVH, D])
                           for i in range(L) for k in (("sink_k", "sink_v") if S else ()) + ("ring_k", "ring_v")]
    if streams == 1:                                    # the order a single stream's graph always had
        inputs.append(per_stream[0].pop(0))
    inputs.append(helper.make_tensor_value_info("logit_rows", TensorProto.INT64, ["M" if T is None else T]))
    if not b.portable:
        inputs.append(helper.make_tensor_value_info("targets", TensorProto.INT64, ["M" if T is None else T]))
    inputs += [info for group in per_stream for info in group]
    if not b.portable:                      # RotaryEmbedding's: row r -> cos[r]
        b.inits["position_ids"] = onnx.numpy_helper.from_array(np.zeros(1, np.int64), "position_ids")

    h, delta = _embed(b, card, d), None                                  # residual stream, its pending addend
    if row_fault:               # the planted fault: every row moves by row_fault x (rows in the pass)
        rows_f = b.op("Cast", [b.op("Shape", ["input_ids"])], to=TensorProto.FLOAT)
        h = b.op("Add", [h, b.op("Mul", [rows_f, b.const([row_fault], np.float32)])])
    scale = 1.0 / math.sqrt(D)
    new_k, new_v = [], []
    streams_at = [_StreamAttention(b, nm, L, KVH, G, D, S, R, T, cols, tree, scale) for nm in names]
    if streams > 1:                                       # rows are grouped by stream, in stream order
        split = b.op("Concat", [b.op("Slice", [b.op("Shape", [nm.mask]), b.const([0]), b.const([1])])
                                for nm in names], axis=0)
    for i, layer in enumerate(card["layers"]):
        x, h = b.norm(h, delta, b.weight(layer["attn_norm"]), cfg["rms_eps"])
        qkv = b.linear(x, layer["qkv"], accuracy_level)
        o, kn, vn = _attention(b, cfg, qkv, i, streams_at, split if streams > 1 else None)
        new_k.append(kn)
        new_v.append(vn)
        x, h = b.norm(h, b.linear(o, layer["o"], accuracy_level), b.weight(layer["ffn_norm"]), cfg["rms_eps"])
        gate, up = b.op("Split", [b.linear(x, layer["gate_up"], accuracy_level), b.const([cfg["d_ff"]] * 2)],
                        n_out=2, axis=-1)
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
        delta = b.linear(act, layer["down"], accuracy_level)

    h = b.op("Gather", [b.op("Add", [h, delta]), "logit_rows"], axis=1)
    x, _ = b.norm(h, None, b.weight(card["output_norm"]), cfg["rms_eps"])
    out_logits = b.linear(x, card["linears"][card["head"]], accuracy_level)
    b.nodes.append(helper.make_node("Identity", [out_logits], ["logits"]))
    b.nodes.append(helper.make_node("Concat", new_k, ["new_k"], axis=0))
    b.nodes.append(helper.make_node("Concat", new_v, ["new_v"], axis=0))
    M = "M" if T is None else T
    outputs = [helper.make_tensor_value_info("logits", f32, [1, M, V]),
               helper.make_tensor_value_info("new_k", kv, [L * KVH, rows, D]),    # = [L, KVH, T, D] in memory
               helper.make_tensor_value_info("new_v", kv, [L * KVH, rows, D])]
    if not b.portable:                                     # nll[m] = -log softmax(logits[m])[targets[m]]
        log_p = b.op("LogSoftmax", [out_logits], axis=-1)
        picked = b.op("GatherElements", [log_p, b.op("Reshape", ["targets", b.const([1, -1, 1])])], axis=2)
        b.nodes.append(helper.make_node("Neg", [b.op("Reshape", [picked, b.const([-1])])], ["nll"]))
        outputs.append(helper.make_tensor_value_info("nll", f32, [M]))
    graph = helper.make_graph(b.nodes, f"ringspec_T{rows}_S{S}_R{R}", inputs, outputs, list(b.inits.values()))
    opsets = [helper.make_opsetid("", 17)] + ([] if b.portable else [helper.make_opsetid(MS, 1)])
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ringspec")
    if b.portable:
        model.ir_version = 8                              # what the NPU toolkit's onnx (<= 1.18) reads
    return model


class _StreamNames:
    """A stream's input names in a pass: the single-stream names, or those names + ".s{n}" (stream n of several)."""

    def __init__(self, n: int | None):
        self.tag = "" if n is None else f".s{n}"
        self.mask, self.path = f"mask{self.tag}", f"path{self.tag}"
        self.recent_k, self.recent_v = f"recent_k{self.tag}", f"recent_v{self.tag}"

    def pool(self, kind: str, layer: int) -> str:
        return f"{kind}.{layer}{self.tag}"


class _StreamAttention:
    """One stream's attention, layer by layer: its rows' queries against its own [sinks | ring | recent | new rows].
    Every node and shape is what a single stream's pass has, so a stream's rows get the same bits whether or not
    other streams' rows share the pass (the linears around it are batch invariant: models/runner.py)."""

    def __init__(self, b: _Builder, nm: _StreamNames, L: int, KVH: int, G: int, D: int, S: int, R: int,
                 T: int | None, cols: int | str, tree: bool, scale: float):
        self.b, self.nm, self.KVH, self.G, self.D, self.S, self.tree, self.scale = b, nm, KVH, G, D, S, tree, scale
        self.cols = cols                      # a static graph's columns: S + R + STATIC_RECENT + T
        split = (lambda n: b.op("Split", [n], n_out=L, axis=0)) if L > 1 else (lambda n: [n])
        self.recent_k, self.recent_v = split(nm.recent_k), split(nm.recent_v)
        if b.portable:                                                        # static: no shape arithmetic
            self.shape4, self.shape3 = b.const([KVH, G, T, cols]), b.const([KVH, -1, cols])
        else:
            mask_shape = b.op("Shape", [nm.mask])                             # [T, N], symbolic or not
            self.shape4 = b.op("Concat", [b.const([KVH, G]), mask_shape], axis=0)
            self.shape3 = b.op("Concat", [b.const([KVH, -1]), b.op("Slice", [mask_shape, b.const([1]),
                                                                               b.const([2])])], axis=0)
        # Pool slots are [slot, KVH, D]: a pass binds only the leading C ring slots it can see (C symbolic in a
        # dynamic graph), and FusedMatMul's transBatchB reads that layout as [KVH, slot, D] without a copy.
        self.ring_end = b.const([S + R]) if b.portable else \
            b.op("Add", [b.op("Slice", [b.op("Shape", [nm.pool("ring_k", 0)]), b.const([0]), b.const([1])]),
                         b.const([S])])
        if not b.portable:                    # pads [0 x 7, fixed - columns], fixed = pool + recent + SOFTMAX_ROWS
            self.columns = b.op("Slice", [b.op("Shape", [nm.mask]), b.const([1]), b.const([2])])
            recent_cols = b.op("Slice", [b.op("Shape", [nm.recent_k]), b.const([1]), b.const([2])])
            fixed = b.op("Add", [b.op("Add", [self.ring_end, recent_cols]), b.const([SOFTMAX_ROWS])])
            self.softmax_pads = b.op("Concat", [b.const([0] * 7), b.op("Max", [b.op("Sub", [fixed, self.columns]),
                                                                               b.const([0])])], axis=0)
            self.masked = b.const(NEG, np.float32)

    def heads_first(self, t: str, n_heads: int) -> str:
        """[1, T, n*D] -> [KVH, (n/KVH)*T, D]: a kv head's query rows side by side."""
        b, KVH, D = self.b, self.KVH, self.D
        if n_heads == KVH:
            return b.op("Transpose", [b.op("Reshape", [t, b.const([-1, KVH, D])])], perm=[1, 0, 2])
        t = b.op("Reshape", [t, b.const([-1, KVH, n_heads // KVH, D])])
        t = b.op("Transpose", [t], perm=[1, 2, 0, 3])
        return b.op("Reshape", [t, b.const([KVH, -1, D])])

    def scores_of(self, q: str, keys: str, slot_major: bool) -> str:   # slot_major: keys laid out [slot, KVH, D]
        return self.b.matmul(q, keys, alpha=self.scale, trans_b=True, slot_major=slot_major)

    def layer(self, i: int, q_rot: str, k_rot: str, v: str, q_sink: str | None = None) -> tuple[str, str, str]:
        """Layer i's attention over this stream's rows (queries and keys rotated, [1, T_s, n*D]) -> (output
        [1, T_s, H*D], the rows' K and V [KVH, T_s, D] as the pool stores them)."""
        b, nm, S, KVH, G, D = self.b, self.nm, self.S, self.KVH, self.G, self.D
        f32 = TensorProto.FLOAT
        pool = {k: b.cast(nm.pool(k, i), f32) for k in (("sink_k", "sink_v") if S else ()) + ("ring_k", "ring_v")}
        qw = self.heads_first(q_rot, KVH * G)
        kn = k_out = b.cast(self.heads_first(k_rot, KVH), b.kv)
        vn = v_out = b.cast(self.heads_first(v, KVH), b.kv)
        # The recent committed positions travel with the new rows as one section, in position order, so a row's
        # attention sums the same terms in the same columns whether its predecessors are new or committed (new rows
        # are rounded to the pool's type first).
        if self.tree:
            section, vn = _tree_section(b, qw, self.recent_k[i], self.recent_v[i], kn, vn, self.scale, KVH, G, D,
                                        nm.path)
        else:
            kn = b.cast(b.op("Concat", [self.recent_k[i], kn], axis=1), f32)
            vn = b.cast(b.op("Concat", [self.recent_v[i], vn], axis=1), f32)
            section = self.scores_of(qw, kn, False)
        # Scores against [sink slots | ring slots | new rows]; the mask broadcasts over heads in the 4-D view.
        scores = [self.scores_of(qw, pool["ring_k"], True), section]
        if S > 0:
            scores.insert(0, self.scores_of(self.heads_first(q_sink, KVH * G), pool["sink_k"], True))
        s4 = b.op("Add", [b.op("Reshape", [b.op("Concat", scores, axis=-1), self.shape4]), nm.mask])
        if b.portable:
            p = b.op("Softmax", [s4], axis=-1)
        else:                                     # over a fixed width, then back to the pass's own (SOFTMAX_ROWS)
            p = b.op("Softmax", [b.op("Pad", [s4, self.softmax_pads, self.masked], mode="constant")], axis=-1)
            p = b.op("Slice", [p, b.const([0]), self.columns, b.const([-1])])
        p4, p = p, b.op("Reshape", [p, self.shape3])                      # [KVH, G, T, cols], [KVH, G*T, cols]
        end = b.const([self.cols] if b.portable else [_END])
        bounds = ([b.const([0]), b.const([S])] if S else [b.const([0])]) + [self.ring_end, end]
        values = ([(pool["sink_v"], 1)] if S else []) + [(pool["ring_v"], 1), (vn, 0)]
        o = None
        for lo, hi, (val, slot_major) in zip(bounds[:-1], bounds[1:], values):
            if slot_major and not b.portable:            # a pool: one product per query head (pool values, at the top)
                part = b.op("Slice", [p4, lo, hi, b.const([-1])])
                val = b.op("Reshape", [val, b.const([-1, KVH, 1, D])])              # [C, KVH, 1, D], a view
                term = b.op("FusedMatMul", [part, val], domain=MS, transBatchB=1)     # [KVH, G, T, D]
                o = _add(b, o, b.op("Reshape", [term, b.const([KVH, -1, D])]))
                continue
            part = b.op("Slice", [p, lo, hi, b.const([-1])])
            if self.tree and not slot_major:             # each row against its own [recent | path] values
                width = b.op("Slice", [b.op("Shape", [part]), b.const([2]), b.const([3])])
                part = b.op("Reshape", [part, b.op("Concat", [b.const([KVH, G, -1]), width], axis=0)])
                part = b.op("Transpose", [part], perm=[0, 2, 1, 3])                   # [KVH, T, G, m+W]
                term = b.op("Transpose", [b.op("MatMul", [part, val])], perm=[0, 2, 1, 3])
                term = b.op("Reshape", [term, b.const([KVH, -1, D])])
            else:
                term = b.matmul(part, val, slot_major=bool(slot_major))
            o = _add(b, o, term)
        o = b.op("Reshape", [o, b.const([KVH, G, -1, D])])
        o = b.op("Transpose", [o], perm=[2, 0, 1, 3])                      # [T, KVH, G, D]
        return b.op("Reshape", [o, b.const([1, -1, KVH * G * D])]), k_out, v_out


def _attention(b: _Builder, cfg: dict, qkv: str, i: int, streams_at: list, split: str | None) -> tuple[str, str, str]:
    """Layer i's attention from its fused QKV projection [1, T, (H + 2 KVH) D]: rotations, then each stream's rows
    against its own pools (`split`: the rows per stream, several streams) -> (o [1, T, H D], new K, new V)."""
    H, KVH, D = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    interleaved = cfg["rope_pairing"] == "interleaved"
    q3, k3, v = b.op("Split", [qkv, b.const([H * D, KVH * D, KVH * D])], n_out=3, axis=-1)
    parts = [b.rope(q3, "cos", "sin", H, interleaved), b.rope(k3, "cos", "sin", KVH, interleaved), v]
    if streams_at[0].S > 0:
        parts.append(b.rope(q3, "cos_sink", "sin_sink", H, interleaved))
    if split is not None:                                 # [1, T, n*D] -> a [1, T_s, n*D] per stream
        parts = [b.op("Split", [t, split], n_out=len(streams_at), axis=1) for t in parts]
    else:
        parts = [[t] for t in parts]
    outs = [at.layer(i, *(t[n] for t in parts)) for n, at in enumerate(streams_at)]
    return tuple(b.op("Concat", list(t), axis=1) if split is not None else t[0] for t in zip(*outs))


def _add(b: _Builder, total: str | None, term: str) -> str:
    return term if total is None else b.op("Add", [total, term])


def _tree_section(b: _Builder, qw: str, recent_k: str, recent_v: str, kn: str, vn: str, scale: float,
                  KVH: int, G: int, D: int, path: str) -> tuple[str, str]:
    """A tree pass's section: (scores [KVH, G*T, m+W], values [KVH, T, m+W, D]), row r's keys and values being
    [recent | new rows path[r]] (the recent columns' scores come from one shared product: a score is one dot
    product whichever product computes it)."""
    f32 = TensorProto.FLOAT
    rk, rv = b.cast(recent_k, f32), b.cast(recent_v, f32)
    kn, vn = b.cast(kn, f32), b.cast(vn, f32)                                  # [KVH, T, D], rounded to the pool type
    k_rows = b.op("Gather", [kn, path], axis=1)                              # [KVH, T, W, D]
    q_rows = b.op("Transpose", [b.op("Reshape", [qw, b.const([KVH, G, -1, D])])], perm=[0, 2, 1, 3])  # [KVH,T,G,D]
    new = b.op("FusedMatMul", [q_rows, k_rows], domain=MS, alpha=scale, transB=1)                      # [KVH,T,G,W]
    width = b.op("Slice", [b.op("Shape", [path]), b.const([1]), b.const([2])])
    new = b.op("Reshape", [b.op("Transpose", [new], perm=[0, 2, 1, 3]),
                           b.op("Concat", [b.const([KVH, -1]), width], axis=0)])                     # [KVH,G*T,W]
    recent = b.op("FusedMatMul", [qw, rk], domain=MS, alpha=scale, transB=1)                           # [KVH,G*T,m]
    rows = b.op("Slice", [b.op("Shape", [path]), b.const([0]), b.const([1])])
    spread = b.op("Concat", [b.const([1]), rows, b.const([1, 1])], axis=0)
    v_rows = b.op("Concat", [b.op("Expand", [b.op("Unsqueeze", [rv, b.const([1])]), spread]),
                             b.op("Gather", [vn, path], axis=1)], axis=2)                           # [KVH,T,m+W,D]
    return b.op("Concat", [recent, new], axis=-1), v_rows


def _embed(b: _Builder, card: dict, d: int) -> str:
    emb = card["embed"]
    if emb["kind"] == "dense":
        return b.op("Unsqueeze", [b.op("Gather", [b.weight(emb["W"]), "input_ids"], axis=0), b.const([0])])
    spec = emb["table"]                     # the token table's packed blocks (the head's too when tied)
    if b.portable:                          # the float table
        name = spec["B"] + ".table"
        if name not in b.inits:
            b.inits[name] = onnx.numpy_helper.from_array(unpacked(b.array, spec), name)
        return b.op("Unsqueeze", [b.op("Gather", [name, "input_ids"], axis=0), b.const([0])])
    # a token's row: w = scale * (code - zero point) + offset, per block, in float32 (one rounding, at the offset)
    block = spec.get("block", 32)
    nb = spec["K"] // block
    codes = b.op("Cast", [b.op("Gather", [b.weight(spec["B"]), "input_ids"], axis=0)], to=TensorProto.FLOAT)
    if spec["bits"] == 4:                   # byte i holds weights 2i (low nibble) and 2i+1 (high); exact in float
        high = b.op("Floor", [b.op("Div", [codes, b.const(16.0, np.float32)])])
        low = b.op("Sub", [codes, b.op("Mul", [high, b.const(16.0, np.float32)])])
        codes = b.op("Reshape", [b.op("Concat", [b.op("Unsqueeze", [low, b.const([-1])]),
                                                  b.op("Unsqueeze", [high, b.const([-1])])], axis=-1),
                                 b.const([-1, nb, block])])
    zero = spec.get("zero_point", 1 << (spec["bits"] - 1))
    scales = b.op("Reshape", [b.weight(spec["scales"]), b.const([-1, nb, 1])])
    rows = b.op("Mul", [b.op("Sub", [codes, b.const(float(zero), np.float32)]),
                        b.op("Gather", [scales, "input_ids"], axis=0)])
    if spec.get("offsets"):                 # offsets are [nb, N]: a token's are a column
        column = b.op("Transpose", [b.op("Gather", [b.weight(spec["offsets"]), "input_ids"], axis=1)], perm=[1, 0])
        rows = b.op("Add", [rows, b.op("Unsqueeze", [column, b.const([-1])])])
    return b.op("Reshape", [rows, b.const([1, -1, d])])


def unpacked(read, spec: dict) -> np.ndarray:
    """A packed linear's float32 weights [N, K] (`read(name)` gives a stored array): w = scale x (code - zero point)
    + offset, computed as the embedding gather computes it."""
    block = spec.get("block", 32)
    codes = read(spec["B"])                                                 # uint8 [N, K/block, block*bits/8]
    if spec["bits"] == 4:
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(*codes.shape[:2], block)
    zero = float(spec.get("zero_point", 1 << (spec["bits"] - 1)))
    w = (codes.astype(np.float32) - np.float32(zero)) * read(spec["scales"]).reshape(spec["N"], -1, 1)
    if spec.get("offsets"):
        w = w + read(spec["offsets"]).T[:, :, None]                        # [nb, N] -> [N, nb, 1]
    return np.ascontiguousarray(w.reshape(spec["N"], spec["K"]))


def planted_fault() -> float:
    """The row fault asked for by `PLANT_ENV` (0.0: none). An environment variable, so that it reaches every
    process a test starts: actors, bench workers, Ray workers."""
    return float(os.environ.get(PLANT_ENV) or 0.0)


def graph_path(model_dir: Path, T: int | None, sink: int, ring: int, accuracy_level: int,
               kv_dtype: str = "float32", tree: bool = False, row_fault: float = 0.0, streams: int = 1) -> Path:
    kv = {"float16": "kv16", "float32": "kv32"}[kv_dtype]
    rows = "tree" if tree else T or "dyn"
    fault = f"_fault{row_fault:g}" if row_fault else ""
    many = f"_x{streams}" if streams > 1 else ""
    return Path(model_dir) / f"graph_v{GRAPH_VERSION}_T{rows}{many}_S{sink}_R{ring}_a{accuracy_level}_{kv}{fault}.onnx"


def ensure_graph(model_dir: Path, card: dict, T: int | None, sink: int, ring: int, accuracy_level: int = 4,
                 kv_dtype: str = "float32", tree: bool = False, streams: int = 1) -> Path:
    """The graph file for this shape, built on first use beside the shared weights by one process (any others
    asking wait for it: models/filelock.py). Graphs of other builder versions are left alone unless unused for
    STALE_DAYS: a process running another checkout may be about to open one."""
    fault = planted_fault()
    path = graph_path(model_dir, T, sink, ring, accuracy_level, kv_dtype, tree, fault, streams)
    if path.exists():
        return path

    def build(part: Path) -> None:
        old = time.time() - STALE_DAYS * 86400
        for stale in Path(model_dir).glob("graph_*.onnx"):
            if not stale.name.startswith(f"graph_v{GRAPH_VERSION}_") and stale.stat().st_mtime < old:
                stale.unlink(missing_ok=True)
        onnx.save(build_graph(card, T, sink, ring, accuracy_level, kv_dtype, tree=tree, row_fault=fault,
                              streams=streams), part)

    return build_once(path, build, guard=Path(model_dir) / "graphs")

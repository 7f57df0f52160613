"""ONNX Runtime's operator families one at a time, at a model's shapes: does a row come out the same bits whatever
the number of rows beside it and its index among them?

Owns the one-operator graphs (random inputs and weights in the model's shapes and layouts, the intra-op threads of
the target) and the comparison: every row of an M-row run against the same row of a 64-row run, M = 1..64, the rows
taken from the front and from the back; and for attention, a row's result with 0..9 masked columns appended against
none (what lies between a lone row and the same row in a block). `run.py doctor` prints the table; the engine's own
start-up check is the whole pass (pipeline/decode/exactness.py). Never touches a model's weights.

Measured (ONNX Runtime 1.32, AMD EPYC with AVX2 only, 1 and 2 threads): MatMulNBits computes a 1-row input by
another kernel than a 2-or-more-row one (1e-6 apart, accuracy levels 0 and 4); every other family is invariant at
every row count and every number of masked columns. Hence the runner's rule: no operator sees one row
(models/runner.py). Under emulation of an SSE4.2-only CPU (no AVX) the whole pass is not invariant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from kernels import attention, qmatmul
from kernels.ring import NEG

from .convert import leaves
from .convert import linears as card_linears   # `linears` below: their leaves

MS = "com.microsoft"
ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64)
TOP = 64


@dataclass(frozen=True)
class Family:
    name: str
    shapes: str                  # what was run, in the model's terms
    varied: str                  # "rows": the rows beside a row; "masked columns": zero-weight columns after its own
    differs_at: tuple[int, ...]  # the counts at which a row is not the bits of the reference (64 rows / 0 columns)
    max_abs: float
    needed: bool = True          # False: reported for information, the graph keeps this case away from its rows

    @property
    def holds(self) -> bool:
        """What the engine's rules need: rows invariant from 2 rows on (the padding rule takes care of 1), masked
        columns invariant at every count (the aligned-block layout relies on it: README, "Exact output")."""
        return not self.needed or not [m for m in self.differs_at if m > 1 or self.varied != "rows"]


def _session(nodes, inputs, outputs, inits, threads: int) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "opcheck", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _value(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _compare(run, rows: np.ndarray) -> tuple[list[int], float]:
    """run(rows[a:b]) -> per-row results [b - a, ...]; which row counts differ from the 64-row run, and by how much."""
    ref = run(rows[:TOP])
    bad, worst = [], 0.0
    for m in ROWS:
        for start in (0, TOP - m):
            got = run(rows[start:start + m])
            want = ref[start:start + m]
            if not np.array_equal(got, want):
                worst = max(worst, float(np.abs(got.astype(np.float64) - want).max()))
                bad.append(m)
    return sorted(set(bad)), worst


def families(card: dict, threads: int, accuracy_level: int, seed: int = 0, pool: int = 96) -> list[Family]:
    """Every operator family of the model's graphs (models/graph.py), each at the shapes this model gives it; the
    attention products against 96 pool columns and against `pool` (the run's sinks and ring: a long context)."""
    cfg = card["config"]
    rng = np.random.default_rng(seed)
    H, KVH, D, d = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["d_model"]
    G = H // KVH
    out = []

    def family(name, shapes, checks, varied="rows", compare=_compare, needed=True):
        out.append(_family(name, shapes, checks, varied, compare, needed))

    linears = [leaf for lin in card_linears(card) for leaf in leaves(lin)]
    nbits = sorted({(x["K"], x["N"], x["bits"], x.get("block", 32), bool(x.get("zero_points")))
                    for x in linears if x["kind"] == "nbits"})
    checks = []
    for K, N, bits, block, zp in nbits:
        B = rng.integers(0, 256, (N, K // block, block * bits // 8), dtype=np.uint8)
        scales = (rng.random(N * K // block) * 0.01).astype(np.float32)
        inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "s")]
        if zp:
            inits.append(numpy_helper.from_array(np.zeros(N * ((K // block * bits + 7) // 8), np.uint8), "z"))
        s = _session([helper.make_node("MatMulNBits", ["x", "B", "s"] + (["z"] if zp else []), ["y"], domain=MS,
                                       K=K, N=N, bits=bits, block_size=block, accuracy_level=accuracy_level)],
                     [_value("x", [1, "T", K])], [_value("y", [1, "T", N])], inits, threads)
        checks.append((lambda x, s=s: s.run(None, {"x": x[None]})[0][0], _normal(rng, TOP, K)))
    if checks:
        family(f"MatMulNBits (quantized weights, accuracy level {accuracy_level})",
               ", ".join(f"K{K} N{N} {b}-bit/{blk}{' zp' if zp else ''}" for K, N, b, blk, zp in nbits), checks)

    dense = sorted({(x["K"] // x.get("block", 32), x["N"]) for x in linears if x.get("offsets")} |
                   {(x["K"], x["N"]) for x in linears if x["kind"] == "dense"})
    checks = []
    for K, N in dense:
        W = _normal(rng, K, N)
        s = _session([helper.make_node("MatMul", ["x", "W"], ["y"])], [_value("x", [1, "T", K])],
                     [_value("y", [1, "T", N])], [numpy_helper.from_array(W, "W")], threads)
        checks.append((lambda x, s=s: s.run(None, {"x": x[None]})[0][0], _normal(rng, TOP, K)))
    if checks:
        family("MatMul (block offsets, float weights)", ", ".join(f"K{K} N{N}" for K, N in dense), checks)

    blocks = sorted({x.get("block", 32) for x in linears if x.get("offsets")}) or [32]
    for block in blocks:
        s = _session([helper.make_node("ReduceSum", ["x", "axis"], ["y"], keepdims=0)],
                     [_value("x", [1, "T", d // block, block])], [_value("y", [1, "T", d // block])],
                     [numpy_helper.from_array(np.array([-1], np.int64), "axis")], threads)
        family("ReduceSum (block sums for the offsets)", f"{d // block} blocks of {block}",
               [(lambda x, s=s: s.run(None, {"x": x[None]})[0][0], _normal(rng, TOP, d // block, block))])

    gamma = numpy_helper.from_array(_normal(rng, d), "g")
    norm = _session([helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-5,
                                      stash_type=1)], [_value("x", [1, "T", d])], [_value("y", [1, "T", d])],
                    [gamma], threads)
    skip = _session([helper.make_node("SkipSimplifiedLayerNormalization", ["x", "e", "g"], ["y", "", "", "h"],
                                      domain=MS, epsilon=1e-5)], [_value("x", [1, "T", d]), _value("e", [1, "T", d])],
                    [_value("y", [1, "T", d]), _value("h", [1, "T", d])], [gamma], threads)
    family("RMSNorm (SimplifiedLayerNormalization, Skip... with the residual add)", f"d {d}",
           [(lambda x: norm.run(None, {"x": x[None]})[0][0], _normal(rng, TOP, d)),
            (lambda x: np.concatenate(skip.run(None, {"x": x[None, :, 0], "e": x[None, :, 1]}), -1)[0],
             _normal(rng, TOP, 2, d))])

    checks = []
    for heads in sorted({H, KVH}):
        s = _session([helper.make_node("RotaryEmbedding", ["x", "p", "c", "n"], ["y"], domain=MS, num_heads=heads,
                                       interleaved=int(cfg["rope_pairing"] == "interleaved"))],
                     [_value("x", [1, "T", heads * D]), _value("c", ["T", D // 2]), _value("n", ["T", D // 2])],
                     [_value("y", [1, "T", heads * D])], [numpy_helper.from_array(np.zeros(1, np.int64), "p")],
                     threads)
        checks.append((lambda x, s=s, w=heads * D: s.run(None, {"x": x[None, :, :w], "c": np.cos(x[:, w:w + D // 2]),
                                                                 "n": np.sin(x[:, w + D // 2:])})[0][0],
                       _normal(rng, TOP, heads * D + D)))
    family("RotaryEmbedding", f"{H} and {KVH} heads of {D}", checks)

    s = _session([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["a"]),
                  helper.make_node("Mul", ["a", "u"], ["y"])], [_value("x", [1, "T", cfg["d_ff"]]),
                 _value("u", [1, "T", cfg["d_ff"]])], [_value("y", [1, "T", cfg["d_ff"]])], [], threads)
    family("SwiGLU (Sigmoid, Mul)", f"d_ff {cfg['d_ff']}",
           [(lambda x: s.run(None, {"x": x[None, :, 0], "u": x[None, :, 1]})[0][0],
             4 * _normal(rng, TOP, 2, cfg["d_ff"]))])

    family("Attention products (FusedMatMul against pool, section and tree rows)", f"{KVH} kv heads x {G} queries, "
           f"D {D}", _attention(rng, KVH, G, D, threads))
    if pool > 96:
        out.append(pool_attention(card, threads, pool, rng))

    cols = 300
    s = _session([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_value("x", [KVH, G, "T", "N"])],
                 [_value("y", [KVH, G, "T", "N"])], [], threads)

    def softmax(x):                 # a row's columns, then one masked column per row of the pass (later rows)
        m = len(x)
        full = np.full((KVH, G, m, cols + m), -1e30, np.float32)
        full[..., :cols] = x.transpose(1, 2, 0, 3)
        return s.run(None, {"x": full})[0][..., :cols].transpose(2, 0, 1, 3)
    family("Softmax (masked columns of later rows)", f"{cols} visible columns",
           [(softmax, _normal(rng, TOP, KVH, G, cols))])
    shapes = f"{KVH} kv heads x {G} queries x 8 rows, 20-40 visible columns, 0..{MASKED} masked"
    for name, checks in _masked_columns(rng, KVH, G, D, threads).items():
        family(name, shapes, checks, "masked columns", _compare_columns,
               needed=name != SOFTMAX_APPENDED)          # the graph pads every softmax to one width (models/graph.py)
    return out


NATIVE_TOP = 130                   # past 128 rows: a tile boundary of no path, and any row count a pass may reach
NATIVE_ROWS = tuple(range(1, 65)) + (127, 128, 129)
NATIVE_COLUMNS = 71                # four 16-column tiles and a tail of 7 (the kernel's widest tile is 16 columns)


def native_families(types: dict[tuple[int, int], set[str]], threads: tuple[int, ...] = (1, 2, 4), seed: int = 0,
                    needed: bool = True) -> list[Family]:
    """The native matmul (kernels/qmatmul.py) at this model's types and reduction lengths (`types`: (K, N) -> the
    GGUF types of the linears of that shape), random blocks: for each path this CPU runs and each thread count, a row
    among 1..64, 127..129 rows against the same row among 130 (rows from the front and the back), and every path's
    bits against the scalar reference's. Columns: the first NATIVE_COLUMNS of each shape (a column is computed alone:
    the count of columns only changes which tile a column falls in, and the tail goes through the reference)."""
    rng = np.random.default_rng(seed)
    out = []
    for path in qmatmul.paths():
        for t in threads:
            checks, shapes = [], []
            for (K, N), kinds in sorted(types.items()):
                for qtype in sorted(kinds):
                    n = min(N, NATIVE_COLUMNS)
                    w = rng.integers(0, 256, (n, K // qmatmul.BLOCK_WEIGHTS[qtype] * qmatmul.BLOCK_BYTES[qtype]),
                                     dtype=np.uint8)
                    _finite_scales(w, qtype)
                    scratch = qmatmul.Scratch()

                    def run(x, w=w, qtype=qtype, n=n, path=path, t=t, scratch=scratch):
                        y = np.zeros((len(x), n), np.float32)
                        qmatmul.matmul(w, qtype, np.ascontiguousarray(x), y, threads=t, path=path, scratch=scratch)
                        return y
                    checks.append((run, _normal(rng, NATIVE_TOP, K)))
                    shapes.append(f"{qtype} K{K}")
            bad, worst = set(), 0.0
            for run, rows in checks:
                b, m = _compare_native(run, rows)
                bad |= set(b)
                worst = max(worst, m)
            out.append(Family(f"native matmul, {path} path, {t} thread{'s' * (t > 1)}", ", ".join(shapes),
                              "rows from 1", tuple(sorted(bad)), worst, needed))
    checks_ref = []
    for (K, N), kinds in sorted(types.items()):
        for qtype in sorted(kinds):
            w = rng.integers(0, 256, (min(N, NATIVE_COLUMNS), K // qmatmul.BLOCK_WEIGHTS[qtype] *
                                      qmatmul.BLOCK_BYTES[qtype]), dtype=np.uint8)
            _finite_scales(w, qtype)
            checks_ref.append((w, qtype, _normal(rng, 9, K)))
    differs, worst = [], 0.0
    for i, path in enumerate(qmatmul.paths()):
        for w, qtype, x in checks_ref:
            a, b = (np.zeros((len(x), len(w)), np.float32) for _ in range(2))
            qmatmul.matmul(w, qtype, x, a, path=path)
            qmatmul.matmul(w, qtype, x, b, path="scalar")
            if not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                differs.append(i)
                worst = max(worst, float(np.abs(a.astype(np.float64) - b).max()))
    out.append(Family("native matmul, every path against the scalar reference",
                      ", ".join(qmatmul.paths()), "paths", tuple(sorted(set(differs))), worst, needed))
    return out


def native_attention_families(cfg: dict, threads: tuple[int, ...] = (1, 2, 4), seed: int = 0,
                              needed: bool = True, pools: str = "float32") -> list[Family]:
    """The native attention (kernels/attention.py) at this model's heads, random rows and pools of type `pools` (the
    pass's: 4 sinks, a ring view of 128 slots with a masked run, 5 recent positions): for each path and thread count,
    the first m rows of a 64-row chain as a pass of their own (m = 1..64) against the same rows of the 64-row pass, and
    every path's bits against the scalar reference's."""
    rng = np.random.default_rng(seed)
    heads = attention.Heads(cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["rope_pairing"] == "interleaved")
    H, KVH, D, S, C, P = heads.H, heads.KVH, heads.D, 4, 128, 5
    qkv = rng.standard_normal((TOP, (H + 2 * KVH) * D)).astype(np.float32)
    tables = tuple(f(a).astype(np.float32) for a in rng.uniform(0, 6.3, (2, TOP, D // 2)) for f in (np.cos, np.sin))
    kv = np.dtype(pools)
    sinks, ring = (tuple(rng.standard_normal((n, KVH, D)).astype(kv) for _ in range(2)) for n in (S, C))
    recent = tuple(rng.standard_normal((KVH, P, D)).astype(kv) for _ in range(2))
    mask = np.zeros((TOP, S + C + P + TOP), np.float32)
    mask[:, S + 40:S + 60] = NEG
    mask[:, S + C + P:][np.arange(TOP)[:, None] < np.arange(TOP)[None, :]] = NEG        # a chain: no later row

    def run(m: int, path: str, t: int) -> np.ndarray:
        """The first m rows' pass: o, new K and new V side by side, a row's values in its row [m, H D + 2 KVH D]."""
        o, new = np.zeros((m, H * D), np.float32), [np.zeros((KVH, m, D), kv) for _ in range(2)]
        attention.attention(heads, qkv[:m], tables, np.ascontiguousarray(mask[:m, :S + C + P + m]), recent, sinks,
                            ring, *new, o, threads=t, kernel_path=path)
        return np.concatenate([o] + [a.transpose(1, 0, 2).reshape(m, -1).astype(np.float32) for a in new], axis=1)

    shapes = f"{H} heads over {KVH} of {D}, {S} sinks, {C} ring slots, {P} recent, {pools} pools"
    out = []
    for path in qmatmul.paths():
        for t in threads:
            ref = run(TOP, path, t)
            bad, worst = [], 0.0
            for m in range(1, TOP + 1):
                got = run(m, path, t)
                if not np.array_equal(got.view(np.uint32), ref[:m].view(np.uint32)):
                    bad.append(m)
                    worst = max(worst, float(np.abs(got.astype(np.float64) - ref[:m]).max()))
            out.append(Family(f"native attention, {path} path, {t} thread{'s' * (t > 1)}", shapes, "rows from 1",
                              tuple(bad), worst, needed))
    differs, worst = [], 0.0
    ref = run(9, "scalar", 1)
    for i, path in enumerate(qmatmul.paths()):
        got = run(9, path, 2)
        if not np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
            differs.append(i)
            worst = max(worst, float(np.abs(got.astype(np.float64) - ref).max()))
    out.append(Family("native attention, every path against the scalar reference", ", ".join(qmatmul.paths()),
                      "paths", tuple(differs), worst, needed))
    return out


def _finite_scales(w: np.ndarray, qtype: str) -> None:
    """Random blocks with small finite float16 scales where the format keeps them."""
    blocks = w.reshape(-1, qmatmul.BLOCK_BYTES[qtype])
    for a in qmatmul.SCALE_AT[qtype]:
        blocks[:, a:a + 2] = (np.random.default_rng(len(blocks)).random(len(blocks)) * 1e-2).astype(
            np.float16).view(np.uint8).reshape(-1, 2)


def _compare_native(run, rows: np.ndarray) -> tuple[list[int], float]:
    ref = run(rows)
    bad, worst = [], 0.0
    for m in NATIVE_ROWS:
        for start in (0, len(rows) - m):
            got = run(rows[start:start + m])
            if not np.array_equal(got.view(np.uint32), ref[start:start + m].view(np.uint32)):
                worst = max(worst, float(np.abs(got.astype(np.float64) - ref[start:start + m]).max()))
                bad.append(m)
    return sorted(set(bad)), worst


SOFTMAX_APPENDED = "Softmax, masked columns appended"
MASKED = 9          # masked columns appended: a block's later rows, a 1-row pass's padding row, up to a width of 8


def _compare_columns(run, visible: int) -> tuple[list[int], float]:
    """run(z) -> the visible part of a result with z masked columns appended; which z differ from z = 0."""
    ref = run(0)
    bad, worst = [], 0.0
    for z in range(1, MASKED + 1):
        got = run(z)
        if not np.array_equal(got, ref):
            worst = max(worst, float(np.abs(got.astype(np.float64) - ref).max()))
            bad.append(z)
    return bad, worst


def _masked_columns(rng, KVH: int, G: int, D: int, threads: int) -> dict[str, list]:
    """A row's section results when zero-weight columns follow its own: the scores against the section's keys
    (more output columns), the softmax over them (masked at -1e30) and the weighted sum of values (more terms of
    weight 0). A verify block and a lone row differ by exactly such columns (later rows of the block, padding)."""
    T, checks = 8, {"Attention scores, keys appended (FusedMatMul)": [],
                    SOFTMAX_APPENDED: [],
                    "Attention values, zero-weight terms appended (FusedMatMul)": []}
    scores = _session([helper.make_node("FusedMatMul", ["q", "k"], ["y"], domain=MS, alpha=0.125, transB=1)],
                      [_value("q", [KVH, "GT", D]), _value("k", [KVH, "N", D])], [_value("y", [KVH, "GT", "N"])],
                      [], threads)
    values = _session([helper.make_node("FusedMatMul", ["p", "v"], ["y"], domain=MS)],
                      [_value("p", [KVH, "GT", "N"]), _value("v", [KVH, "N", D])], [_value("y", [KVH, "GT", D])],
                      [], threads)
    soft = _session([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_value("x", [KVH, G, T, "N"])],
                    [_value("y", [KVH, G, T, "N"])], [], threads)
    for m in (20, 27, 33, 40):
        q, k, v = _normal(rng, KVH, G * T, D), _normal(rng, KVH, m + MASKED, D), _normal(rng, KVH, m + MASKED, D)
        p = rng.random((KVH, G * T, m), dtype=np.float32)
        x = _normal(rng, KVH, G, T, m)
        scored, softened, weighed = checks.values()
        scored.append((lambda z, q=q, k=k, m=m: scores.run(None, {"q": q, "k": k[:, :m + z]})[0][..., :m], m))
        softened.append((lambda z, x=x, m=m: soft.run(None, {"x": np.concatenate(
            [x, np.full((KVH, G, T, z), -1e30, np.float32)], -1)})[0][..., :m], m))
        weighed.append((lambda z, p=p, v=v, m=m: values.run(None, {"p": np.concatenate(
            [p, np.zeros((KVH, G * T, z), np.float32)], -1), "v": v[:, :m + z]})[0], m))
    return checks


def _family(name: str, shapes: str, checks, varied: str = "rows", compare=_compare, needed: bool = True) -> Family:
    """One family's verdict over its checks [(run, rows)]: the counts at which any differs, and by how much."""
    bad, worst = set(), 0.0
    for run, rows in checks:
        b, w = compare(run, rows)
        bad.update(b)
        worst = max(worst, w)
    return Family(name, shapes, varied, tuple(sorted(bad)), worst, needed)


def pool_attention(card: dict, threads: int, pool: int, rng=None) -> Family:
    """The attention products against a pool of `pool` columns, rows 1..64: a long context, in the graph's form.
    (Measured: ONNX Runtime 1.32 on an AVX-512 EPYC, 4 intra-op threads, 300 and more columns: the values product as
    KVH products of G x T rows gave a row other bits in a 4- to 17-row run than alone, up to 5e-5, and a whole pass's
    logits 1.2 apart at 581 positions; 2 and 3 threads were invariant, short contexts do not show it. The graph now
    runs it per query head: models/graph.py, "pool values".)"""
    cfg = card["config"]
    KVH, D = cfg["n_kv_heads"], cfg["head_dim"]
    G = cfg["n_heads"] // KVH
    rng = np.random.default_rng(0) if rng is None else rng
    return _family("Attention products against the whole pool (a long context)", f"{pool} pool columns, {KVH} kv "
                   f"heads x {G} queries, D {D}", _products(rng, _normal(rng, pool, KVH, D), 1, KVH, G, D, threads))


def _attention(rng, KVH: int, G: int, D: int, threads: int):
    """Scores and values against a slot-major pool [C, KVH, D] (transBatchB) and a section [KVH, m, D], and the tree
    graph's per-row products [KVH, T, G, D] x [KVH, T, W, D]."""
    C, m, W = 96, 20, 4
    pool = _normal(rng, C, KVH, D)
    section = _normal(rng, KVH, m, D)
    checks = _products(rng, pool, 1, KVH, G, D, threads) + _products(rng, section, 0, KVH, G, D, threads)
    tree = _session([helper.make_node("FusedMatMul", ["q", "k"], ["y"], domain=MS, alpha=0.125, transB=1),
                     helper.make_node("MatMul", ["y", "v"], ["o"])],
                    [_value("q", [KVH, "T", G, D]), _value("k", [KVH, "T", W, D]), _value("v", [KVH, "T", W, D])],
                    [_value("o", [KVH, "T", G, D])], [], threads)
    checks.append((lambda x: tree.run(None, {"q": x[..., 0, :G, :].transpose(1, 0, 2, 3),
                                             "k": x[..., 1, :W, :].transpose(1, 0, 2, 3),
                                             "v": x[..., 2, :W, :].transpose(1, 0, 2, 3)})[0].transpose(1, 0, 2, 3),
                   _normal(rng, TOP, KVH, 3, max(G, W), D)))
    return checks


def _products(rng, keys: np.ndarray, slot_major: int, KVH: int, G: int, D: int, threads: int) -> list:
    """Scores and values of rows [T, KVH, G, .] against `keys`, laid out [slot, KVH, D] (slot_major, a pool: read
    through transBatchB) or [KVH, m, D] (a section)."""
    width = keys.shape[1 - slot_major]
    scores = _session([helper.make_node("FusedMatMul", ["q", "k"], ["y"], domain=MS, alpha=0.125, transB=1,
                                        transBatchB=slot_major)], [_value("q", [KVH, "GT", D])],
                      [_value("y", [KVH, "GT", "C"])], [numpy_helper.from_array(keys, "k")], threads)
    if slot_major:                           # as the graph runs it: one product per query head ("pool values")
        values = _session([helper.make_node("FusedMatMul", ["p", "v"], ["y"], domain=MS, transBatchB=1)],
                          [_value("p", [KVH, G, "T", width])], [_value("y", [KVH, G, "T", D])],
                          [numpy_helper.from_array(keys.reshape(width, KVH, 1, D), "v")], threads)
    else:
        values = _session([helper.make_node("FusedMatMul", ["p", "v"], ["y"], domain=MS)],
                          [_value("p", [KVH, "GT", width])], [_value("y", [KVH, "GT", D])],
                          [numpy_helper.from_array(keys, "v")], threads)

    def by_row(sess, feed, x, per_head=False):   # rows [T, KVH, G, n] -> [KVH, G*T, n] ([KVH, G, T, n]) and back
        t = len(x)
        heads_first = np.ascontiguousarray(x.transpose(1, 2, 0, 3))
        y = sess.run(None, {feed: heads_first if per_head else heads_first.reshape(KVH, G * t, -1)})[0]
        return y.reshape(KVH, G, t, -1).transpose(2, 0, 1, 3)
    return [(lambda x: by_row(scores, "q", x), _normal(rng, TOP, KVH, G, D)),
            (lambda x: by_row(values, "p", x, bool(slot_major)),
             rng.random((TOP, KVH, G, width), dtype=np.float32))]


def _normal(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)

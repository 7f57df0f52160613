"""A fused linear whose parts have different types (Q4_K_M's Q6_K attn_v beside Q4_K q and k): one MatMulNBits per
form with their outputs concatenated (what models/convert.py builds), against one common exact form for every part
(8-bit, blocks of 16: Q4_K's codes q + 128, its scale d*sc and its offset per 16, Q6_K as it is).

`python -m bench.fused_forms [--k 1536] [--n 1536,256,256] [--rows 2] [--threads 2] [--repeats 200] [--copies 14]`:
both graphs on random operands of those shapes (the 1.5B's layer QKV by default), `copies` of each with their own
weights run in turn (as a pass's layers are: more bytes than the cache holds, so weights come from memory), the two
ways alternated, medians per node set in microseconds, and the bytes each reads. Owns only this measurement.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def _nbits(b: list, name: str, x: str, k: int, n: int, bits: int, block: int, zp: bool, offsets: bool, rng) -> str:
    nb = k // block
    b[1] += [numpy_helper.from_array(rng.integers(0, 256, (n, nb, block * bits // 8), dtype=np.uint8), f"{name}.B"),
             numpy_helper.from_array((rng.random(n * nb) * 1e-3).astype(np.float32), f"{name}.s")]
    ins = [x, f"{name}.B", f"{name}.s"]
    if zp:
        b[1].append(numpy_helper.from_array(np.zeros(n * ((nb * bits + 7) // 8), np.uint8), f"{name}.z"))
        ins.append(f"{name}.z")
    b[0].append(helper.make_node("MatMulNBits", ins, [f"{name}.y"], domain=MS, K=k, N=n, bits=bits,
                                 block_size=block, accuracy_level=4))
    if not offsets:
        return f"{name}.y"
    b[1] += [numpy_helper.from_array(np.array([1, -1, nb, block], np.int64), f"{name}.shape"),
             numpy_helper.from_array(np.array([-1], np.int64), f"{name}.axis"),
             numpy_helper.from_array((rng.random((nb, n)) * 1e-3).astype(np.float32), f"{name}.o")]
    b[0] += [helper.make_node("Reshape", [x, f"{name}.shape"], [f"{name}.blocks"]),
             helper.make_node("ReduceSum", [f"{name}.blocks", f"{name}.axis"], [f"{name}.sums"], keepdims=0),
             helper.make_node("MatMul", [f"{name}.sums", f"{name}.o"], [f"{name}.off"]),
             helper.make_node("Add", [f"{name}.y", f"{name}.off"], [f"{name}.out"])]
    return f"{name}.out"


def session(k: int, parts: list[tuple[int, int, int, bool, bool]], threads: int, seed: int = 0):
    """parts: (N, bits, block, zero points given, offsets) per node; the outputs concatenated."""
    rng = np.random.default_rng(seed)
    b: list = [[], []]
    outs = [_nbits(b, f"p{i}", "x", k, *part, rng) for i, part in enumerate(parts)]
    n = sum(p[0] for p in parts)
    nodes = b[0] + [helper.make_node("Concat", outs, ["y"], axis=-1) if len(outs) > 1 else
                    helper.make_node("Identity", outs, ["y"])]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T", n])], b[1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    nbytes = sum(t.ByteSize() for t in b[1])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]), nbytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=1536)
    p.add_argument("--n", default="1536,256,256", help="the parts' outputs; the last is the Q6_K one")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--copies", type=int, default=14, help="sessions of each way with their own weights, in turn")
    a = p.parse_args()
    ns = [int(x) for x in a.n.split(",")]
    ways = {"one node per form": [session(a.k, [(sum(ns[:-1]), 4, 32, True, True), (ns[-1], 8, 16, False, False)],
                                          a.threads, seed) for seed in range(a.copies)],
            "common 8-bit/16 form": [session(a.k, [(sum(ns), 8, 16, False, True)], a.threads, seed)
                                     for seed in range(a.copies)]}
    x = np.random.default_rng(1).standard_normal((1, a.rows, a.k)).astype(np.float32)
    times: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(a.repeats):
        for w, copies in ways.items():
            t0 = time.perf_counter()
            for s, _ in copies:
                s.run(None, {"x": x})
            times[w].append((time.perf_counter() - t0) / len(copies))
    print(json.dumps({w: {"median_us": round(1e6 * float(np.median(t)), 1), "bytes": ways[w][0][1]}
                      for w, t in times.items()}))


if __name__ == "__main__":
    main()

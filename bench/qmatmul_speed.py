"""The native quantized matmul's speed per path: GB/s of weights read, on the 1.5B's matrix shapes.

Owns the protocol: for each shape (N x K: the 1.5B's MLP up 8960 x 1536 and down 1536 x 8960 by default), type, row
count and thread count, one warm call a path, then rounds of one call a path (interleaved, so a busy machine slows
the paths alike) until `--min-time` seconds a path have passed (at least 3 rounds); each path's median call time, and
the weights' bytes (N rows of K/block blocks as GGUF stores them) over it; the load average is printed beside. A
call includes quantizing the activations (the kernel's own entry does it). Weights are random codes with ordinary
float16 scales (no subnormal or NaN scale slowing the float side); `--clock cpu` times one thread's calls by its
CPU time (what a call costs whatever else runs on the cores). Never asserts a speed, never compares outputs (the
tests hold the paths' bits equal: tests/kernels/test_qmatmul_paths.py); a path this CPU lacks is left out, said.

    python -m bench.qmatmul_speed --types Q4_K,Q6_K --rows 1,2,4,8 --threads 1,2 --paths avx2,scalar
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from kernels import qmatmul

# where a block keeps its float16 scales (d; Q4_1/Q5_1's m, the K-quants' dmin): ggml-common.h's layouts
SCALE_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
            "Q5_K": (0, 2), "Q6_K": (208,)}
SHAPES = {"up": (8960, 1536), "down": (1536, 8960)}     # the 1.5B's MLP (N, K)


def weights(qtype: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    nblocks = n * k // qmatmul.BLOCK_WEIGHTS[qtype]
    raw = rng.integers(0, 256, (nblocks, qmatmul.BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in SCALE_AT[qtype]:
        scales = (rng.standard_normal(nblocks) * 0.01 + 0.02).astype(np.float16)
        raw[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, -1)


def seconds_a_call(w, qtype, x, out, threads, paths, min_time, clock=time.perf_counter) -> dict[str, float]:
    """The median call time of each path on `clock`, the paths' calls interleaved (a busy machine slows them alike)."""
    for path in paths:
        qmatmul.matmul(w, qtype, x, out, threads=threads, path=path)   # warm: pool started, pages touched
    times, start = {path: [] for path in paths}, time.perf_counter()
    while len(times[paths[0]]) < 3 or time.perf_counter() - start < min_time * len(paths):
        for path in paths:
            t0 = clock()
            qmatmul.matmul(w, qtype, x, out, threads=threads, path=path)
            times[path].append(clock() - t0)
    return {path: statistics.median(t) for path, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.qmatmul_speed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q5_0,Q4_1")
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--paths", default="", help="comma-separated; default: every path this CPU runs")
    p.add_argument("--shapes", default="up,down",
                   help=f"of {', '.join(f'{k} {n}x{kk}' for k, (n, kk) in SHAPES.items())}")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the calling thread's CPU time where threads = 1 (what the call costs, whatever else runs "
                        "on the cores); rows with more threads stay on the wall clock, marked w")
    p.add_argument("--min-time", type=float, default=0.1, help="seconds of calls a measurement (default 0.1)")
    a = p.parse_args(argv)
    if not qmatmul.available():
        print(qmatmul.MISSING, file=sys.stderr)
        return 1
    have = qmatmul.paths()
    paths = [s for s in a.paths.split(",") if s] or have
    for s in [s for s in paths if s not in have]:
        print(f"(the {s} path is left out: this CPU runs {', '.join(have)})", file=sys.stderr)
    paths = [s for s in paths if s in have]
    types = a.types.split(",")
    for t in types:
        if t not in qmatmul.BLOCK_BYTES:
            p.error(f"unknown type {t}: {', '.join(qmatmul.TYPES)}")
    rows = [int(r) for r in a.rows.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    rng = np.random.default_rng(0)
    head = f"{'shape':<6} {'N x K':<12} {'type':<5} {'rows':>4} {'thr':>3}| " + " | ".join(f"{s:>11}" for s in paths)
    ratios = [(s, r) for s in paths for r in paths if s != r and r == "scalar"] + \
             [("avx2", "avx512_vnni")] * ("avx2" in paths and "avx512_vnni" in paths)
    head += "".join(f" | {s}/{r}" for s, r in ratios)
    print(f"GB/s of weights read (median call on the {a.clock} clock, paths interleaved; a call quantizes its "
          f"activations too); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(head)
    print("-" * len(head))
    for shape in a.shapes.split(","):
        n, k = SHAPES[shape]
        for t in types:
            w = weights(t, n, k, rng)
            gb = w.nbytes / 1e9
            for m in rows:
                x = rng.standard_normal((m, k)).astype(np.float32)
                out = np.zeros((m, n), np.float32)
                for th in threads:
                    cpu = a.clock == "cpu" and th == 1
                    clock = time.thread_time if cpu else time.perf_counter
                    secs = seconds_a_call(w, t, x, out, th, paths, a.min_time, clock)
                    speed = {s: gb / sec for s, sec in secs.items()}
                    mark = "w" if a.clock == "cpu" and not cpu else " "
                    line = f"{shape:<6} {f'{n}x{k}':<12} {t:<5} {m:>4} {th:>2}{mark}| " + \
                        " | ".join(f"{speed[s]:>11.2f}" for s in paths)
                    line += "".join(f" | {speed[s] / speed[r]:>{len(s) + len(r) + 1}.2f}" for s, r in ratios)
                    print(line, flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a pass of T rows costs, T = 1..8: the native kernel's pass, MatMulNBits' pass, and llama.cpp's batch of the
same rows, side by side in one run (issue 56: a verify of 4 rows should cost at most 1.5x a one-row pass).

`python -m bench.passes --model NAME [--rows 1,2,3,4,5,6,7,8] [--threads 2] [--context 512] [--repeats 7]`: each
system decodes at a context of --context positions; a pass of T rows (their logits all computed, as a verify needs)
is timed --repeats x 3 times, interleaved system by system, and the minimum kept (the least disturbed). ringspec's
passes go through the engine's runner (the padding rule on: a 1-row pass carries its padding row); llama.cpp's
through llama-cpp-python's `eval` with every row's logits (bench/llama_build.py picks or builds it), its KV cache
cut back to the context before each pass. Prints a table and, with --json, one object. Owns only this measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from kernels.ring import RingIndex, RingSpec
from models.handle import Model
from models.runner import Runner, RunnerOptions

from .speed import llama_cpp


def _ringspec(model: str, kernel: str, threads: int, context: int, rows: list[int]):
    spec = RingSpec(4, context + 64, context + 64 + max(rows))
    runner = Runner(Model.of(model).dir, spec, RunnerOptions(threads=threads, max_rows=16,
                                                                            kernel=kernel))
    index = RingIndex(spec)
    ids = np.random.default_rng(0).integers(100, 5000, context + max(rows)).astype(np.int64)
    for start in range(0, context, 16):                       # the context, committed
        pos = np.arange(start, min(start + 16, context), dtype=np.int64)
        runner.forward(ids[pos], pos, index.visible_mask(pos, None, out=runner.mask_buffer()))
        runner.store(np.arange(len(pos)), index.write(pos))
        index.commit(len(pos))

    def run(T: int) -> None:
        pos = np.arange(context, context + T, dtype=np.int64)
        runner.forward(ids[pos], pos, index.visible_mask(pos, None, out=runner.mask_buffer()))
    return run


def _llama(model: str, threads: int, context: int, rows: list[int]):
    lib = llama_cpp()
    if lib is None:
        return None
    llm = lib.Llama(model_path=str(Model.of(model).gguf), n_ctx=context + 64, n_threads=threads,
                    n_threads_batch=threads, n_batch=512, logits_all=True, flash_attn=True, verbose=False)
    ids = np.random.default_rng(0).integers(100, 5000, context + max(rows)).tolist()
    llm.eval(ids[:context])

    def run(T: int) -> None:
        llm.n_tokens = context                               # eval cuts the KV cache back to n_tokens
        llm.eval(ids[context:context + T])
    return run


def measure(model: str, rows: list[int], threads: int, context: int, repeats: int) -> dict:
    systems = {"native": _ringspec(model, "native", threads, context, rows),
               "matmulnbits": _ringspec(model, "nbits", threads, context, rows)}
    llama = _llama(model, threads, context, rows)
    if llama is not None:
        systems["llama_cpp"] = llama
    best = {name: {T: float("inf") for T in rows} for name in systems}
    for _ in range(repeats):
        for T in rows:
            for name, run in systems.items():
                run(T)                                          # warm
                for _ in range(3):
                    t0 = time.perf_counter()
                    run(T)
                    best[name][T] = min(best[name][T], time.perf_counter() - t0)
    ms = {name: {T: round(1000 * s, 2) for T, s in by.items()} for name, by in best.items()}
    return {"model": model, "threads": threads, "context": context, "repeats": repeats, "pass_ms": ms,
            "over_one_row": {name: {T: round(v / by[rows[0]], 3) for T, v in by.items()} for name, by in ms.items()},
            "cpus": len(os.sched_getaffinity(0))}


def table(result: dict) -> str:
    ms = result["pass_ms"]
    rows = list(next(iter(ms.values())))
    lines = [f"{result['model']}: a pass of T rows at context {result['context']}, {result['threads']} threads, "
             f"minimum of {result['repeats'] * 3} (ms; x one row)", f"{'T':>3} " + "".join(f"{n:>22}" for n in ms)]
    for T in rows:
        lines.append(f"{T:>3} " + "".join(f"{ms[n][T]:>12.2f} ({ms[n][T] / ms[n][rows[0]]:4.2f}x)" for n in ms))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--rows", default="1,2,3,4,5,6,7,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = measure(a.model, [int(r) for r in a.rows.split(",")], a.threads, a.context, a.repeats)
    print(json.dumps(result) if a.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A target session's memory beyond its weights file, pool and pass buffers: what pipeline/launch/memory.py's session term
models. `python -m bench.session_memory --model NAME [--kernel native]`: opens the engine's runner for the model
(default profile: window 1024, max_rows 32), runs a 32-row prefill and 16 decode passes, then reads the process's PSS
by mapping (/proc/self/smaps): the weights file's pages (the native pass: the GGUF's, mapped as stored, and the
converted file's norms and biases), anonymous memory (ONNX Runtime's prepacked weights, arena, pools and buffers),
the rest. Prints one JSON object. Owns only this measurement.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from kernels.ring import RingIndex
from models.handle import Model
from models.runner import Runner
from pipeline import config
from pipeline.config import ring_spec

MiB = 1 << 20


def pss_by_mapping() -> dict[str, float]:
    out: dict[str, float] = {}
    name = "?"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            name = head[5] if len(head) > 5 else "[anon]"
        elif line.startswith("Pss:"):
            out[name] = out.get(name, 0.0) + int(head[1]) / 1024
    return out


def measure(model: str, kernel: str = "nbits") -> dict:
    cfg = config.override(config.parse({}), {"model.gguf": model, "model.kernel": kernel})
    before = sum(pss_by_mapping().values())
    model_dir = Model.of(model).dir
    runner = Runner(model_dir, ring_spec(cfg), cfg.model.runner_options())
    index = RingIndex(runner.spec)
    ids = np.arange(1000, 1032, dtype=np.int64)
    for size in [32] + [2] * 16:
        pos = index.n + np.arange(size, dtype=np.int64)
        runner.forward(ids[:size], pos, index.visible_mask(pos, None, out=runner.mask_buffer()))
        runner.store(np.arange(size), index.write(pos))
        index.commit(size)
    pss = pss_by_mapping()
    gguf = str(Model.of(model).gguf.resolve())
    weights_file = gguf if kernel == "native" else str(model_dir / "weights.bin")
    pool = runner.pool_bytes / MiB
    total = sum(pss.values()) - before
    weights = os.path.getsize(weights_file) / MiB
    mapped = pss.get(weights_file, 0.0) + (pss.get(str(model_dir / "weights.bin"), 0.0) if kernel == "native" else 0)
    resident = mapped + (pss.get("[anon]", 0.0) + pss.get("[heap]", 0.0) - pool if kernel == "nbits" else 0)
    return {"model": model, "kernel": kernel, "gguf_mib": round(os.path.getsize(gguf) / MiB, 1),
            "weights_file_mib": round(weights, 1), "weights_file_pss_mib": round(mapped, 1),
            "anonymous_pss_mib": round(pss.get("[anon]", 0.0) + pss.get("[heap]", 0.0), 1),
            "pool_mib": round(pool, 1), "process_growth_pss_mib": round(total, 1),
            "session_beyond_weights_pool_mib": round(total - weights - pool, 1),
            "weights_resident_over_gguf": round(resident / (os.path.getsize(gguf) / MiB), 3)}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--kernel", default="nbits", choices=("nbits", "native"))
    args = p.parse_args()
    print(json.dumps(measure(args.model, args.kernel)))

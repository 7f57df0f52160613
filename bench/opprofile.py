"""Where a decoded token's time goes, per operator, by ONNX Runtime's own profiler.

`python run.py profile [--model M] [--tokens N]` feeds a prompt from the profile's log, then decodes N tokens greedily
with the target alone (the engine's passes: a 1-row step padded to two rows) in a session that records every node,
and reports, over the decode passes only: each operator type's time per token, each quantized matmul shape's time,
the bytes it reads (codes, scales, zero points, offsets) and the bandwidth that implies, and the time per token
outside ONNX Runtime. Owns only this measurement.
"""
from __future__ import annotations

import json
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernels.sampling import SamplingParams
from models.convert import leaves, linears
from pipeline import config
from pipeline.config import Config
from pipeline.decode.assemble import make_engine
from pipeline.stream.records import read_log, render
from run import ROOT


@dataclass
class Profile:
    model: str
    tokens: int
    wall_ms: float                       # per decoded token, the engine's whole step
    ort_ms: float                        # per decoded token, inside session.run
    ops: dict[str, float]                # op type -> ms per token (node time; threads' sums are not added)
    matmuls: list[dict]                  # per MatMulNBits shape: K, N, bits/block, ms per token, MB read, GB/s
    exit_code: int = 0
    indent = 1

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "exit_code"}

    def text(self) -> str:
        nodes = sum(self.ops.values())
        lines = [f"{self.model}: {self.tokens} decoded tokens, {self.wall_ms:.2f} ms each ({1000 / self.wall_ms:.1f} "
                 f"tok/s); inside ONNX Runtime {self.ort_ms:.2f} ms, its nodes {nodes:.2f} ms, outside it "
                 f"{self.wall_ms - self.ort_ms:.2f} ms", "", f"{'operator':<36} {'ms/token':>9} {'share':>7}"]
        for op, ms in sorted(self.ops.items(), key=lambda kv: -kv[1])[:14]:
            lines.append(f"{op:<36} {ms:>9.3f} {ms / nodes:>7.1%}")
        lines += ["", f"{'MatMulNBits K x N, bits/block':<36} {'nodes':>5} {'ms/token':>9} {'MB read':>8} "
                      f"{'GB/s':>6}"]
        for m in self.matmuls:
            lines.append(f"{m['shape']:<36} {m['count']:>5} {m['ms']:>9.3f} {m['mb']:>8.1f} {m['gbps']:>6.1f}")
        return "\n".join(lines)

    def notes(self) -> str:
        return ""


def _shapes(card: dict) -> dict[tuple[int, int], dict]:
    """(K, N) of the packed operands -> their forms and the bytes one pass reads of all of that shape (layers of one
    shape may have different forms: Q4_K_M gives some ffn_down Q6_K)."""
    out: dict[tuple[int, int], dict] = {}
    for lin in linears(card):
        for leaf in leaves(lin):
            if leaf["kind"] != "nbits":
                continue
            names = [leaf[k] for k in ("B", "scales", "zero_points", "offsets") if leaf.get(k)]
            entry = out.setdefault((leaf["K"], leaf["N"]), {"forms": set(), "bytes": 0})
            entry["forms"].add(f"{leaf['bits']}-bit/{leaf.get('block', 32)}")
            entry["bytes"] += sum(card["tensors"][n]["nbytes"] for n in names)
    return {shape: {"form": " + ".join(sorted(e["forms"])), "bytes": e["bytes"]} for shape, e in out.items()}


def run_profile(cfg: Config, tokens: int = 48) -> Profile:
    """Per-operator time of the target's decode passes (ONNX Runtime's profiler), and the bandwidth its quantized
    matmuls reach.

    The prompt is the profile's log, 512 tokens of it; the engine is target-only with the profile's threads, max
    rows and accuracy level, greedy. Node times are wall times of each node (its threads' work overlaps)."""
    cfg = config.override(cfg, {"draft.kind": "none", "cache.sink": 0, "cache.window": 512 + tokens + 8})
    if cfg.model.resolved(cfg.target.card).kernel == "native":
        return _native_profile(cfg, tokens)
    prefix = str(Path(tempfile.mkdtemp(prefix="ringspec-profile-")) / "ort")
    engine = make_engine(cfg, profile=prefix)
    ids = engine.tok.encode(render(read_log(ROOT / cfg.replay.log)))[:512]
    engine.feed(ids)
    runs_before = engine.runner.forward_calls
    t0 = time.perf_counter()
    engine.generate(ids[-1:], tokens, SamplingParams())
    wall = time.perf_counter() - t0
    decoded = engine.runner.forward_calls - runs_before
    trace = json.loads(Path(engine.runner.session.end_profiling()).read_text())
    runs = sorted((e for e in trace if e.get("name") == "model_run"), key=lambda e: e["ts"])[-decoded:]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in runs]
    starts = np.array([w[0] for w in windows])
    ops: dict[str, float] = defaultdict(float)
    mm: dict[tuple[int, int], list] = defaultdict(lambda: [0.0, 0])
    for e in trace:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i < 0 or e["ts"] > windows[i][1]:
            continue                                          # a prefill pass
        op = e["args"]["op_name"]
        ops[op] += e["dur"] / 1000 / decoded
        if op == "MatMulNBits":
            shape = e["args"].get("output_type_shape", [{}])[0]
            inp = e["args"].get("input_type_shape", [{}])[0]
            n = list(shape.values())[0][-1] if shape else 0
            k = list(inp.values())[0][-1] if inp else 0
            mm[(k, n)][0] += e["dur"] / 1000 / decoded
            mm[(k, n)][1] += 1
    forms = _shapes(engine.runner.card)
    matmuls = []
    for (k, n), (ms, count) in sorted(mm.items(), key=lambda kv: -kv[1][0]):
        per_pass = count // decoded
        mb = forms.get((k, n), {"bytes": 0})["bytes"] / 1e6
        matmuls.append({"shape": f"{k} x {n}, {forms.get((k, n), {'form': '?'})['form']}", "count": per_pass,
                        "ms": ms, "mb": mb, "gbps": mb / ms if ms else 0.0})
    ort_ms = sum(e["dur"] for e in runs) / 1000 / decoded
    return Profile(cfg.model.gguf, decoded, 1000 * wall / decoded, ort_ms, dict(ops), matmuls)


def _native_profile(cfg: Config, tokens: int) -> Profile:
    """The native pass (models/native.py) timed by its own parts: each linear's matmul by type and shape (bytes read:
    the GGUF blocks as stored), the attention session, its binding, and the row-wise rest."""
    engine = make_engine(cfg)
    ids = engine.tok.encode(render(read_log(ROOT / cfg.replay.log)))[:512]
    engine.feed(ids)
    session = engine.runner.session
    runs_before = engine.runner.forward_calls
    session.timing = {}
    t0 = time.perf_counter()
    engine.generate(ids[-1:], tokens, SamplingParams())
    wall = time.perf_counter() - t0
    decoded = engine.runner.forward_calls - runs_before
    timing, session.timing = session.timing, None
    inside = sum(v[0] for v in timing.values()) * 1000 / decoded
    ops = {label: v[0] * 1000 / decoded for label, v in timing.items() if not label.startswith("matmul")}
    ops["matmuls"] = sum(v[0] for label, v in timing.items() if label.startswith("matmul")) * 1000 / decoded
    matmuls = []
    for label, (sec, calls, nbytes) in sorted(timing.items(), key=lambda kv: -kv[1][0]):
        if label.startswith("matmul"):
            ms, mb = sec * 1000 / decoded, nbytes / 1e6 / decoded
            matmuls.append({"shape": label[len("matmul "):], "count": calls // decoded, "ms": ms, "mb": mb,
                            "gbps": mb / ms if ms else 0.0})
    return Profile(cfg.model.gguf + " (native)", decoded, 1000 * wall / decoded, inside, ops, matmuls)

"""`run.py export-rknn`: the draft converted for the RK3588's NPU, and what the NPU's numerics cost.

Owns the conversion driver (rknn-toolkit2: one .rknn per row bucket of models/npu_runner.py, int8 one, beside the
draft's converted model, with a record of what was quantized how) and three figures against the ONNX Runtime draft the
CPU runs, on real log text: teacher-forced top-1 agreement and mean KL, greedy agreement (each draft continuing
alone), and the acceptance each achieves against the real target in the serial replay (whose assessments must be the
same text: the draft only proposes). The toolkit's simulator stands in for the NPU: its figures are the NPU's numerics
(float16 or int8), not its speed. Runs in the toolkit's venv (bench/build-rknn-env.sh), which `export-rknn` hands over
to.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from kernels.sampling import SamplingParams
from models.convert import load_card
from models.npu_runner import (FP16_NEG, StaticRunner, buckets, calibration_path, ensure_portable, export_rknn,
                               rknn_path, toolkit_builds)
from models.runner import Runner, RunnerOptions
from pipeline.config import replay_log
from pipeline.decode.drafts.model import ModelDraft
from pipeline.report import Report
from pipeline.stream.frame import replay_frame
from pipeline.stream.records import read_log
from pipeline.stream.replay import replay


@dataclass
class NpuReport(Report):
    indent = 1

    def text(self) -> str:
        d = self.data
        a, acc = d["agreement"], d["acceptance"]
        lines = [f"{b['rknn']} ({b['bytes'] / 2**20:.1f} MiB, built in {b['build_s']:.1f} s)" for b in d["buckets"]]
        lines += [f"the toolkit built {d['toolkit_builds']} model(s): the simulator's figures run those builds"]
        lines += [f"quantization: {d['record']['quantization']}",
                  f"agreement with the ONNX Runtime draft over {a['positions']} positions of {d['log']}: top-1 "
                  f"{a['top1']:.4f}, mean KL {a['mean_kl']:.2e} nats; greedy, {a['greedy_tokens']} tokens from "
                  f"{a['greedy_starts']} starts: {a['greedy_agreement']:.4f} of tokens the same",
                  f"against the target ({acc['lines']} lines, {acc['assessments']} assessments, serial replay): "
                  f"{acc['onnx']['tokens_per_verify']:.3f} tokens/verify with the ONNX Runtime draft, "
                  f"{acc['rknn']['tokens_per_verify']:.3f} with the NPU's ({acc['loss']:+.1%}); assessments "
                  f"{'identical' if acc['identical'] else 'DIFFER'}"]
        return "\n".join(lines)

    @property
    def exit_code(self) -> int:
        return 0 if self.data["acceptance"]["identical"] else 1


@contextlib.contextmanager
def _toolkit_prints_to_stderr():
    """rknn-toolkit2's native code prints its build log on stdout: send it to stderr, so stdout is the report."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


CALIBRATION_LOG = Path(__file__).parent / "data" / "loghub" / "OpenSSH_2k.log"   # no figure is measured on it
CALIBRATION_PASSES = 16      # recorded passes of the int8 model's calibration set: the first (the prompt's rows),
                             # then one-row passes, as a draft runs


def run_export(cfg, positions: int = 400, greedy: int = 64, lines: int = 30,
               calibration_log: str | Path = CALIBRATION_LOG) -> NpuReport:
    """Convert the profile's draft model ([draft] model) to .rknn for the RK3588 (float16, one file per row bucket,
    the ring as fixed-size inputs) with rknn-toolkit2, then measure in its simulator: agreement with the ONNX Runtime
    draft on the profile's log (teacher-forced top-1 and mean KL over `positions` tokens; greedy continuations of
    `greedy` tokens) and the acceptance against the target over the first `lines` lines of a serial replay, with the
    assessments' text compared (exit 1 if they differ). Runs in rknn-toolkit2's venv (bench/build-rknn-env.sh).
    [draft] npu_dtype = "int8" builds one model for every pass, calibrated on passes over `calibration_log`."""
    with _toolkit_prints_to_stderr():
        return _export(cfg, positions, greedy, lines, Path(calibration_log))


QUANTIZATION = {
    "float16": "none: weights and activations in float16 (do_quantization=False); the mask's never is -3e4 there "
               "(float16's range), the pools float32 on the host, cast in",
    "int8": "int8 linears (w8a8: weights per output channel, inputs per tensor, calibrated on {passes} recorded passes "
            "over {log}), every other operation in float16 (the toolkit's hybrid quantization); one model for every "
            "pass"}


def _export(cfg, positions: int, greedy: int, lines: int, calibration_log: Path) -> NpuReport:
    draft = replace_draft(cfg, "onnx")
    model_dir = cfg.draft_model.dir
    card = load_card(model_dir)
    spec = replay_frame(draft).spec
    dtype = cfg.draft.npu_dtype
    built = []
    for T in buckets(cfg.model.max_rows, dtype):
        onnx_path = ensure_portable(model_dir, card, T, spec.sink, spec.ring)
        out = rknn_path(model_dir, T, spec.sink, spec.ring, dtype)
        out.parent.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        dataset = calibrate(cfg, model_dir, spec, T, calibration_log) if dtype == "int8" else None
        export_rknn(onnx_path, out, dtype, dataset)
        built.append({"bucket": T, "onnx": str(onnx_path), "rknn": str(out), "bytes": out.stat().st_size,
                      "build_s": time.perf_counter() - t0, "calibration": str(dataset) if dataset else None})
    record = {"toolkit": "rknn-toolkit2 " + _version("rknn-toolkit2"), "target_platform": "rk3588",
              "quantization": QUANTIZATION[dtype].format(passes=CALIBRATION_PASSES, log=calibration_log.name),
              "graph": "models/graph.py portable: standard ONNX operators, fused QKV + Split, dequantized weights",
              "ring": {"sink": spec.sink, "ring": spec.ring}, "buckets": [b["bucket"] for b in built]}
    (model_dir / "rknn" / "record.json").write_text(json.dumps(record, indent=1))
    log = replay_log(cfg)
    report = {"buckets": built, "record": record, "log": log,
              "agreement": agreement(cfg, model_dir, spec, log, positions, greedy),
              "acceptance": acceptance(cfg, log, lines)}
    return NpuReport({**report, "toolkit_builds": toolkit_builds()})   # one a bucket: the simulator reuses them


def calibrate(cfg, model_dir: Path, spec, T: int, log: Path) -> Path:
    """The int8 model's calibration set: the inputs of CALIBRATION_PASSES passes of bucket T, recorded from the ONNX
    Runtime's run of the same graph as the draft runs it (teacher-forced over `log`'s text, the NPU's mask values),
    one .npy an input a pass and `dataset.txt` listing them, a line a pass (the toolkit's format)."""
    dataset = calibration_path(model_dir, T, spec.sink, spec.ring)
    dataset.parent.mkdir(parents=True, exist_ok=True)
    runner = StaticRunner(model_dir, spec, RunnerOptions(threads=cfg.draft.threads, max_rows=T, batch_invariant=False),
                          backend="ort", dtype="int8")
    runner.neg = FP16_NEG                     # what the NPU's passes are fed (NEG, -1e30, would set the mask's scale)
    run, passes = runner.session[T], []

    def recorded(feeds):
        passes.append([np.array(f) for f in feeds])
        return run(feeds)

    runner.session[T] = recorded
    text = "\n".join(r.text for r in read_log(str(log), None)[:200])
    ids = np.asarray(cfg.target.tokenizer.encode(text), np.int64)[:64 + CALIBRATION_PASSES - 1]
    _teacher_forced(runner, ids)
    rows = []
    for i, feeds in enumerate(passes[:CALIBRATION_PASSES]):
        files = [dataset.parent / f"{i}_{name}.npy" for name in runner._names]
        for file, array in zip(files, feeds):
            np.save(file, array)
        rows.append(" ".join(map(str, files)))
    dataset.write_text("\n".join(rows) + "\n")
    return dataset


def replace_draft(cfg, backend: str):
    return dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, backend=backend))


def agreement(cfg, model_dir: Path, spec, log: str, positions: int, greedy: int) -> dict:
    """The NPU draft (simulator) against the ONNX Runtime draft, both as the draft actor runs them."""
    tok = cfg.target.tokenizer
    text = "\n".join(r.text for r in read_log(log, None)[:400])
    ids = np.asarray(tok.encode(text), np.int64)[: positions + 64]
    opts = RunnerOptions(threads=cfg.draft.threads, max_rows=cfg.model.max_rows, batch_invariant=False)
    cpu = Runner(model_dir, spec, opts)
    npu = StaticRunner(model_dir, spec, opts, backend="rknn", dtype=cfg.draft.npu_dtype)
    (want, want_rows), (got, got_rows) = (_teacher_forced(r, ids) for r in (cpu, npu))
    logp, logq = (_log_softmax(x.astype(np.float64)) for x in (want_rows, got_rows))
    kl = (np.exp(logp) * (logp - logq)).sum(-1)
    starts = list(range(64, len(ids) - 1, max(1, (len(ids) - 64) // 4)))[:4]
    same = total = 0
    for s in starts:
        a, b = _greedy(cpu, ids[:s], greedy), _greedy(npu, ids[:s], greedy)
        same, total = same + int((a == b).sum()), total + len(a)
    npu.close()
    return {"positions": len(want), "top1": float((want == got).mean()), "mean_kl": float(kl.mean()),
            "greedy_starts": len(starts), "greedy_tokens": greedy, "greedy_agreement": same / total if total else 0.0}


def acceptance(cfg, log: str, lines: int) -> dict:
    """Serial replays with the draft model on each backend: tokens per verify pass, and the assessments' text."""
    out = {}
    for backend in ("onnx", "rknn"):
        run = replace_draft(cfg, backend)
        run = dataclasses.replace(run, draft=dataclasses.replace(run.draft, kind="model"))
        texts, generated, verifies = [], 0, 0.0

        def emit(kind, payload, texts=texts):
            if kind == "assessment":
                texts.append(payload["text"])
                st = payload["stats"]
                nonlocal generated, verifies
                generated += st["generated"]
                verifies += st["generated"] / st["accepted_per_verify"] if st["accepted_per_verify"] else 0
        replay(log, None, run, emit, max_lines=lines)
        out[backend] = {"texts": texts, "tokens_per_verify": generated / verifies if verifies else 0.0}
    return {"lines": lines, "assessments": len(out["onnx"]["texts"]), "onnx": out["onnx"], "rknn": out["rknn"],
            "identical": out["onnx"]["texts"] == out["rknn"]["texts"],
            "loss": out["rknn"]["tokens_per_verify"] / out["onnx"]["tokens_per_verify"] - 1.0
            if out["onnx"]["tokens_per_verify"] else 0.0}


def _teacher_forced(runner, ids: np.ndarray):
    draft = ModelDraft(runner, SamplingParams())
    draft.observe(ids[:64])
    guesses, rows = [], []
    for t in ids[64:]:
        guesses.append(draft.guess([int(t)]))
        rows.append(draft._row.copy())
        draft.observe([int(t)])
    draft.forget()
    return np.array(guesses), np.array(rows)


def _greedy(runner, prefix: np.ndarray, n: int) -> np.ndarray:
    draft = ModelDraft(runner, SamplingParams())
    draft.observe(prefix[:-1])
    out, tok = [], int(prefix[-1])
    for _ in range(n):
        nxt = draft.guess([tok])
        draft.observe([tok])
        out.append(nxt)
        tok = nxt
    draft.forget()
    return np.array(out)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"

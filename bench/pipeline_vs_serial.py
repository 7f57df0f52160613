"""Pipelined against serial with the same draft, side by side in one run: decode speed, overlap, overhead share.

Owns the measurement only: the serial side is `pipeline.stream.replay.replay` in this process, the pipelined side is
`run.py replay` (local launcher) in a child process writing a journal; the two alternate `repeats` times on the same log
and profile and report medians. `run_compare` is the `pipeline-bench` verb: each run on stderr as it ends, the table in
`CompareReport`.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.report import Report
from pipeline.stream.replay import replay

ROOT = Path(__file__).resolve().parents[1]


def _summary(stats: list[dict], wall_s: float) -> dict:
    decode_s = sum(s["decode_s"] for s in stats)
    forward_s = sum(s["verify_forward_s"] for s in stats)
    verifies = sum(s["verify_calls"] for s in stats)
    draft_s = sum(s["draft_s"] for s in stats)
    return {"assessments": len(stats), "decode_tok_s": sum(s["generated"] - 1 for s in stats) / decode_s,
            "tokens_per_verify": sum(s["accepted"] + s["verify_calls"] for s in stats) / verifies,
            "overhead_share": 1.0 - forward_s / decode_s, "overlap_share": sum(s["overlap_s"] for s in stats) /
            draft_s if draft_s else 0.0, "draft_s": draft_s, "wall_s": wall_s,
            "texts": [s.get("_text", "") for s in stats]}


def serial(log: str, cfg, max_lines: int) -> dict:
    stats = []

    def emit(kind, payload):
        if kind == "assessment":
            stats.append({**payload["stats"], "_text": payload["text"]})

    t0 = time.perf_counter()
    replay(log, None, cfg, emit, max_lines=max_lines)
    return _summary(stats, time.perf_counter() - t0)


def pipelined(log: str, config_path: str | None, max_lines: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ringspec_bench_") as tmp:
        journal = Path(tmp) / "journal.jsonl"
        cmd = [sys.executable, str(ROOT / "run.py"), "replay", log, "--launcher", "local", "--quiet-lines",
               "--max-lines", str(max_lines), "--journal", str(journal)] + (["--config", config_path]
                                                                             if config_path else [])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(f"pipelined run failed: {proc.stderr.strip().splitlines()[-1:]}")
        records = [json.loads(line) for line in journal.read_text().splitlines()]
    stats = [{**r["stats"], "_text": r["text"]} for r in records if r["kind"] == "assessment"]
    out = _summary(stats, wall)
    figures = {f["actor"]: f for f in records[-1]["figures"]}
    out["stream_overhead_share"] = 1.0 - figures["target"]["forward_s"] / figures["cache_owner"]["stream_wall_s"]
    return out


def compare(log: str, cfg, config_path: str | None, max_lines: int, repeats: int, progress=None) -> dict:
    """{"serial": {...}, "pipelined": {...}} medians over `repeats` alternating runs; "identical": the assessments
    were the same text in every run."""
    runs: dict[str, list[dict]] = {"serial": [], "pipelined": []}
    for r in range(repeats):
        for name in ("serial", "pipelined") if r % 2 == 0 else ("pipelined", "serial"):
            res = serial(log, cfg, max_lines) if name == "serial" else pipelined(log, config_path, max_lines)
            runs[name].append(res)
            if progress:
                progress(name, r, res)
    texts = {tuple(res["texts"]) for rs in runs.values() for res in rs}
    out = {name: {k: statistics.median(res[k] for res in rs) for k in rs[0] if k != "texts"}
           for name, rs in runs.items()}
    out["identical"] = len(texts) == 1
    return out


@dataclass
class CompareReport(Report):
    """Medians per side and whether every assessment was the same text in every run."""

    def text(self) -> str:
        out = self.data
        lines = [(f"{'system':10s} {'decode tok/s':>12s} {'tok/verify':>10s} {'overhead':>9s} {'overlap':>8s} "
                 f"{'draft s':>8s} {'wall s':>7s}")]
        for name in ("serial", "pipelined"):
            row = out[name]
            lines.append(f"{name:10s} {row['decode_tok_s']:12.1f} {row['tokens_per_verify']:10.2f} "
                         f"{row['overhead_share']:9.1%} {row['overlap_share']:8.0%} {row['draft_s']:8.2f} "
                         f"{row['wall_s']:7.1f}")
        lines.append(f"pipelined whole-stream overhead share {out['pipelined']['stream_overhead_share']:.1%}; "
                     f"assessments identical in every run: {out['identical']}")
        return "\n".join(lines)


def _progress(name, repeat, res) -> None:
    print(f"  repeat {repeat} {name:9s} decode {res['decode_tok_s']:6.1f} tok/s, {res['tokens_per_verify']:.2f} "
          f"tok/verify, overhead {res['overhead_share']:.1%}, overlap {res['overlap_share']:.0%}, wall "
          f"{res['wall_s']:.1f} s", file=sys.stderr, flush=True)


def run_compare(cfg, profile: str | None, log: str, max_lines: int = 100, repeats: int = 3) -> CompareReport:
    """Replays a log through the serial engine and through the local actor pipeline, alternating, with the same
    profile (so the same draft); prints medians of decode speed, tokens per verify, the pipeline overhead share
    (decode wall time outside the target's forward passes) and the draft/verify overlap, and whether every
    assessment was the same text in every run.

    `cfg` is the serial side's profile, `profile` its path (the pipelined side's --config)."""
    return CompareReport(compare(log, cfg, profile, max_lines, repeats, _progress))

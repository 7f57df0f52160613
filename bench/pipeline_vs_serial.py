"""Pipelined against serial with the same draft and block policy, side by side in one run: decode speed, run-ahead
(the share of verify passes whose block was drafted before the previous verdict), stale blocks, overhead share.

Owns the measurement only: the serial side is `pipeline.stream.replay.replay` in this process, the pipelined side is
`run.py replay` (local launcher) in a child process writing a journal; for each block policy (fixed length, adaptive
length, line-end blocks, token trees, all three) the two alternate `repeats` times on the same log and profile and
report medians. `run_compare` is the `pipeline-bench` verb: each run on stderr as it ends, the table in
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

from models.npu import NpuBusy, one_owner
from pipeline import config
from pipeline.report import Failure, Report
from pipeline.stream.replay import replay

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {                                   # profile keys over the profile's own, per block policy
    "fixed": {},
    "adaptive": {"draft.adaptive": True},
    "lines": {"draft.end_at_line": True},
    "tree": {"draft.siblings": 2},
    "combined": {"draft.adaptive": True, "draft.end_at_line": True, "draft.siblings": 2},
}


def _summary(stats: list[dict], wall_s: float) -> dict:
    decode_s = sum(s["decode_s"] for s in stats)
    forward_s = sum(s["verify_forward_s"] for s in stats)
    verifies = sum(s["verify_calls"] for s in stats)
    draft_s = sum(s["draft_s"] for s in stats)
    stale = sum(s.get("stale", 0) for s in stats)
    return {"assessments": len(stats), "decode_tok_s": sum(s["generated"] - 1 for s in stats) / decode_s,
            "tokens_per_verify": sum(s["accepted"] + s["verify_calls"] for s in stats) / verifies,
            "overhead_share": 1.0 - forward_s / decode_s, "overlap_share": sum(s["overlap_s"] for s in stats) /
            draft_s if draft_s else 0.0, "ahead_share": sum(s.get("ahead", 0) for s in stats) / verifies,
            "stale_share": stale / (stale + verifies), "draft_s": draft_s, "wall_s": wall_s,
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


def profile_with(path: str | None, overrides: dict, where: Path) -> Path:
    """A profile file: `path` (default configs/default.toml) with `overrides` ({"section.key": value}) written in."""
    raw = config.read_raw(path, overrides)
    out = where / "profile.toml"                  # TOML's strings, numbers, booleans and arrays are JSON's
    out.write_text("".join(f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
                           for name, table in raw.items()))
    return out


def compare(log: str, config_path: str | None, max_lines: int, repeats: int, policies=tuple(POLICIES),
            progress=None) -> dict:
    """Per policy, {"serial": {...}, "pipelined": {...}} medians over `repeats` alternating runs, and "identical":
    the assessments were the same text in every run of that policy."""
    out = {}
    for policy in policies:
        with tempfile.TemporaryDirectory(prefix="ringspec_bench_") as tmp:
            profile = profile_with(config_path, POLICIES[policy], Path(tmp))
            cfg = config.load(profile)
            runs: dict[str, list[dict]] = {"serial": [], "pipelined": []}
            for r in range(repeats):
                for name in ("serial", "pipelined") if r % 2 == 0 else ("pipelined", "serial"):
                    res = serial(log, cfg, max_lines) if name == "serial" else pipelined(log, str(profile), max_lines)
                    runs[name].append(res)
                    if progress:
                        progress(policy, name, r, res)
        texts = {tuple(res["texts"]) for rs in runs.values() for res in rs}
        out[policy] = {name: {k: statistics.median(res[k] for res in rs) for k in rs[0] if k != "texts"}
                       for name, rs in runs.items()}
        out[policy]["identical"] = len(texts) == 1
    return out


@dataclass
class CompareReport(Report):
    """Medians per policy and side, and whether every assessment was the same text in every run."""

    def text(self) -> str:
        lines = [(f"{'policy':9s} {'serial tok/s':>12s} {'pipelined':>9s} {'ratio':>6s} {'tok/verify':>10s} "
                  f"{'ahead':>6s} {'stale':>6s} {'overhead s/p':>13s} {'identical':>9s}")]
        for policy, out in self.data.items():
            s, p = out["serial"], out["pipelined"]
            lines.append(f"{policy:9s} {s['decode_tok_s']:12.1f} {p['decode_tok_s']:9.1f} "
                         f"{p['decode_tok_s'] / s['decode_tok_s']:5.2f}x {p['tokens_per_verify']:10.2f} "
                         f"{p['ahead_share']:6.0%} {p['stale_share']:6.0%} "
                         f"{s['overhead_share']:6.1%}/{p['overhead_share']:<6.1%} {str(out['identical']):>9s}")
        lines.append("ahead: the pipelined side's verify passes whose block the draft ran ahead on (drafted on its "
                     "guess, before the previous verdict); "
                     "stale: drafted blocks discarded (the verdict they assumed did not come); overhead: decode wall "
                     "time outside the target's forward passes")
        return "\n".join(lines)


def _progress(policy, name, repeat, res) -> None:
    print(f"  {policy:9s} repeat {repeat} {name:9s} decode {res['decode_tok_s']:6.1f} tok/s, "
          f"{res['tokens_per_verify']:.2f} tok/verify, ahead {res['ahead_share']:.0%}, stale {res['stale_share']:.0%}, "
          f"overhead {res['overhead_share']:.1%}, wall {res['wall_s']:.1f} s", file=sys.stderr, flush=True)


def run_compare(profile: str | None, log: str, max_lines: int = 100, repeats: int = 3,
                policies=tuple(POLICIES)) -> CompareReport:
    """Replays a log through the serial engine and through the local actor pipeline, alternating, with the same
    profile (so the same draft), once per block policy: the profile's own (fixed), adaptive length, line-end blocks,
    token trees (2 siblings), and all three. Prints per policy the medians of decode speed on both sides, tokens per
    verify, the pipelined side's run-ahead share (verify passes whose block the draft drafted on its own guess, before
    the previous verdict)
    and stale share (drafted blocks discarded), the overhead share (decode wall time outside the target's forward
    passes) on both sides, and whether every assessment was the same text in every run."""
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise ValueError(f"unknown policy {', '.join(sorted(unknown))} (known: {', '.join(POLICIES)})")
    if config.load(profile).draft.backend == "rknn":    # the serial side's draft stays open in this process
        try:
            one_owner(["the serial side (this process)", "the pipelined side's draft actor"],
                      "compare the two with a profile whose draft.backend = \"onnx\"")
        except NpuBusy as exc:
            return Failure(line=f"ringspec: pipeline-bench: {exc}", code=2)
    return CompareReport(compare(log, profile, max_lines, repeats, policies, _progress))

"""Which draft cut from the target pays: acceptance and cost of layer-subset drafts, measured on the bench prompts.

Owns the candidate protocol: each candidate is a GGUF of some of the target's blocks (`models.subset`), cached under
$RINGSPEC_HOME/drafts, run as the draft of a serial engine (greedy) beside target-only on the same prompts. Reports
per candidate the acceptance rate, tokens per verify, draft time per proposed token, relative cost (draft pass / target
pass) and decode tokens/s. Never asserts a speed; the greedy tokens must equal target-only's (Disagreement otherwise).
`run_scan` is the `draft-scan` verb: progress on stderr, the table in `ScanReport`.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

from bench.speed import Disagreement, _ringspec_runner, prompts
from bench.systems import System
from models.convert import load_card
from models.handle import Model
from models.registry import converted_dir, home
from models.subset import layer_subset, parse_blocks
from pipeline import config
from pipeline.report import Report

# Candidates tried for SmolLM2-135M (30 blocks): early exits, strided, and the block ranges least missed.
DEFAULT_CANDIDATES = ("0-5", "0-14", "0-29:2", "0-18,29", "0-9,20-29", "0-5,12-29")


def _blocks(spec: str) -> list[int]:
    """A block list, or "lo-hi:step" for a strided range."""
    if ":" in spec:
        try:
            rng, step = spec.split(":")
            lo, hi = (int(x) for x in rng.split("-"))
            return list(range(lo, hi + 1, int(step)))
        except ValueError:
            raise ValueError(f"bad strided range {spec!r}: use lo-hi:step, like 0-29:2") from None
    return parse_blocks(spec)


def draft_file(gguf, spec: str, blocks: list[int]):
    out = home() / "drafts" / f"{gguf.stem}.blocks-{spec.replace(',', '_').replace(':', 's')}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        layer_subset(gguf, tmp, blocks)
        tmp.replace(out)
    return out


def scan(log: str, candidates=DEFAULT_CANDIDATES, n_offsets: int = 3, draft_len: int = 3, threads: int = 2,
         window: int = 1024, task: str = "log", progress=None, profile: str | None = None) -> dict:
    """Each candidate as the draft of the bench's serial engine beside target-only; profile: the TOML profile the
    engines are built over (default configs/default.toml), whose model the drafts are cut from."""
    model = config.load(profile).model.gguf
    gguf = Model.of(model).gguf
    n_blocks = load_card(converted_dir(gguf))["config"]["n_layers"]
    lists = {spec: _blocks(spec) for spec in candidates}
    for spec, blocks in lists.items():                    # every list checked before anything runs
        if not blocks or not all(0 <= b < n_blocks for b in blocks):
            raise ValueError(f"candidate {spec!r}: the model has blocks 0..{n_blocks - 1}")
    ps = prompts(log, task, n_offsets, model)

    def run(system: System) -> list[dict]:
        generate = _ringspec_runner(system, threads, window, profile)    # the bench's serial engine, same protocol
        return [generate(p) for p in ps]

    base = run(System("target_only", "ringspec"))
    target_ms = statistics.median(1000.0 / r["tokens_per_s"] for r in base)
    rows = {"target_only": {"blocks": n_blocks, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in base),
                            "target_ms_per_pass": target_ms}}
    for spec, blocks in lists.items():
        runs = run(System(spec, "ringspec", "model", str(draft_file(gguf, spec, blocks)), draft_len))
        for r, b in zip(runs, base):
            if r["token_ids"] != b["token_ids"]:
                raise Disagreement(f"draft {spec} changed the greedy output")
        draft_ms = statistics.median(1000.0 * r["draft_s"] / max(r["proposed"], 1) for r in runs)
        rows[spec] = {"blocks": len(blocks),
                      "acceptance_rate": statistics.median(r["acceptance_rate"] for r in runs),
                      "accepted_per_verify": statistics.median(r["accepted_per_verify"] for r in runs),
                      "draft_ms_per_token": draft_ms, "relative_cost": draft_ms / target_ms,
                      "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs)}
        rows[spec]["speedup"] = rows[spec]["tokens_per_s"] / rows["target_only"]["tokens_per_s"]
        if progress:
            progress(spec, rows[spec])
    return {"task": task, "offsets": [p.offset for p in ps], "draft_len": draft_len, "candidates": rows}


@dataclass
class ScanReport(Report):
    """The scan's result: target-only's speed, then one row per candidate."""

    def text(self) -> str:
        rows = self.data["candidates"]
        lines = [(f"target_only: {rows['target_only']['tokens_per_s']:.1f} tok/s "
                 f"({rows['target_only']['target_ms_per_pass']:.1f} ms a token)"),
                 (f"{'blocks kept':16s} {'n':>3s} {'accepted':>9s} {'tok/verify':>10s} {'draft ms':>9s} {'cost':>6s} "
                  f"{'tok/s':>7s} {'speedup':>8s}")]
        for spec, r in rows.items():
            if spec != "target_only":
                lines.append(f"{spec:16s} {r['blocks']:3d} {r['acceptance_rate']:9.1%} "
                             f"{r['accepted_per_verify']:10.2f} "
                             f"{r['draft_ms_per_token']:9.1f} {r['relative_cost']:6.2f} {r['tokens_per_s']:7.1f} "
                             f"{r['speedup']:7.2f}x")
        return "\n".join(lines)


def _progress(spec, row) -> None:
    print(f"  {spec:14s} accepted {row['acceptance_rate']:6.1%}  {row['accepted_per_verify']:.2f} tokens/verify  "
          f"draft {row['draft_ms_per_token']:5.1f} ms/token ({row['relative_cost']:.2f} of a target pass)  "
          f"{row['tokens_per_s']:6.1f} tok/s ({row['speedup']:.2f}x)", file=sys.stderr, flush=True)


def run_scan(cfg, profile: str | None, log: str | None = None, candidates=(), n_offsets: int = 3,
             task: str = "log") -> ScanReport:
    """Cuts drafts from the model (a subset of its transformer blocks; embeddings, final norm and head shared),
    caches them under $RINGSPEC_HOME/drafts and runs each as the serial engine's draft on the bench prompts beside
    target-only. Candidates: block lists like 0-5,12-29 or strided ranges like 0-29:2, separated by spaces. The
    engines are built over the profile (--config): its model (the bundled one by default), threads and window.

    The validated profile `cfg` gives the proposals per verify (draft.length), the threads and the pool window;
    `profile` (its path) is what the engines are built over; `log` defaults to the profile's replay.log."""
    return ScanReport(scan(log or config.replay_log(cfg), tuple(candidates) or DEFAULT_CANDIDATES, n_offsets,
                           cfg.draft.length, cfg.model.threads, cfg.cache.window, task, _progress, profile))

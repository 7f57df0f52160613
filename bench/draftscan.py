"""Which draft cut from the target pays: acceptance and cost of layer-subset drafts, measured on the bench prompts.

Owns the candidate protocol: each candidate is a GGUF of some of the target's blocks (`models.subset`), cached under
$RINGSPEC_HOME/drafts, run as the draft of a serial engine (greedy) beside target-only on the same prompts. Reports
per candidate the acceptance rate, tokens per verify, draft time per proposed token, relative cost (draft pass / target
pass) and decode tokens/s. Never asserts a speed; the greedy tokens must equal target-only's (Disagreement otherwise).
"""
from __future__ import annotations

import statistics

from bench.speed import Disagreement, _ringspec_runner, prompts
from bench.systems import System
from models.convert import load_card
from models.registry import converted_dir, home, resolve_gguf
from models.subset import layer_subset, parse_blocks

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
         window: int = 1024, task: str = "log", progress=None) -> dict:
    gguf = resolve_gguf("default")
    n_blocks = load_card(converted_dir(gguf))["config"]["n_layers"]
    lists = {spec: _blocks(spec) for spec in candidates}
    for spec, blocks in lists.items():                    # every list checked before anything runs
        if not blocks or not all(0 <= b < n_blocks for b in blocks):
            raise ValueError(f"candidate {spec!r}: the model has blocks 0..{n_blocks - 1}")
    ps = prompts(log, task, n_offsets)

    def run(system: System) -> list[dict]:
        generate = _ringspec_runner(system, threads, window)    # the bench's serial engine, same protocol
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

"""Which draft cut from the target pays: acceptance and cost of layer-subset drafts, measured on the bench prompts.

Owns the candidate protocol: each candidate is a GGUF of some of the target's blocks (`models.subset`), cached under
$RINGSPEC_HOME/drafts, run as the draft of a serial engine (greedy) beside target-only on the same prompts. Reports
per candidate the acceptance rate, tokens per verify, draft time per proposed token, relative cost (draft pass / target
pass) and decode tokens/s. Never asserts a speed; the greedy tokens must equal target-only's (Disagreement otherwise).
"""
from __future__ import annotations

import statistics

import numpy as np

from models.registry import home
from models.subset import layer_subset, parse_blocks
from pipeline.bench import Disagreement, prompts

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


def draft_file(gguf, spec: str):
    out = home() / "drafts" / f"{gguf.stem}.blocks-{spec.replace(',', '_').replace(':', 's')}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        layer_subset(gguf, tmp, _blocks(spec))
        tmp.replace(out)
    return out


def scan(log: str, candidates=DEFAULT_CANDIDATES, n_offsets: int = 3, draft_len: int = 3, threads: int = 2,
         window: int = 1024, task: str = "log", progress=None) -> dict:
    from kernels.sampling import SamplingParams
    from pipeline.assemble import make_engine, resolve_gguf

    from models.convert import load_card
    from models.registry import converted_dir

    gguf = resolve_gguf("default")
    n_blocks = load_card(converted_dir(gguf))["config"]["n_layers"]
    for spec in candidates:                               # every list checked before anything runs
        bad = [b for b in _blocks(spec) if not 0 <= b < n_blocks]
        if bad or not _blocks(spec):
            raise ValueError(f"candidate {spec!r}: the model has blocks 0..{n_blocks - 1}")
    ps = prompts(log, task, n_offsets)
    target = make_engine(sink=4, window=window, threads=threads)

    def run(engine) -> list[dict]:
        out = []
        for p in ps:
            engine.rollback(0)
            res = engine.generate(np.asarray(p.ids, np.int64), p.new_tokens, SamplingParams(), stop_ids=p.stop_ids)
            out.append({"tokens": res.token_ids, **res.stats.as_dict()})
        return out

    base = run(target)
    target_ms = statistics.median(1000.0 / r["tokens_per_s"] for r in base)
    rows = {"target_only": {"blocks": 30, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in base),
                            "target_ms_per_pass": target_ms}}
    for spec in candidates:
        blocks = _blocks(spec)
        engine = make_engine(sink=4, window=window, threads=threads, draft="model",
                             draft_gguf=str(draft_file(gguf, spec)), draft_len=draft_len, draft_threads=threads)
        runs = run(engine)
        for r, b in zip(runs, base):
            if r["tokens"] != b["tokens"]:
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
        del engine
    return {"task": task, "offsets": [p.offset for p in ps], "draft_len": draft_len, "candidates": rows}

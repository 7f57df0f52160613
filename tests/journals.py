"""Two journals compared record for record, what was measured left out: the times and speeds (`t`, `latency_ms`,
`stats`, the actors' `figures`, the platform, the exactness probe's seconds), and the checkpoints, which come at
times of their own (`supervise.checkpoint_s`), compared as the committed offsets they add up to."""
from __future__ import annotations

MEASURED = frozenset({"t", "latency_ms", "stats", "figures", "platform", "seconds"})


def _unmeasured(value):
    if isinstance(value, dict):
        return {k: _unmeasured(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        return [_unmeasured(v) for v in value]
    return value


def comparable(records: list[dict]) -> tuple[list[dict], list[int]]:
    """(every record but the checkpoints, unmeasured; every committed offset, in order)."""
    body, committed = [], []
    for rec in records:
        point = rec if rec["kind"] == "checkpoint" else rec.get("checkpoint")
        committed += point["offsets"] if point else []
        if rec["kind"] == "checkpoint":
            continue
        rec = _unmeasured(rec)
        if "checkpoint" in rec:
            rec["checkpoint"] = {k: v for k, v in rec["checkpoint"].items() if k != "offsets"}
        body.append(rec)
    return body, committed

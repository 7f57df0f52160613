"""`python run.py bench --task streams`, through the actors: N streams in one pipeline (one target carrying their rows)
against N single-stream pipelines side by side on the same cores, alternated in one run (issue 21, item 3).

Stream i reads logs[i] (bench/streams.py's LOGS), fed at a fixed line rate (`replay --rate`) for a fixed number of
lines and assessed every so many lines with the profile's decoding (the default: speculation on). Both ways run the
`replay` command an operator runs: `shared` is one `replay LOG1 .. LOGN`, `independent` is N `replay LOGi` at once.
From each stream's journal: its decode tokens/s (its assessments' tokens over their decode time), prefill tokens/s
(their prompts), TTFT; the aggregate decode tokens/s is every stream's assessment tokens over the wall time during
which any of them was decoding. Memory: the peak of the summed PSS of every process of the run (launcher and
actors), sampled every SAMPLE_S, and each process's PSS (by its name, `rs:ROLE`) at that peak; per added stream,
(peak(N) - peak(1)) / (N - 1), and from the count before (`marginal`: the one-off costs of a several-stream target,
its N-stream graph among them, left out). Whether each stream wrote the same
assessments both ways is checked (a stream's output must not depend on the streams it shares a target with).
Owns only the measurement; never imported at run time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.config import parse, with_logs
from pipeline.process import parent_of
from pipeline.topology import per_stream_file

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.5


def run_actors(config: str | None, counts: list[int], logs: list[str], lines: int, every: int, rate: float,
               repeats: int, progress=print) -> dict:
    """{N: {"shared": figures, "independent": figures (N > 1), "identical": bool}} plus memory per added stream."""
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="rs-streams-") as tmp:
        for n in counts:
            ways = ["shared"] + (["independent"] if n > 1 else [])
            runs: dict[str, list[dict]] = {way: [] for way in ways}
            for r in range(repeats):
                for way in ways if r % 2 == 0 else ways[::-1]:
                    where = Path(tmp) / f"{n}-{way}-{r}"
                    where.mkdir()
                    got = one_run(config, logs[:n], way, where, lines, every, rate)
                    runs[way].append(got)
                    progress(f"streams {n} {way} run {r + 1} (actors): aggregate decode "
                             f"{got['aggregate_tokens_per_s']:.1f} tok/s, peak PSS {got['pss_peak_bytes'] / 2**20:.0f}"
                             f" MiB, {got['wall_s']:.0f} s")
            row: dict = {way: _median(rs) for way, rs in runs.items()}
            texts = [rs["texts"] for rs_list in runs.values() for rs in rs_list]
            row["identical"] = all(t == texts[0] for t in texts)
            out[n] = row
    one = out[min(counts)]["shared"]["pss_peak_bytes"] if 1 in counts else None
    before = None
    for n, row in out.items():
        peak = row["shared"]["pss_peak_bytes"]
        row["memory_per_added_stream_bytes"] = (peak - one) / (n - 1) if one is not None and n > 1 else 0.0
        row["memory_per_added_stream_marginal_bytes"] = (peak - before[1]) / (n - before[0]) if before else 0.0
        before = (n, peak)
    return out


def one_run(config: str | None, logs: list[str], way: str, where: Path, lines: int, every: int, rate: float) -> dict:
    """One way of running `logs`: its figures from the journals and the PSS samples."""
    base = [sys.executable, str(ROOT / "run.py"), "replay", "--quiet-lines", "--max-lines", str(lines), "--every",
            str(every), "--rate", str(rate), *(["--config", config] if config else [])]
    if way == "shared":
        commands = [[*base, *logs, "--journal", str(where / "journal.jsonl")]]
    else:
        commands = [[*base, log, "--journal", str(where / f"journal-{i}.jsonl")] for i, log in enumerate(logs)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for c in commands]
    peak, by_process = _sample_pss([p.pid for p in procs], lambda: all(p.poll() is not None for p in procs))
    for p in procs:
        err = p.stderr.read()
        if p.wait() != 0:
            raise RuntimeError(f"bench: {' '.join(commands[0][2:4])} exited {p.returncode}: {err[-2000:]}")
    wall = time.perf_counter() - t0
    if way == "shared":                                # each stream's journal, named as the launcher names it
        names = [st.name for st in with_logs(parse({}), logs).streams] or [""]
        journals = [per_stream_file(str(where / "journal.jsonl"), name) for name in names]
    else:
        journals = [str(where / f"journal-{i}.jsonl") for i in range(len(logs))]
    streams = [_assessments(_records(j)) for j in journals]
    return _figures(streams) | {"pss_peak_bytes": peak, "pss_by_process_bytes": by_process, "wall_s": wall}


def _records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _assessments(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "assessment"]


def _figures(streams: list[list[dict]]) -> dict:
    """Per stream and together, from each stream's assessment records."""
    per, spans = [], []
    for recs in streams:
        stats = [r["stats"] for r in recs]
        decode_s, tokens = sum(s["decode_s"] for s in stats), sum(s["generated"] for s in stats)
        prefill_s, prompt = sum(s["prefill_s"] for s in stats), sum(s["prompt_tokens"] for s in stats)
        per.append({"decode_tokens_per_s": tokens / decode_s if decode_s else 0.0, "generated": tokens,
                    "prefill_tokens_per_s": prompt / prefill_s if prefill_s else 0.0,
                    "ttft_ms": float(np.median([s["ttft_ms"] for s in stats])) if stats else 0.0,
                    "assessments": len(recs)})
        spans += [(r["t"] - r["stats"]["decode_s"], r["t"]) for r in recs]
    busy = _union(spans)
    return {"aggregate_tokens_per_s": sum(p["generated"] for p in per) / busy if busy else 0.0,
            "decoding_wall_s": busy, "per_stream": per,
            "texts": [[r["text"] for r in recs] for recs in streams]}


def _union(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _sample_pss(roots: list[int], done) -> tuple[int, dict[str, int]]:
    """The peak, until `done()`, of the summed PSS of `roots` and all their descendants, and each process's PSS at
    that peak summed by process name (`rs:target`, ...; the launchers are `python`)."""
    peak, by_process = 0, {}
    while not done():
        now: dict[str, int] = {}
        for pid in _tree(roots):
            if pss := _pss(pid):                      # 0: gone since the listing (its name is gone too)
                name = _name(pid)
                now[name] = now.get(name, 0) + pss
        total = sum(now.values())
        if total > peak:
            peak, by_process = total, now
        time.sleep(SAMPLE_S)
    return peak, dict(sorted(by_process.items()))


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _tree(roots: list[int]) -> set[int]:
    parent = {int(entry): parent_of(int(entry)) for entry in os.listdir("/proc") if entry.isdigit()}
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo += [child for child, p in parent.items() if p == pid]
    return found


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration, ValueError):
        return 0                                      # gone between the listing and the read


def _median(runs: list[dict]) -> dict:
    keys = ("aggregate_tokens_per_s", "pss_peak_bytes", "wall_s", "decoding_wall_s")
    row = {k: float(np.median([r[k] for r in runs])) for k in keys}
    n = len(runs[0]["per_stream"])
    row["per_stream"] = [{k: float(np.median([r["per_stream"][i][k] for r in runs]))
                          for k in runs[0]["per_stream"][i]} for i in range(n)]
    row["texts"] = runs[0]["texts"]
    row["pss_by_process_bytes"] = min(runs, key=lambda r: r["pss_peak_bytes"])["pss_by_process_bytes"]
    return row

"""`python run.py bench --task streams`: what one target gains by carrying several streams' rows in one pass.

Through the actors first (bench/streams_actors.py: `replay` with N sources against N `replay`s), then the
target-only figures (issue 21, item 3): N streams, each a different log, each fed and then asked to continue with the
profile's stream draft proposing (verify blocks of several rows), run two ways on the same cores, alternated in one
run: `batched`, every stream's pools in one several-stream target (models/streams.py), a pass carrying each waiting
stream's rows; and `independent`, N single-stream runners, their passes one after another (N pipelines sharing the
cores). Each stream runs in its own thread; a pass runs once every running stream has one waiting (`Lockstep`, what
the target actor does with the passes in its inbox). Per N: aggregate and per-stream prefill and decode tokens/s,
whether every stream's tokens are the same both ways, and the memory each added stream costs (a fresh process's PSS
after its first pass, N streams in the N-stream graph against one stream) and, apart, the single-stream graph's
session the target keeps beside it. Owns only the measurement; never imported at run time.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import sys
import threading
from queue import Empty
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.streams_actors import run_actors
from models.graph import SOFTMAX_ROWS
from models.registry import converted_dir
from models.runner import Runner, kv_bytes_per_slot
from models.streams import Rows, Streams, pack
from models.tokenizer import Tokenizer
from pipeline.config import ring_spec
from pipeline.decode.drafts.suffix import SuffixDraft
from pipeline.decode.engine import Engine
from pipeline.report import Failure, Report
from pipeline.stream.frame import replay_frame
from pipeline.stream.records import read_log, render

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

LOGS = ("loghub/BGL_2k.log", "tep_alarms/filter/text_alarms_filter_2.csv", "loghub/Zookeeper_2k.log",
        "loghub/Hadoop_2k.log", "loghub/Linux_2k.log", "loghub/HealthApp_2k.log", "loghub/Android_2k.log",
        "loghub/Windows_2k.log")


class Lockstep:
    """Passes of several threads, one per stream, run together: once every stream still running has a pass waiting,
    one pass runs with each waiting stream's rows that fit (at most `slots` streams, SOFTMAX_ROWS rows in all, an
    idle slot as 2 rows; the first asked turns round); the others wait for the next. `run(parts)` -> each part's
    logits."""

    def __init__(self, run, n: int, slots: int):
        self.run, self.n, self.live, self.slots = run, n, n, slots
        self.cv = threading.Condition()
        self.waiting: list = [None] * n
        self.out: list = [None] * n
        self.turn = 0
        self.passes = 0

    def forward(self, i: int, rows: Rows) -> np.ndarray:
        with self.cv:
            self.waiting[i] = rows
            self._run_if_all_wait()
            while self.waiting[i] is not None:
                self.cv.wait()
            return self.out[i]

    def leave(self) -> None:
        with self.cv:
            self.live -= 1
            self._run_if_all_wait()

    def _run_if_all_wait(self) -> None:
        waiting = [i for i in range(self.n) if self.waiting[i] is not None]
        if not waiting or len(waiting) < self.live:
            return
        order = [i for i in ((self.turn + k) % self.n for k in range(self.n)) if self.waiting[i] is not None]
        parts = [None] * self.n
        for j in pack([len(self.waiting[i].tokens) for i in order], self.slots):    # the target actor's packing
            parts[order[j]] = self.waiting[order[j]]
        self.turn += 1
        got = self.run(parts)
        self.passes += 1
        for i, p in enumerate(parts):
            if p is not None:
                self.out[i], self.waiting[i] = got[i], None
        self.cv.notify_all()


class Seat:
    """Stream i's runner as its engine sees it: passes go through the lockstep, the rest is the stream's runner."""

    def __init__(self, runner: Runner, lockstep: Lockstep, i: int):
        self.runner, self.lockstep, self.i = runner, lockstep, i

    def forward(self, tokens, positions, mask, logit_rows=None, recent_slots=None, path=None, ring_from=0,
                targets=None):
        return self.lockstep.forward(self.i, Rows(tokens, positions, mask, logit_rows, recent_slots, path, ring_from,
                                                  targets))

    def __getattr__(self, name):
        return getattr(self.runner, name)


@dataclass
class System:
    name: str
    runners: list                 # each stream's runner (pools); batched: pools-only
    run: object                   # parts -> logits per part
    slots: int                    # the most streams one pass carries


def batched(model_dir, spec, opts, n: int, sizes: tuple[int, ...]) -> System:
    """N streams on one target (one stream: a plain runner); `sizes`: its graphs (the target actor's:
    `ModelSection.graph_sizes`)."""
    if n == 1:
        one = Runner(model_dir, spec, opts)
        return System("batched", [one], lambda parts: [one.forward(**vars(parts[0]))], 1)
    batch = Streams(model_dir, spec, n, opts, sizes)
    return System("batched", batch.runners, batch.forward, batch.widest)


def systems(model_dir, spec, opts, n: int, sizes: tuple[int, ...]) -> list[System]:
    """The ways N streams run: batched (on graphs of `sizes` streams' slots), and (N > 1) independent."""
    if n == 1:
        return [batched(model_dir, spec, opts, 1, (1,))]
    alone = [Runner(model_dir, spec, opts) for _ in range(n)]
    independent = (lambda parts: [None if p is None else r.forward(**vars(p)) for r, p in zip(alone, parts)])
    return [batched(model_dir, spec, opts, n, sizes), System("independent", alone, independent, n)]


def one_run(system: System, texts: list[np.ndarray], new_tokens: int) -> dict:
    """Every stream fed its text (all but its last token), then continuing from there greedily, each stream in its
    thread; the two phases timed apart. Fresh engines each run: the pools' old contents are never visible."""
    n = len(texts)
    seats = [Seat(r, None, i) for i, r in enumerate(system.runners)]
    engines = [Engine(seat, None, draft=SuffixDraft()) for seat in seats]
    out: list = [None] * n

    def phase(work) -> tuple[float, int]:
        run = (lambda parts: [None if g is None else g.copy() for g in system.run(parts)])
        lock = Lockstep(run, n, system.slots)
        for seat in seats:
            seat.lockstep = lock

        def stream(i: int) -> None:
            try:
                work(i)
            finally:
                lock.leave()

        threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0, lock.passes

    prefill_s, prefill_passes = phase(lambda i: engines[i].feed(texts[i][:-1]))
    decode_s, decode_passes = phase(lambda i: out.__setitem__(i, engines[i].generate(texts[i][-1:],
                                                                                     new_tokens).token_ids))
    prefill, decoded = sum(len(t) - 1 for t in texts), sum(len(o) for o in out)
    return {"prefill_tokens_per_s": prefill / prefill_s, "decode_tokens_per_s": decoded / decode_s,
            "prefill_passes": prefill_passes, "decode_passes": decode_passes, "tokens": out}


def _pss_after_first_pass(model_dir, spec, opts, n: int, sizes, queue) -> None:
    before = _pss_kb()
    system = batched(model_dir, spec, opts, n, sizes)
    for r in system.runners:                  # the pools as a long run holds them: every page written
        for pool in (r.sink_k, r.sink_v, r.ring_k, r.ring_v):
            pool.fill(0)
    mask = np.zeros((2, spec.sink + 1 + 2), np.float32)
    system.run([Rows(np.zeros(2, np.int64), np.zeros(2, np.int64), mask)] + [None] * (n - 1))
    gc.collect()
    queue.put((_pss_kb() - before) * 1024)


def _pss_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def memory(model_dir, spec, opts, n: int, sizes: tuple[int, ...]) -> int:
    """Bytes a fresh process holds after building n streams' target (its graphs: `sizes`), writing its pools and
    running one pass (PSS growth; each graph's session holds its own packed weights)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_pss_after_first_pass, args=(model_dir, spec, opts, n, sizes, queue))
    proc.start()
    while True:
        try:
            got = queue.get(timeout=1.0)
            break
        except Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the memory probe of {n} streams exited with code {proc.exitcode}") from None
    proc.join(timeout=60)
    return got


def run_streams(cfg, counts: list[int], prompt_tokens: int = 512, new_tokens: int = 64, repeats: int = 2,
                progress=print) -> dict:
    """{N: {system: figures}} for every N of `counts` (see the module docstring), plus memory per added stream."""
    gguf = cfg.target.gguf
    model_dir, spec, opts = converted_dir(gguf), ring_spec(cfg), cfg.model.runner_options()
    tok = Tokenizer.from_gguf(gguf)
    texts = []
    for name in LOGS[:max(counts)]:
        path = SHARED / name
        text = render(read_log(path)) if path.suffix == ".csv" else path.read_text(errors="replace")
        texts.append(np.asarray(tok.encode(text)[:prompt_tokens + 1], np.int64))
    out: dict = {}
    sizes = (lambda n: cfg.model.graph_sizes(n) if n > 1 else (1,))      # the target actor's graphs
    # per stream: the widest graph alone; the single-stream graph the target keeps beside it is a fixed cost
    mem = {n: memory(model_dir, spec, opts, n, sizes(n)[-1:]) for n in sorted(set(counts) | {1})}
    small = {n: memory(model_dir, spec, opts, n, sizes(n)) - mem[n] for n in counts if n > 1}
    for n in counts:
        figs: dict = {}
        built = systems(model_dir, spec, opts, n, sizes(n))
        for r in range(repeats):
            for system in built if r % 2 == 0 else built[::-1]:
                got = one_run(system, texts[:n], new_tokens)
                figs.setdefault(system.name, []).append(got)
                progress(f"streams {n} {system.name} run {r + 1}: prefill {got['prefill_tokens_per_s']:.0f} tok/s, "
                         f"decode {got['decode_tokens_per_s']:.1f} tok/s")
        row = {}
        for name, runs in figs.items():
            row[name] = {k: float(np.median([g[k] for g in runs])) for k in
                         ("prefill_tokens_per_s", "decode_tokens_per_s", "prefill_passes", "decode_passes")}
        row["identical"] = all(g["tokens"] == runs[0]["tokens"] for runs in figs.values() for g in runs) and \
            all(runs[0]["tokens"] == figs["batched"][0]["tokens"] for runs in figs.values())
        row["aggregate_tokens_per_s"] = row["batched"]["decode_tokens_per_s"]
        row["memory_bytes"] = mem[n]
        row["memory_per_added_stream_bytes"] = (mem[n] - mem[1]) / (n - 1) if n > 1 else 0.0
        row["kv_pool_bytes_per_stream"] = built[0].runners[0].pool_bytes
        row["beyond_pools_per_added_stream_bytes"] = row["memory_per_added_stream_bytes"] - \
            row["kv_pool_bytes_per_stream"] if n > 1 else 0.0
        row["single_stream_graph_bytes"] = small.get(n, 0.0)
        out[n] = row
    base = out[min(counts)]["aggregate_tokens_per_s"] if 1 in counts else None
    for n, row in out.items():
        row["decode_vs_one_stream"] = row["aggregate_tokens_per_s"] / base if base else None
    return out


@dataclass
class StreamsReport(Report):
    """{N: figures} (JSON keys are the stream counts): through the actors (`aggregate_tokens_per_s` is the shared
    pipeline's, `actors` both ways) and target-only (`target_only`), one line per N in each table."""

    def as_dict(self):
        return {str(n): row for n, row in self.data.items()}

    def text(self) -> str:
        return "\n".join((self._actor_lines() if self.through_actors else []) + self._target_lines())

    @property
    def through_actors(self) -> bool:
        return all("actors" in row for row in self.data.values())

    def _actor_lines(self) -> list[str]:
        lines = ["through the actors (replay --rate; one pipeline for N streams against N pipelines):",
                 f"{'streams':>7s} {'decode tok/s':>12s} {'x one':>6s} {'independent':>11s} {'per stream':>10s} "
                 f"{'TTFT ms':>8s} {'same text':>9s} {'MB/added stream':>15s} {'of it pools':>11s}"]
        for n, row in self.data.items():
            a = row["actors"]
            s, i = a["shared"], a.get("independent", a["shared"])
            lines.append(f"{n:7d} {s['aggregate_tokens_per_s']:12.1f} {row['vs_one_stream'] or 0:6.2f} "
                         f"{i['aggregate_tokens_per_s']:11.1f} "
                         f"{np.mean([p['decode_tokens_per_s'] for p in s['per_stream']]):10.1f} "
                         f"{np.mean([p['ttft_ms'] for p in s['per_stream']]):8.0f} {str(a['identical']):>9s} "
                         f"{a['memory_per_added_stream_bytes'] / 2**20:15.1f} "
                         f"{a['kv_pool_bytes_per_stream'] / 2**20 if n > 1 else 0:11.1f}")
        lines.append("peak PSS by process, one pipeline for N streams (MB; memory per added stream from the count "
                     "before, in brackets):")
        for n, row in self.data.items():
            a = row["actors"]
            by = ", ".join(f"{k.removeprefix('rs:')} {v / 2**20:.0f}" for k, v in a["shared"]["pss_by_process_bytes"]
                           .items())
            lines.append(f"{n:7d} {by} [{a['memory_per_added_stream_marginal_bytes'] / 2**20:.0f}]")
        return lines

    def _target_lines(self) -> list[str]:
        lines = ["target only (one several-stream target against N runners taking turns):",
                  f"{'streams':>7s} {'decode tok/s':>12s} {'x one':>6s} {'independent':>11s} {'prefill tok/s':>13s} "
                  f"{'independent':>11s} {'same tokens':>11s} {'MB/added stream':>15s} {'of it pools':>11s}"]
        for n, row in self.data.items():
            t = row["target_only"]
            b, i = t["batched"], t.get("independent", t["batched"])
            lines.append(f"{n:7d} {b['decode_tokens_per_s']:12.1f} {t['decode_vs_one_stream'] or 0:6.2f} "
                         f"{i['decode_tokens_per_s']:11.1f} {b['prefill_tokens_per_s']:13.0f} "
                         f"{i['prefill_tokens_per_s']:11.0f} {str(t['identical']):>11s} "
                         f"{t['memory_per_added_stream_bytes'] / 2**20:15.1f} "
                         f"{t['kv_pool_bytes_per_stream'] / 2**20 if n > 1 else 0:11.1f}")
        extra = [row["target_only"]["single_stream_graph_bytes"] / 2**20 for n, row in self.data.items() if n > 1]
        if extra:
            lines.append(f"and once per target, not per stream: the single-stream graph kept beside the N-stream "
                         f"one, {min(extra):.0f}-{max(extra):.0f} MB")
        return lines

    @property
    def exit_code(self) -> int:
        same = all(row["target_only"]["identical"] and ("actors" not in row or row["actors"]["identical"])
                   for row in self.data.values())
        return 0 if same else 3


def run_streams_bench(cfg, counts: str, prompt_tokens: int, new_tokens: int, repeats: int, config: str | None = None,
                      rate: float = 20.0, lines: int = 48, every: int = 16, through_actors: bool = True) -> Report:
    """`bench --task streams`: see the module docstring and bench/streams_actors.py (through_actors False: the
    target-only figures alone). Exits 3 if a stream's tokens differ between the ways it ran."""
    try:
        wanted = sorted({int(x) for x in counts.split(",") if x.strip()})
    except ValueError:
        return Failure(line=f"ringspec: bench: --streams {counts!r}: give stream counts such as 1,2,4,8", code=2)
    if not wanted or wanted[0] < 1 or 2 * wanted[-1] > SOFTMAX_ROWS or wanted[-1] > len(LOGS):
        return Failure(line=f"ringspec: bench: --streams {counts!r}: counts from 1 to {len(LOGS)} (the logs "
                            f"bench/streams.py names)", code=2)
    if 1 not in wanted:
        wanted = [1] + wanted                     # the ratios are against one stream, measured in the same run
    say = lambda m: print(m, file=sys.stderr, flush=True)      # noqa: E731
    if not through_actors:
        target = run_streams(cfg, wanted, prompt_tokens, new_tokens, repeats, progress=say)
        return StreamsReport({n: {"target_only": target[n]} for n in wanted})
    actors = run_actors(config, wanted, [str(SHARED / name) for name in LOGS], lines, every, rate, repeats,
                        progress=say)
    target = run_streams(cfg, wanted, prompt_tokens, new_tokens, repeats, progress=say)
    one = actors[1]["shared"]["aggregate_tokens_per_s"]
    spec = replay_frame(cfg).spec                 # the actors' pools: replay's ring (its scratch span included)
    card = cfg.target.config
    for row in actors.values():
        row["kv_pool_bytes_per_stream"] = (kv_bytes_per_slot(card, cfg.model.resolved(cfg.target.card).pool_dtype)
                                           * spec.stored_slots)
    return StreamsReport({n: {"aggregate_tokens_per_s": actors[n]["shared"]["aggregate_tokens_per_s"],
                              "vs_one_stream": actors[n]["shared"]["aggregate_tokens_per_s"] / one if one else None,
                              "actors": actors[n], "target_only": target[n]} for n in wanted})

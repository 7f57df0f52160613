"""The speed benchmark: every system on the same prompts in one run, alternated, confined to the same two cores.

Owns the protocol (tasks, prompts, repeats, medians) and the figures per system: decode tokens/s, TTFT, tokens per
verify, decode overhead share, peak resident memory, the share of generated tokens inside repetition loops, and
agreement of greedy tokens with `target_only` and with llama.cpp. Each system lives in its own worker process (so
its peak memory is its own) and keeps its model loaded across prompts. Never asserts a speed; raises `Disagreement`
when a ringspec system's greedy tokens differ from `target_only`'s, which is a correctness failure. `run_bench` is the
`bench` verb: progress on stderr, the table in `BenchReport`, a disagreement as exit code 3.

Tasks:
  log       N offsets of the rendered log (line-aligned), each a 512-token prefix, 256 greedy tokens, no wrap
  analysis  the replay's chat frame around a 512-token window, "summarise the most severe alarms above", 128 tokens
"""
from __future__ import annotations

import ctypes
import functools
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from bench import llama_build
from bench.llama_draft import greedy_draft
from bench.pipelined import PipelinedWorker
from bench.systems import System, load, select, settings, systems
from kernels.sampling import SamplingParams
from models.handle import Model
from models.npu import NpuBusy, one_owner
from models.platform import facts
from pipeline import config
from pipeline.config import ReplaySection
from pipeline.decode.assemble import make_engine
from pipeline.process import proc_status
from pipeline.report import Failure, Report
from pipeline.stream.prompts import chat_frame
from pipeline.stream.records import read_log

TASKS = ("log", "analysis")
QUESTION = "Summarise the most severe alarms above."
PROMPT_TOKENS = {"log": 512, "analysis": 512}
NEW_TOKENS = {"log": 256, "analysis": 128}


class Disagreement(RuntimeError):
    pass


def llama_cpp(build: bool = False):
    """llama-cpp-python as bench/llama_build.py chose it for this process tree (this environment's when it generates
    on this CPU, else the build for this CPU; build=True: build one if need be), or None when there is none (the
    reason on stderr): the one place it is imported."""
    chosen = llama_build.chosen(build)
    if chosen.source == "none":
        print(f"bench: llama.cpp left out: {chosen.reason}", file=sys.stderr, flush=True)
        return None
    llama_build.put_first(chosen)
    try:
        import llama_cpp
        import llama_cpp.llama_chat_format
        import llama_cpp.llama_speculative
    except ImportError as exc:
        print(f"bench: llama.cpp left out: {chosen.source} build at {chosen.path or 'this environment'} does not "
              f"import here ({exc})", file=sys.stderr, flush=True)
        return None
    return llama_cpp


def llama_cpp_available() -> bool:
    """Whether llama.cpp runs here without building it (what bench() would include when none may be built)."""
    return llama_build.chosen().source != "none"


# -- what a system sees --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    task: str
    offset: int                   # first stream token of the window
    ids: tuple[int, ...]
    new_tokens: int
    stop_ids: tuple[int, ...]


@functools.lru_cache(maxsize=4)
def rendered(log: str, gguf: str, fmt: str | None):
    """(tokenizer, token ids of the rendered log, the token index where each line starts): read once per log."""

    tok = Model.of(gguf).tokenizer
    lines = [tok.encode(r.text + "\n") for r in read_log(log, fmt)]
    starts = np.cumsum([0] + [len(x) for x in lines])
    return tok, (np.concatenate(lines) if lines else np.zeros(0, np.int64)), starts


def prompts(log: str, task: str, n: int, gguf: str = "default", fmt: str | None = None,
            new_tokens: int = 0) -> list[Prompt]:
    """`n` line-aligned windows of the rendered log, evenly spread over it, framed for `task`; each asks for the
    task's NEW_TOKENS (at most `new_tokens`, when given)."""

    tok, ids, starts = rendered(str(log), gguf, fmt)
    want = PROMPT_TOKENS[task]
    if len(ids) < want + 1:
        raise ValueError(f"{log} renders to {len(ids)} tokens; the {task} task needs more than {want}")
    line_starts = starts[:-1][starts[:-1] <= len(ids) - want]
    picks = np.unique(line_starts[np.linspace(0, len(line_starts) - 1, n).round().astype(int)])
    head, ask = chat_frame(tok, ReplaySection().system_prompt, QUESTION)
    new = min(NEW_TOKENS[task], new_tokens or NEW_TOKENS[task])
    out = []
    for s in picks:
        window = ids[s:s + want]
        if task == "log":
            out.append(Prompt(task, int(s), tuple(int(t) for t in window), new, ()))
        else:
            full = np.concatenate([head, window, ask])
            out.append(Prompt(task, int(s), tuple(int(t) for t in full), new, tuple(tok.stop_ids)))
    return out


# -- figures -------------------------------------------------------------------------------------------------------
def loop_share(tokens, max_period: int = 32, min_span: int = 12) -> float:
    """Share of tokens inside a repetition loop: a stretch where the text equals itself shifted by a period p
    (1 <= p <= max_period) for at least max(2p, min_span) tokens, i.e. a unit repeated back to back."""
    t = np.asarray(tokens)
    n = len(t)
    looped = np.zeros(n, bool)
    for p in range(1, min(max_period, n // 2) + 1):
        same = np.concatenate([np.zeros(p, bool), t[p:] == t[:-p]])
        edges = np.flatnonzero(np.diff(np.concatenate([[0], same.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):            # runs [a, b) where t[j] == t[j - p]
            if b - a >= max(p, min_span - p):                # the unit t[a-p:a] and >= 1 copy: span b - a + p
                looped[a - p:b] = True
    return float(looped.mean()) if n else 0.0


def _prefix_agreement(a, b) -> int:
    """Number of leading tokens two greedy outputs share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- workers -------------------------------------------------------------------------------------------------------
def _ringspec_runner(system: System, threads: int, window: int, profile: str | None = None):
    engine = make_engine(load(profile, settings(system, threads, window)))

    def run(prompt: Prompt) -> dict:
        engine.reset()                          # a fresh context and draft: nothing carried between prompts
        res = engine.generate(np.asarray(prompt.ids, np.int64), prompt.new_tokens, SamplingParams(),
                              stop_ids=prompt.stop_ids)
        st = res.stats.as_dict()                             # every figure, for draft-scan too
        return {"token_ids": res.token_ids, **st, "overhead_share": st["decode_overhead_share"],
                "salvaged_share": st["salvaged"] / max(st["verify_calls"], 1)}
    run.exactness = engine.exactness.as_dict()
    return run


def _llama_cpp_runner(system: System, threads: int, window: int, profile: str | None = None):
    lib = llama_cpp()
    if lib is None:
        raise RuntimeError("the llama.cpp the bench chose does not load in this worker (the reason above)")
    draft = None
    if system.draft == "lookup":
        draft = lib.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=system.draft_len)
    elif system.draft == "model":                            # the same draft GGUF as ringspec's, llama.cpp running it
        draft = greedy_draft(lib, str(Model.of(system.draft_gguf).gguf), window + 4, system.draft_len, threads,
                             system.min_confidence)
    llm = lib.Llama(model_path=str(Model.of(load(profile).model.gguf).gguf), n_ctx=window + 4,
                    n_threads=threads, n_threads_batch=threads, n_batch=512, flash_attn=True, draft_model=draft,
                    logits_all=draft is not None, verbose=False)      # a draft's rows are verified from all logits

    def run(prompt: Prompt) -> dict:
        llm.reset()                                          # no prompt-cache hit: TTFT includes the prefill
        out, stamps = [], []
        t0 = time.perf_counter()
        for token in llm.generate(list(prompt.ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            stamps.append(time.perf_counter())
            if len(out) >= prompt.new_tokens or token in prompt.stop_ids:
                break
        decode_s = stamps[-1] - stamps[0]
        return {"token_ids": out, "tokens_per_s": (len(out) - 1) / decode_s if decode_s > 0 else 0.0,
                "ttft_ms": (stamps[0] - t0) * 1000.0, "accepted_per_verify": None, "overhead_share": None,
                "salvaged_share": None}
    return run


def _worker(system: System, threads: int, window: int, cpus: list[int], conn, profile: str | None) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)               # PR_SET_PDEATHSIG: never outlive the bench
    os.sched_setaffinity(0, cpus)
    try:
        run = (_ringspec_runner if system.kind == "ringspec" else _llama_cpp_runner)(system, threads, window, profile)
        conn.send(("ready", {"exactness": getattr(run, "exactness", None)}))
        while (prompt := conn.recv()) is not None:
            result = run(prompt)
            result["peak_mb"] = proc_status()["vmhwm_mb"]
            conn.send(("result", result))
    except (EOFError, BrokenPipeError):                      # the bench went away
        return
    except Exception as exc:                                 # reported to the parent, which stops the run
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, system: System, threads: int, window: int, cpus: list[int], profile: str | None = None):
        ctx = mp.get_context("spawn")
        self.system = system
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(system, threads, window, cpus, child, profile), daemon=True,
                                name=f"bench:{system.name}")
        self.proc.start()

    def _reply(self, timeout: float = 600.0):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"bench worker {self.system.name} gave no answer in {timeout:.0f} s")
        kind, body = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"bench worker {self.system.name}: {body}")
        return body

    def run(self, prompt: Prompt) -> dict:
        self.conn.send(prompt)
        return self._reply()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


# -- the run -------------------------------------------------------------------------------------------------------
def bench(log: str, tasks=TASKS, n_offsets: int = 5, repeats: int = 3, threads: int = 2, window: int = 1024,
          draft_gguf: str = "", use_llama_cpp: bool | None = None, progress=None, only=(),
          unpadded: bool = False, profile: str | None = None, new_tokens: int = 0, native: bool = False) -> dict:
    """{task: {system: figures}} plus "_meta"; medians over repeats x offsets, systems alternated per prompt.
    only: these systems (and target_only, the reference), else all. unpadded: every ringspec system also without
    the one-row padding rule, alternated with the rest. profile: the TOML profile each system's keys are set over
    (bench/systems.py; default configs/default.toml), and the model the prompts are tokenized for. new_tokens: at
    most this many tokens per prompt (0: the task's own, NEW_TOKENS)."""
    llama = {"source": "left out by the caller"}
    if use_llama_cpp is not False:           # this environment's llama.cpp, or one built for this CPU (workers inherit it)
        found = llama_build.chosen(build=use_llama_cpp is None)
        use_llama_cpp, llama = found.source != "none", found.as_dict()
        if not use_llama_cpp:
            print(f"bench: llama.cpp left out: {found.reason}", file=sys.stderr, flush=True)
    chosen = select(systems(draft_gguf, use_llama_cpp, unpadded, native), only)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    base = load(profile)
    one_owner(npu_openers(chosen, base), "run one of them at a time (--systems NAME) or the draft on the CPU (a "
              "profile with draft.backend = \"onnx\")")
    task_prompts = {task: prompts(log, task, n_offsets, base.model.gguf, new_tokens=new_tokens) for task in tasks}
    need = max(len(p.ids) + p.new_tokens for ps in task_prompts.values() for p in ps)
    if need > window:
        raise ValueError(f"a prompt plus its new tokens needs {need} positions; the pool window is {window}")
    workers = [(PipelinedWorker if s.kind == "pipelined" else _Worker)(s, threads, window, cpus, profile)
               for s in chosen]
    try:
        exactness = {w.system.name: w._reply()["exactness"] for w in workers}
        out: dict = {"_meta": {"log": str(log), "offsets": n_offsets, "repeats": repeats, "threads": threads,
                               "cpus": cpus, "pool": {"sink": base.cache.sink, "window": window},
                               "systems": [s.name for s in chosen], "platform": facts(), "llama_cpp": llama,
                               "exactness": {k: v for k, v in exactness.items() if v is not None}}}
        for task, ps in task_prompts.items():
            runs: dict[str, list[dict]] = {s.name: [] for s in chosen}
            for r in range(repeats):
                for k, prompt in enumerate(ps):
                    order = workers[k % len(workers):] + workers[:k % len(workers)]   # rotate who goes first
                    for w in order:
                        res = w.run(prompt)
                        res["prompt"] = k
                        runs[w.system.name].append(res)
                        if progress:
                            progress(task, r, k, w.system.name, res)
            out[task] = _table(chosen, runs, out["_meta"]["exactness"])
            out["_meta"][f"{task}_offsets"] = [p.offset for p in ps]
        out["_meta"]["goals"] = goals(out)
    finally:
        for w in workers:
            w.close()
    return out


def npu_openers(chosen: list[System], base) -> list[str]:
    """The systems whose worker would open the NPU: every one running a draft model, when the profile puts the draft
    there (each system is a worker of its own, all alive at once)."""
    if base.draft.backend != "rknn":
        return []
    return [s.name for s in chosen if s.kind != "llama_cpp" and s.draft in ("model", "hybrid")]


# (task, what, reference system, at least): the drafting issue's goals; "best" is the fastest ringspec system
GOALS = (("log", "best", "llama_cpp_plain", 2.0), ("log", "best", "llama_cpp_lookup", 1.3),
         ("analysis", "best", "target_only", 1.3), ("analysis", "target_only", "llama_cpp_plain", 0.9))


def goals(out: dict) -> list[dict]:
    """Each goal whose systems were run: the measured ratio of decode tokens/s, and whether it is met. "best" is
    the fastest ringspec system whose identity with target-only holds here; a goal against target_only is also
    stated against target_only_unpadded (single-row passes, the faster when padding costs), so padding cannot
    inflate a speedup."""
    rows = []
    for task, what, ref, need in GOALS:
        table = out.get(task, {})
        ours = [s for s in table if not s.startswith("llama_cpp") and table[s].get("exact_here") is not False]
        name = max(ours, key=lambda s: table[s]["tokens_per_s"], default=None) if what == "best" else what
        for against in (ref, f"{ref}_unpadded", f"{ref}_native") if ref == "target_only" else (ref,):
            if name in table and against in table and table[against]["tokens_per_s"]:
                ratio = table[name]["tokens_per_s"] / table[against]["tokens_per_s"]
                rows.append({"task": task, "system": name, "against": against, "ratio": ratio, "goal": need,
                             "met": ratio >= need})
    return rows


def _table(chosen: list[System], runs: dict[str, list[dict]], exactness: dict | None = None) -> dict:
    """Figures per system. A ringspec system must reproduce target-only under its padding rule, token for token, in
    every run: a Disagreement otherwise, unless the start-up probe found that system's rows not batch invariant on
    this CPU (exactness[name]["invariant"] false), where identity is not claimed and the row says so."""
    exactness = exactness or {}
    first = {name: {r["prompt"]: r["token_ids"] for r in reversed(rs)} for name, rs in runs.items()}  # first runs
    ref = first["target_only"]
    llama = first.get("llama_cpp_plain")
    table = {}
    for s in chosen:
        rs = runs[s.name]
        exact = s.kind != "llama_cpp" and all(exactness.get(name, {}).get("invariant", True)
                                              for name in (s.name, s.exact_reference))
        if exact:                                         # every run, every repeat: exactly the target's tokens
            want = first[s.exact_reference]
            bad = next((r for r in rs if r["token_ids"] != want[r["prompt"]]), None)
            if bad is not None:
                raise Disagreement(f"{s.name} differs from {s.exact_reference} on prompt {bad['prompt']} at token "
                                   f"{_prefix_agreement(bad['token_ids'], want[bad['prompt']])}: speculative "
                                   f"output must be the target's")
        mine = {r["prompt"]: r["token_ids"] for r in rs}
        own = first[s.exact_reference] if s.kind != "llama_cpp" else ref     # its own kernel's target-only
        same = [mine[k] == own[k] for k in own]

        def med(key, rs=rs):
            vals = [r[key] for r in rs if r.get(key) is not None]
            return statistics.median(vals) if vals else None

        generated = sum(len(t) for t in mine.values())
        table[s.name] = {
            "tokens_per_s": med("tokens_per_s"), "ttft_ms": med("ttft_ms"),
            "accepted_per_verify": med("accepted_per_verify"), "overhead_share": med("overhead_share"),
            "salvaged_share": med("salvaged_share"),
            "peak_mb": max(r["peak_mb"] for r in rs),
            "loop_share": sum(loop_share(t) * len(t) for t in mine.values()) / generated if generated else 0.0,
            "identical_to_target_only": sum(same), "prompts": len(ref),
            "exact_here": exact if s.kind != "llama_cpp" else None,   # identity with target-only claimed and checked
            "agreement_with_target_only": statistics.mean(
                _prefix_agreement(mine[k], own[k]) / max(len(own[k]), 1) for k in own),
            "agreement_with_llama_cpp": None if llama is None else statistics.mean(
                _prefix_agreement(mine[k], llama[k]) / max(len(llama[k]), 1) for k in llama)}
    return table


@dataclass
class BenchReport(Report):
    """The bench's result ({task: {system: figures}, "_meta"}): the exactness caveats, one table per task, the goals."""

    def text(self) -> str:
        out = self.data
        fmt = lambda v, spec: "-" if v is None else format(v, spec)   # noqa: E731
        lines = [f"{name}: identity with target-only not claimed here: {verdict['where']}"
                 for name, verdict in out["_meta"]["exactness"].items() if not verdict["invariant"]]
        for task in (t for t in TASKS if t in out):
            lines.append(f"\n{task}: {out['_meta'][task + '_offsets']} offsets, medians of {out['_meta']['repeats']} "
                         f"repeats")
            lines.append(f"{'system':22s} {'tok/s':>7s} {'ttft ms':>8s} {'tok/verify':>10s} {'overhead':>8s} "
                         f"{'peak MB':>8s} {'loops':>6s} {'=target':>8s} {'~llama':>7s} {'salvaged':>8s}")
            for name, r in out[task].items():
                lines.append(f"{name:22s} {r['tokens_per_s']:7.1f} {r['ttft_ms']:8.0f} "
                             f"{fmt(r['accepted_per_verify'], '10.2f'):>10s} {fmt(r['overhead_share'], '8.1%'):>8s} "
                             f"{r['peak_mb']:8.0f} {r['loop_share']:6.1%} "
                             f"{r['identical_to_target_only']:>4d}/{r['prompts']:<3d} "
                             f"{fmt(r['agreement_with_llama_cpp'], '7.0%'):>7s} {fmt(r['salvaged_share'], '8.1%'):>8s}")
        if out["_meta"]["goals"]:
            lines.append("\ngoals (decode tok/s ratios):")
        for g in out["_meta"]["goals"]:
            verdict = "met" if g["met"] else f"short by {1 - g['ratio'] / g['goal']:.0%}"
            lines.append(f"  {g['task']:8s} {g['system']:14s} / {g['against']:16s} {g['ratio']:5.2f}x  (goal "
                         f"{g['goal']}x: {verdict})")
        return "\n".join(lines)


def _progress(task, repeat, k, name, res) -> None:
    print(f"  {task:8s} repeat {repeat} prompt {k} {name:18s} {res['tokens_per_s']:7.1f} tok/s  ttft "
          f"{res['ttft_ms']:6.0f} ms", file=sys.stderr, flush=True)


def run_bench(cfg, profile: str | None, log: str | None = None, task: str = "all", n_offsets: int = 5, repeats: int = 3,
              systems_named: str = "", llama_cpp: bool = True, unpadded: bool = False, new_tokens: int = 0,
              native: bool = False, given: dict | None = None) -> Report:
    """Greedy decoding of the same prompts by every system, each in its own worker process confined to the same two
    cores, alternated per prompt; medians printed. Tasks: log (line-aligned 512-token prefixes, 256 tokens, no wrap)
    and analysis (the replay's chat frame around a 512-token window, 'summarise the most severe alarms above', 128
    tokens). llama.cpp joins when it generates here: the environment's llama-cpp-python (pip install -e '.[bench]'), else
    one built for this CPU on first use (bench/llama_build.py; which one in "_meta"). Exits 3 if a ringspec
    system's tokens differ from target_only's. --unpadded adds every ringspec system without the one-row padding
    rule (NAME_unpadded), alternated with the rest: what exactness on every CPU costs (python run.py doctor);
    --native every ringspec system on the native kernel too (NAME_native, [model] kernel = "native"). The
    draft_serial, hybrid_* and pipelined_hybrid systems run the neural draft (--draft-model, the profile's
    draft.model; none leaves them out). --json prints {task: {system: figures}, "_meta": run metadata (platform,
    exactness verdicts, goals)}. --task operator: a real `serve` answering 30-token questions while the log replays at
    --rate lines/s (TTFT and answer tok/s, p50 and p95, with and without retrieval), then the line rates of --rates
    with a question every 5 s: does ingestion keep up? --task ingest: stream prefill at a full ring (tokens and
    lines/s) by `replay`, by `serve` with and without a question every 5 s, and llama.cpp's prompt processing of the
    same text at the same context, on the profile's TEP log and two loghub logs (--logs), --seconds each, alternated.
    --task streams: one target carrying several streams' rows per pass against as many single-stream runners taking
    turns, for each stream count of --streams (bench/streams.py; JSON keyed by the count).

    The validated profile `cfg` gives the threads, the pool window and the neural draft; `profile` (its path) is what
    each worker sets its system's keys over (bench/systems.py); `log` defaults to the profile's replay.log; `task`:
    log, analysis or all; `llama_cpp` False leaves llama.cpp out even when installed; `new_tokens` caps each
    prompt's tokens (a quick check). Progress goes to stderr."""
    if n_offsets < 1 or repeats < 1 or new_tokens < 0:
        raise ValueError("--offsets and --repeats must be at least 1, --new-tokens at least 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # unwind: the workers are closed on the way out
    try:
        draft = "" if cfg.draft.model == "none" else cfg.draft.model
        only = [name.strip() for name in systems_named.split(",") if name.strip()]
        out = bench(log or config.replay_log(cfg), TASKS if task == "all" else (task,), n_offsets, repeats,
                    cfg.model.threads, cfg.cache.window, draft, None if llama_cpp else False, _progress, only, unpadded,
                    (profile, given or {}), new_tokens, native)
    except Disagreement as exc:
        return Failure(line=f"ringspec: bench: {exc}", code=3)
    except NpuBusy as exc:
        return Failure(line=f"ringspec: bench: {exc}", code=2)
    return BenchReport(out)

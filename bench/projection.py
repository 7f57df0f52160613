"""A projection of decode speed, checked before it is used: micro-measurements -> a model -> validation -> a board.

Owns four steps over plain dicts (JSON between runs):
  measure   micro-measurements in one run: the target's pass time over a grid of rows T x pool columns P x recent
            columns m (fitted as t = c0 + c1*T + c2*P + c3*T*(P+m), T counting the padding row); the round trips
            owner -> actor -> owner over the pipeline's channels, each actor a process (a Verify to a real target,
            its pass taken out; then, while the target's threads still spin, a Restart to a draft); the target's
            pass slowed by a draft model running beside it (kappa); and, per system and task, a trace of the serial
            engine's steps: rows, columns, proposals, accepted, the draft's seconds and passes, its guess of the
            token after a block accepted whole, the engine's own time (the systems interleaved as `bench` runs them);
            with the actors pinned apart (configs/pair.toml: the target on cpu0 with one thread, the draft on cpu1),
            the pass grid again on the target actor's CPUs (a deferred system's passes), and kappa with the draft on
            its own CPUs
  predict   the model below, from the trace's counts and the measured costs only
  validate  its figures against `bench` and `pipeline-bench` JSON from a separate run: each system's speedup over
            its reference in that run within 15% (the absolute figures beside them carry the host's drift). A
            serial system's figure here is its own trace re-added (the passes at its generations' levels), so its
            row checks that the traced speedup holds in another run; a deferred system's row checks the model
  project   after a validation passed: RK3588 pairs from published per-token costs (`BOARD`, each with its source);
            for the pair's profile (configs/pair.toml) the pair's own measurements and traces at the board's
            published 1.5B-class costs, beside RKLLM's and the article's published figures (`BOARD_PEERS`), for
            the figures the checked runs vouch for (`trusted`: within 15%) when not all are

The model, per verify step s (a step's tokens: its accepted proposals + 1; tokens/s = (generated - 1) / sum of
step times, per prompt, the median over prompts as `bench` reports, or summed over assessments as `pipeline-bench`):
  serial     t_s + d_s + o                          t: pass time, d: drafting, o: the engine's own time per step
             t_s: the fit at the step's (T, P, m) times its generation's level (the generation's passes as they
             ran over the fit's), so a pass and the drafting beside it are costed at the same minutes of a drifting
             host
  deferred   t_s + o + H + (ahead_s ? max(0, d_s + g_s-1 - (t_s-1 + o + H)) : H_d + d_s) + (kappa - 1) min(d'_s, t_s)
             ahead_s: step s-1 was accepted whole and the draft's guess g of the token after it was right, so block
             s was drafted while the target verified s-1 (what drafting outlasts that is waited for); otherwise the
             owner restarts the draft (round trip H_d) and waits for it. H: the owner -> target -> owner round trip.
             d'_s: a draft model's seconds of drafting ahead during pass s (guess + next block), which slow the pass
             by the measured kappa when both share the cores.
Never fits a constant to the figures it is checked against: o is the trace's own engine time, every other cost a
micro-measurement. Measurement code: nothing at run time imports it.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.speed import TASKS, prompts
from bench.systems import System, settings
from kernels.sampling import SamplingParams
from pipeline import config
from pipeline.channel import Channel, cleanup_stale
from pipeline.config import ring_spec
from pipeline.decode.assemble import make_draft, make_engine
from pipeline.messages import Halt, Proposal, Restart, Verdict, Verify, copied, decode, send
from pipeline.process import pin
from pipeline.report import Report
from pipeline.stream.frame import replay_frame
from pipeline.stream.replay import make_session, replay
from pipeline.topology import channel

TOLERANCE = 0.15
SERIAL = {"target_only": System("target_only", "ringspec"),
          "suffix_serial": System("suffix_serial", "ringspec", "suffix"),
          "draft_serial": System("draft_serial", "ringspec", "model", "default-draft", 3),
          "hybrid_serial": System("hybrid_serial", "ringspec", "hybrid", "default-draft", 6)}


def serial(profile: str | None) -> dict[str, System]:
    """The serial systems with the profile's draft model (as `bench` takes it: configs/pair.toml's 0.5B), the
    distilled default draft when the profile names none."""
    draft = config.load(profile).draft.model
    if draft in ("", "none", "default-draft"):
        return SERIAL
    return {name: dataclasses.replace(system, draft_gguf=draft) if system.draft_gguf else system
            for name, system in SERIAL.items()}
DEFERRED = {"pipelined": "suffix_serial", "pipelined_hybrid": "hybrid_serial",      # bench system: the trace it runs
            "pipelined_model": "draft_serial"}


# -- traces ----------------------------------------------------------------------------------------------------------
class _Trace:
    """Wraps a serial engine's verifier and proposer (their interfaces unchanged): one record per verify step, one
    list of records per generation."""

    def __init__(self, engine):
        self.generations: list[list[dict]] = []
        draft = engine.draft
        self._draft = draft
        self._runner = getattr(draft, "runner", None) or getattr(getattr(draft, "model", None), "runner", None)
        self.verifier, self.drafter = _Verifier(engine.verifier, self), _Proposer(engine.drafter, self)
        engine.verifier, engine.drafter = self.verifier, self.drafter
        self._step: dict | None = None

    def model_counters(self) -> tuple[int, float]:
        return (0, 0.0) if self._runner is None else (self._runner.forward_calls, self._runner.forward_s)


class _Verifier:
    def __init__(self, inner, trace: _Trace):
        self.inner, self.trace = inner, trace

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify(self, blk, mask, params, rule_state=None):
        v = self.inner.verify(blk, mask, params, rule_state)
        T, m = len(blk.tokens), len(blk.recent)
        self.trace._step.update(T=T, P=int(mask.shape[1] - m - T), m=m, forward_s=v.forward_s)
        return v


class _Proposer:
    def __init__(self, inner, trace: _Trace):
        self.inner, self.trace = inner, trace

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, pending, n, budget):
        self.trace.generations.append([])
        self.inner.start(pending, n, budget)

    def propose(self, pending, n, k, room, budget, stats):
        calls, model_s = self.trace.model_counters()
        d = self.inner.propose(pending, n, k, room, budget, stats)
        calls2, model_s2 = self.trace.model_counters()
        self.trace._step = {"pending": int(pending), "tokens": [int(t) for t in d.prop.tokens],
                            "draft_s": d.t1 - d.t0, "draft_calls": calls2 - calls, "draft_model_s": model_s2 - model_s}
        return d

    def verdict(self, committed, n, nxt, whole, budget):
        step = self.trace._step
        step.update(accepted=len(committed) - 1, whole=bool(whole), guess_ok=False, guess_s=0.0, guess_calls=0,
                    guess_model_s=0.0)
        if whole:                                  # the draft actor would now draft on its guess of `nxt`
            calls, model_s = self.trace.model_counters()
            t0 = time.perf_counter()
            guess = self.trace._draft.guess([step["pending"], *step["tokens"]])
            step["guess_s"] = time.perf_counter() - t0
            calls2, model_s2 = self.trace.model_counters()
            step.update(guess_ok=guess is not None and int(guess) == int(nxt), guess_calls=calls2 - calls,
                        guess_model_s=model_s2 - model_s)
        del step["tokens"], step["pending"]
        self.trace.generations[-1].append(step)
        self.inner.verdict(committed, n, nxt, whole, budget)


def _generation(steps: list[dict], stats: dict) -> dict:
    """A generation's trace and its engine time per step: decode time outside passes, drafting and the tracer's
    guesses (which the serial engine does not make)."""
    outside = stats["decode_s"] - sum(s["forward_s"] + s["draft_s"] + s["guess_s"] for s in steps)
    return {"generated": stats["generated"], "steps": steps, "own_s": outside / max(len(steps), 1)}


def trace_bench(profile: str | None, log: str, offsets: int, repeats: int, threads: int, window: int,
                progress) -> dict:
    """{system: {task: [generation, ...]}} for the serial systems, on `bench`'s prompts, each `repeats` times,
    interleaved as `bench` runs them (each prompt by every system, who goes first rotating), so that the host's drift
    over the run falls on all systems alike; each system's tokens must be target_only's."""
    engines = {name: make_engine(config.load(profile, settings(system, threads, window)))
               for name, system in serial(profile).items()}
    traces = {name: _Trace(engine) for name, engine in engines.items()}
    out: dict = {name: {task: [] for task in TASKS} for name in SERIAL}
    names = list(SERIAL)
    for task in TASKS:
        ps = prompts(log, task, offsets, config.load(profile).model.gguf)
        for r, (k, prompt) in ((r, kp) for r in range(repeats) for kp in enumerate(ps)):
            reference, first = None, (k + r) % len(names)
            for name in names[first:] + names[:first]:
                engine = engines[name]
                engine.reset()
                res = engine.generate(np.asarray(prompt.ids, np.int64), prompt.new_tokens, SamplingParams(),
                                      stop_ids=prompt.stop_ids)
                if reference is not None and reference != res.token_ids:
                    raise RuntimeError(f"{name} differs from {names[first]} on {task} prompt {k}")
                reference = res.token_ids
                out[name][task].append(_generation(traces[name].generations[-1], res.stats.as_dict()))
        progress(f"  trace {task:8s} " + ", ".join(f"{n} {sum(len(g['steps']) for g in out[n][task])}"
                                                   for n in names) + " steps")
    return out


def trace_replay(profile: str | None, log: str, max_lines: int, progress) -> list[dict]:
    """The serial replay `pipeline-bench` runs (its fixed policy: the profile as it is), one generation per
    assessment."""
    cfg = config.load(profile)
    session = make_session(cfg)
    trace = _Trace(session.engine)
    stats = []
    replay(log, None, cfg, lambda kind, p: stats.append(p["stats"]) if kind == "assessment" else None, max_lines,
           session=session)
    gens = [_generation(steps, st) for steps, st in zip(trace.generations, stats)]
    progress(f"  trace replay {len(gens)} assessments, {sum(len(g['steps']) for g in gens)} steps")
    return gens


# -- pass grid, round trips, contention ------------------------------------------------------------------------------
def pass_grid(runner, points, rounds: int = 9) -> list[dict]:
    """Median seconds of a target pass at each (T, P, m), the points shuffled each round (one process)."""
    rng = np.random.default_rng(0)
    times: dict = {p: [] for p in points}
    S = runner.spec.sink
    for _ in range(rounds):
        for i in rng.permutation(len(points)):
            T, P, m = points[i]
            mask = np.zeros((T, P + m + T), np.float32)
            ids = rng.integers(0, runner.vocab, T)
            pos = np.arange(P + m, P + m + T, dtype=np.int64)
            t0 = time.perf_counter()
            runner.forward(ids, pos, mask, recent_slots=np.arange(S, S + m) if m else None)
            times[points[i]].append(time.perf_counter() - t0)
    return [{"T": T, "P": P, "m": m, "s": statistics.median(ts)} for (T, P, m), ts in times.items()]


def fit_passes(grid: list[dict], padded: bool = True) -> dict:
    """Least squares t = c0 + c1*T + c2*P + c3*T*(P+m) over the grid (T: rows counted as run, the padding row in)."""
    X = np.array([_features(g["T"], g["P"], g["m"], padded) for g in grid])
    y = np.array([g["s"] for g in grid])
    c, *_ = np.linalg.lstsq(X, y, rcond=None)
    err = np.abs(X @ c - y) / y
    return {"c": [float(x) for x in c], "padded": padded, "max_rel_error": float(err.max()),
            "mean_rel_error": float(err.mean())}


def _features(T, P, m, padded: bool):
    T = max(T, 2) if padded else T
    return [1.0, T, P, T * (P + m)]


def pass_s(fit: dict, T: int, P: int, m: int) -> float:
    return float(np.dot(fit["c"], _features(T, P, m, fit["padded"])))


def _target_echo(profile: str | None, to_name: str, back_name: str) -> None:
    """The target's end of `round_trips`: the profile's target runs each Verify's pass (its threads spinning after
    it, as in the actor) and answers with a Verdict carrying the pass's seconds."""
    runner = make_engine(config.load(profile)).runner
    inbox, outbox = Channel.attach(to_name), Channel.attach(back_name)
    while True:
        with inbox.recv(timeout=60.0) as received:
            msg = copied(decode(received))
        if not isinstance(msg, Verify):
            return
        t0 = time.perf_counter()
        runner.forward(msg.ids, msg.pos, msg.mask, recent_slots=msg.recent + runner.spec.sink)
        forward = time.perf_counter() - t0
        send(outbox, Verdict(epoch=msg.epoch, block=msg.block, rows=[0, 1, 2], next=7, t0=t0, t1=t0 + forward,
                             forward_s=forward), timeout=10.0)


def _draft_echo(to_name: str, back_name: str) -> None:
    """The draft's end: each Restart answered at once with a Proposal of 6 tokens (the stream proposer's cost is
    microseconds)."""
    inbox, outbox = Channel.attach(to_name), Channel.attach(back_name)
    while True:
        with inbox.recv(timeout=60.0) as received:
            msg = copied(decode(received))
        if not isinstance(msg, Restart):
            return
        send(outbox, Proposal(epoch=msg.epoch, block=0, n=msg.n, pending=msg.pending, t0=0.0, t1=0.0,
                              tokens=np.arange(6, dtype=np.int64), parent=np.arange(6, dtype=np.int64) - 1),
             timeout=10.0)


def round_trips(profile: str | None = None, T: int = 7, P: int = 640, m: int = 16, n: int = 200) -> dict:
    """Median seconds of owner -> actor -> owner over the pipeline's channels, each actor a process of its own, as
    a step meets them: a Verify of T rows (its mask [T, P+m+T]) to a real target, which runs the pass and answers
    with a Verdict (the pass's own seconds taken out), then at once, while the target's threads still spin, a
    Restart to a draft stand-in answered by a Proposal."""
    tag = f"proj{os.getpid()}"
    specs = {"to_target": channel(tag, "to_target", 8, T * (P + m + T) * 4 + (16 << 10)),
             "from_target": channel(tag, "from_target", 8, 4 << 10),
             "to_draft": channel(tag, "to_draft", 8, 4 << 10), "from_draft": channel(tag, "from_draft", 8, 4 << 10)}
    ch = {name: Channel.create(spec) for name, spec in specs.items()}
    ctx = mp.get_context("spawn")
    children = [ctx.Process(target=_target_echo, args=(profile, specs["to_target"].name,
                                                       specs["from_target"].name), daemon=True),
                ctx.Process(target=_draft_echo, args=(specs["to_draft"].name, specs["from_draft"].name), daemon=True)]
    for c in children:
        c.start()
    verify = Verify(epoch=1, block=0, ring_from=0, ids=np.zeros(T, np.int64),
                    pos=np.arange(P + m, P + m + T, dtype=np.int64),
                    mask=np.zeros((T, P + m + T), np.float32), parent=np.arange(T - 1, dtype=np.int64) - 1,
                    recent=np.arange(m, dtype=np.int64), slots=np.arange(T, dtype=np.int64))
    restart = Restart(epoch=1, n=100, pending=5, budget=100, length=6, ids=np.arange(4, dtype=np.int64))
    hops, redrafts = [], []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            send(ch["to_target"], verify, timeout=120.0)           # the first waits for the target to load
            with ch["from_target"].recv(timeout=120.0) as received:
                verdict = copied(decode(received))
            t1 = time.perf_counter()
            send(ch["to_draft"], restart, timeout=10.0)
            with ch["from_draft"].recv(timeout=30.0) as received:
                copied(decode(received))
            hops.append(t1 - t0 - verdict.forward_s)
            redrafts.append(time.perf_counter() - t1)
        for name in ("to_target", "to_draft"):
            send(ch[name], Halt(), timeout=10.0)
        for c in children:
            c.join(10)
    finally:
        for c in children:
            if c.is_alive():
                c.kill()
        for c in ch.values():
            c.__exit__(None, None, None)
        cleanup_stale()
    return {"verify": statistics.median(hops[n // 10:]), "restart": statistics.median(redrafts[n // 10:])}


def _busy_draft(profile: str | None, window: int, go, stop, cpus: str = "", everywhere=None) -> None:
    """A draft model's single-token passes back to back while `go` is set (the contention's other side), on `cpus`
    when given (the draft actor's). `everywhere`: the CPUs the measuring process had before it pinned itself (a
    spawned process inherits the pin; the profile's CPU split is checked against every CPU)."""
    if everywhere:
        os.sched_setaffinity(0, everywhere)
    cfg = config.load(profile, settings(serial(profile)["draft_serial"], 1, window))
    pin(cpus)
    runner = make_draft(cfg, ring_spec(cfg)).runner
    P = runner.spec.sink + 608
    mask, ids, pos = np.zeros((1, P + 1), np.float32), np.zeros(1, np.int64), np.array([P], np.int64)
    stop.clear()
    while not stop.is_set():
        if go.wait(0.05):
            runner.forward(ids, pos, mask)


def contention(runner, profile: str | None, window: int, draft_cpus: str = "", everywhere=None, rounds: int = 8,
               passes: int = 12) -> dict:
    """kappa: the target's median pass (7 rows, 640 columns) with a draft model passing back to back in another
    process (on the same cores, or on the draft actor's `draft_cpus`), over the same pass alone; alternated in
    blocks. With the actors pinned apart, `runner` runs on the target actor's CPUs (its threads are pinned there)."""
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    stop.set()
    child = ctx.Process(target=_busy_draft, args=(profile, window, go, stop, draft_cpus, everywhere), daemon=True)
    child.start()
    while stop.is_set():                            # the child clears it once its model is loaded
        if not child.is_alive():
            raise RuntimeError(f"the contention's draft process died (exit code {child.exitcode})")
        time.sleep(0.1)
    S = runner.spec.sink
    mask, ids, pos = np.zeros((7, S + 640 + 7), np.float32), np.zeros(7, np.int64), np.arange(S + 640, S + 647)
    alone, busy = [], []
    try:
        for r in range(rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                (go.set if on else go.clear)()
                time.sleep(0.05)
                for _ in range(passes):
                    t0 = time.perf_counter()
                    runner.forward(ids, pos, mask)
                    (busy if on else alone).append(time.perf_counter() - t0)
    finally:
        go.clear()
        stop.set()
        child.join(10)
        if child.is_alive():
            child.kill()
    a, b = statistics.median(alone), statistics.median(busy)
    return {"alone_s": a, "busy_s": b, "kappa": b / a}


def measure(profile: str | None, log: str, pipeline_log: str, offsets: int = 5, max_lines: int = 100,
            repeats: int = 3, progress=print) -> dict:
    """Every micro-measurement in one run (`measure` above); about ten minutes on two cores."""
    cfg = config.load(profile)
    threads, window = cfg.model.threads, cfg.cache.window
    t0 = time.perf_counter()
    traces = trace_bench(profile, log, offsets, repeats, threads, window, progress)
    traces["replay"] = trace_replay(profile, pipeline_log, max_lines, progress)
    steps = [s for sysname, tasks in traces.items() for gens in (tasks.values() if sysname != "replay" else [tasks])
             for g in gens for s in g["steps"]]
    P_lo, P_hi = min(s["P"] for s in steps), max(s["P"] for s in steps)
    engine = make_engine(cfg, replay_frame(cfg).spec)
    runner = engine.runner
    P_hi = min(P_hi, runner.spec.pool_slots)
    Ps = sorted({int(p) for p in np.linspace(max(P_lo, runner.spec.sink), P_hi, 4).round()})
    points = [(T, P, m) for T in (1, 2, 3, 4, 5, 6, 7) for P in Ps for m in (0, 31)]
    grid = pass_grid(runner, points)
    fit = fit_passes(grid, runner.opts.batch_invariant)
    progress(f"  pass grid: {len(points)} points, P {Ps}, fit within {fit['max_rel_error']:.1%} (max)")
    passes = {"grid": grid, "fit": fit}
    split = cfg.actors.target_cpus and cfg.actors.draft_cpus     # the actors pinned apart (configs/pair.toml)
    if split:
        del engine, runner                       # the same pass grid on the target actor's CPUs and threads
        everywhere = os.sched_getaffinity(0)
        pin(cfg.actors.target_cpus)              # this thread runs a one-thread pass: pinned while it does
        try:
            runner = make_engine(cfg, replay_frame(cfg).spec).runner
            grid = pass_grid(runner, points)
            passes["pinned"] = {"grid": grid, "fit": fit_passes(grid, runner.opts.batch_invariant),
                                "cpus": cfg.actors.target_cpus}
            progress(f"  pass grid on cpus {cfg.actors.target_cpus}: fit within "
                     f"{passes['pinned']['fit']['max_rel_error']:.1%} (max)")
            kappa = contention(runner, profile, window, cfg.actors.draft_cpus, everywhere)
        finally:
            os.sched_setaffinity(0, everywhere)
    else:
        kappa = contention(runner, profile, window)
    progress(f"  contention: kappa {kappa['kappa']:.2f}")
    hops = round_trips(profile)
    progress(f"  round trips: verify {hops['verify'] * 1e6:.0f} us, restart {hops['restart'] * 1e6:.0f} us")
    return {"_meta": {"log": log, "pipeline_log": pipeline_log, "offsets": offsets, "repeats": repeats,
                      "max_lines": max_lines,
                      "threads": threads, "window": window, "seconds": time.perf_counter() - t0},
            "passes": passes, "round_trips": hops, "contention": kappa, "traces": traces}


# -- the model -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Costs:
    """What a step costs on some machine. pass_s(T, P, m): the target's pass; draft_pass_s: a draft model's pass
    (None: as traced); cpu_scale: the engine's own time and the stream proposer's, against this machine's."""
    pass_s: object
    hop_s: float
    draft_hop_s: float
    kappa: float
    draft_pass_s: float | None = None
    cpu_scale: float = 1.0
    deferred_pass_s: object = None                # the target actor's pass when pinned apart from the draft's CPUs

    def drafting(self, seconds: float, calls: int, model_s: float) -> float:
        if self.draft_pass_s is None:
            return seconds
        return (seconds - model_s) * self.cpu_scale + calls * self.draft_pass_s

    def at(self, level: float) -> Costs:
        """The same costs with every pass `level` times as long (a trace's pass level, `pass_level`)."""
        d = self.deferred_pass_s
        return dataclasses.replace(self, pass_s=lambda T, P, r, f=self.pass_s: level * f(T, P, r),
                                   deferred_pass_s=d and (lambda T, P, r, f=d: level * f(T, P, r)))


def costs_here(m: dict) -> Costs:
    fit, pinned = m["passes"]["fit"], m["passes"].get("pinned")
    return Costs(lambda T, P, r: pass_s(fit, T, P, r), m["round_trips"]["verify"], m["round_trips"]["restart"],
                 m["contention"]["kappa"],
                 deferred_pass_s=pinned and (lambda T, P, r: pass_s(pinned["fit"], T, P, r)))


def pass_level(gens: list[dict], fit: dict) -> float:
    """Passes as they ran over the fit's for the same (T, P, m): the grid gives the shape of the cost, each traced
    generation its level at the seconds its drafting and own time were measured (on these shared hosts the same pass
    took 19 ms in one hour and 30 ms in another, one run's grid sat 20% above its traces, and generations of one
    system minutes apart differ by 2x)."""
    steps = [s for g in gens for s in g["steps"]]
    return sum(s["forward_s"] for s in steps) / sum(pass_s(fit, s["T"], s["P"], s["m"]) for s in steps)


def levels(m: dict) -> dict:
    """{system: {task: level}} for the serial traces, and "replay" (each pooled over its generations: a summary;
    the model applies each generation's own)."""
    fit, tr = m["passes"]["fit"], m["traces"]
    return {**{name: {task: pass_level(tr[name][task], fit) for task in TASKS} for name in SERIAL},
            "replay": pass_level(tr["replay"], fit)}


def generation_seconds(gen: dict, costs: Costs, deferred: bool) -> float:
    """Decode seconds of one traced generation under `costs`, serial or deferred (the model above)."""
    total, prev_t, ahead = 0.0, 0.0, False
    own = gen["own_s"] * costs.cpu_scale
    steps = gen["steps"]
    run = costs.deferred_pass_s if deferred and costs.deferred_pass_s else costs.pass_s
    for i, s in enumerate(steps):
        t = run(s["T"], s["P"], s["m"])
        d = costs.drafting(s["draft_s"], s["draft_calls"], s["draft_model_s"])
        if not deferred:
            total += t + d + own
            continue
        g_prev = costs.drafting(steps[i - 1]["guess_s"], steps[i - 1]["guess_calls"],
                                steps[i - 1]["guess_model_s"]) if i else 0.0
        wait = max(0.0, d + g_prev - (prev_t + own + costs.hop_s)) if ahead else costs.draft_hop_s + d
        if i + 1 < len(steps) and (steps[i + 1]["draft_calls"] or s["guess_calls"]):
            nxt = steps[i + 1]
            beside = costs.drafting(s["guess_s"], s["guess_calls"], s["guess_model_s"]) + costs.drafting(
                nxt["draft_s"], nxt["draft_calls"], nxt["draft_model_s"])
            t += (costs.kappa - 1.0) * min(beside, t)
        total += t + own + costs.hop_s + wait
        prev_t, ahead = t, s["whole"] and s["guess_ok"]
    return total


def tokens_per_s(gens: list[dict], costs: Costs, deferred: bool, fit: dict, pooled: bool = False) -> float:
    """The median over generations of (generated - 1) / seconds (`bench`), or pooled over them (`pipeline-bench`);
    each generation's passes at its own level over `fit`."""
    secs = [generation_seconds(g, costs.at(pass_level([g], fit)), deferred) for g in gens]
    if pooled:
        return sum(g["generated"] - 1 for g in gens) / sum(secs)
    return statistics.median((g["generated"] - 1) / s for g, s in zip(gens, secs) if s > 0)


def predict(m: dict, costs: Costs | None = None) -> dict:
    """{"bench": {task: {system: tok/s}}, "pipeline-bench": {"serial": tok/s, "pipelined": tok/s}}; a deferred
    system runs the serial trace it is built on (`DEFERRED`)."""
    costs, fit, tr = costs or costs_here(m), m["passes"]["fit"], m["traces"]
    bench = {task: {**{name: tokens_per_s(tr[name][task], costs, False, fit) for name in SERIAL},
                    **{name: tokens_per_s(tr[base][task], costs, True, fit) for name, base in DEFERRED.items()}}
             for task in TASKS}
    return {"bench": bench, "pipeline-bench": {side: tokens_per_s(tr["replay"], costs, side == "pipelined", fit,
                                                                  pooled=True) for side in ("serial", "pipelined")}}


def acceptance(gens: list[dict], depth: int = 8) -> dict:
    """Per depth i: the share of steps offering an i-th proposal once the first i-1 were accepted, and the share of
    those accepting it; tokens per verify; the share of steps accepted whole whose next token the draft guessed."""
    offered, accepted, reached = np.zeros(depth), np.zeros(depth), np.zeros(depth)
    steps = [s for g in gens for s in g["steps"]]
    for s in steps:
        n = s["T"] - 1
        for i in range(min(depth, n + 1)):
            if i and s["accepted"] < i:
                break
            reached[i] += 1
            if i < n:
                offered[i] += 1
                accepted[i] += s["accepted"] > i
    whole = [s for s in steps if s["whole"]]
    return {"offered": (offered / np.maximum(reached, 1)).round(3).tolist(),
            "accepted": (accepted / np.maximum(offered, 1)).round(3).tolist(),
            "tokens_per_verify": sum(s["accepted"] + 1 for s in steps) / len(steps),
            "ahead": sum(s["guess_ok"] for s in whole) / len(steps)}


# -- validation ------------------------------------------------------------------------------------------------------
def validate(predicted: dict, bench: dict | None, pipeline_bench: dict | None) -> list[dict]:
    """Each prediction beside the separate run's figure, and each system's speedup over its reference in that run
    (target_only; pipeline-bench's serial side) beside the predicted speedup. The check is on the speedups: a ratio
    within one run cancels the host's drift between the measurements and the checked run (on these shared hosts,
    minutes apart, it moved target-only by 25%), which the absolute figures carry; a reference's own row shows that
    drift and is not checked."""
    pairs = []
    for task in TASKS:
        for name in predicted["bench"][task]:
            got = (bench or {}).get(task, {}).get(name, {}).get("tokens_per_s")
            if got:
                pairs.append((f"bench {task} {name}", predicted["bench"][task][name], got,
                              predicted["bench"][task]["target_only"], bench[task]["target_only"]["tokens_per_s"],
                              name == "target_only"))
    if pipeline_bench:
        fixed, pred = pipeline_bench["fixed"], predicted["pipeline-bench"]
        for side in ("serial", "pipelined"):
            pairs.append((f"pipeline-bench fixed {side}", pred[side], fixed[side]["decode_tok_s"], pred["serial"],
                          fixed["serial"]["decode_tok_s"], side == "serial"))
    rows = []
    for figure, pred, got, pred_ref, got_ref, reference in pairs:
        row = {"figure": figure, "predicted": pred, "measured": got, "ratio": pred / got, "reference": reference}
        if not reference:
            row.update(predicted_speedup=pred / pred_ref, measured_speedup=got / got_ref)
            row["speedup_ratio"] = row["predicted_speedup"] / row["measured_speedup"]
        row["within"] = None if reference else abs(row["speedup_ratio"] - 1.0) <= TOLERANCE
        rows.append(row)
    return rows


def validated(rows: list[dict]) -> bool:
    """Every checked row (a speedup) within the tolerance, and at least one."""
    checked = [r for r in rows if r["within"] is not None]
    return bool(checked) and all(r["within"] for r in checked)


def trusted(rows: list[dict]) -> set[str]:
    """The figures the checked runs vouch for, as "<task> <system>" ("log suffix_serial", "pipeline-bench
    pipelined"): within the tolerance, or a reference; a figure with no row is not among them."""
    return {" ".join(w for w in r["figure"].split() if w not in ("bench", "fixed")) for r in rows
            if r["within"] is not False}


def _only(board: list[dict], keep: set[str]) -> list[dict]:
    """A board's rows with the figures outside `keep` left out."""
    return [{**r, "bench": {task: {n: v for n, v in figures.items() if f"{task} {n}" in keep}
                            for task, figures in r["bench"].items()},
             "pipeline-bench": {side: v for side, v in r["pipeline-bench"].items() if f"pipeline-bench {side}" in keep}}
            for r in board]


def _figures(board: list[dict]) -> set[str]:
    return {f"{task} {n}" for task, figures in board[0]["bench"].items() for n in figures} | \
        {f"pipeline-bench {side}" for side in board[0]["pipeline-bench"]}


# -- the board -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    value: float
    unit: str
    source: str


# Published per-token costs (and the two assumptions no publication gives), each with where it comes from.
BOARD = {
    "cpu_tg": Input(55.2, "tok/s", "llama.cpp on 4 Cortex-A76 (taskset -c 4-7, -t 4), Granite-4.0-350M Q4_0 tg128: "
                    "invisiofficial/rk-llama.cpp, ggml/src/ggml-rknpu2/README.md, Benchmarks"),
    "cpu_pp": Input(340.4, "tok/s", "the same table, pp512"),
    "cpu_model_bytes": Input(197e6, "B", "Granite-4.0-350M at Q4_0's 4.5 bits per weight (350M weights; estimated "
                             "from the parameter count, no file size published beside the table)"),
    "cpu_model_params": Input(350e6, "weights", "Granite-4.0-350M (its name)"),
    "npu_draft_pass": Input(2.9e-3, "s", "a small transformer decoder step on one RK3588 NPU core: lite-transformer "
                            "decoder-16 FP16, 343.8 FPS, airockchip/rknn_model_zoo v2.3.2 README.md, Model "
                            "performance benchmark (the distilled draft, 2 layers d=256, is of that size)"),
    "cpu_scale": Input(4.0, "x", "assumed, no publication: Python on a Cortex-A55 (cache owner, draft actor, their "
                       "messages) against one core here; the table shows 2x and 8x beside it"),
    "kappa": Input(1.0, "x", "assumed: the draft on the NPU takes no A76 core from the target (shared LPDDR "
                   "bandwidth ignored)"),
    "large_tg": Input((12.0 * 3.6 / 1.54, 28.3 * 1.0 / 1.54), "tok/s",
                      "a 1.5B Q4_0 target on 4 A76 (low, high): ROCK 5B 3.6B Q4_0 tg 12 (ikawrakow/ik_llama.cpp "
                      "issue 345, corrected figures) scaled by weights 3.6/1.54; Gemma3-1B Q4_0 tg 28.3 "
                      "(rk-llama.cpp table) scaled 1.0/1.54"),
    "large_pp": Input((40.0 * 3.6 / 1.54, 164.7 * 1.0 / 1.54), "tok/s",
                      "the same two sources, pp: 40 (3.6B) and 164.7 (Gemma3-1B), scaled by weights"),
    "large_draft_token": Input(1.0 / 41.58, "s", "Qwen2-0.5B w8a8 on the RK3588 NPU, 41.58 tok/s decode: "
                               "airockchip/rknn-llm benchmark.md, release v1.3.0"),
    "large_acceptance": Input((0.4, 0.5, 0.6), "per token", "0.5B drafting 1.5B/7B Qwen2.5, 33-45% and 51% "
                              "(mattn/tensai PRs 113 and 44), read as a per-depth acceptance"),
}


def board_costs(m: dict, here_llama: dict, cpu_scale: float | None = None, there: tuple | None = None,
                draft_pass_s: float | None = None) -> Costs:
    """This machine's fitted pass scaled to 4 Cortex-A76: its per-pass terms (c0, c2 P: weights and K/V read once)
    by llama.cpp's bytes per second here over there (tg x model bytes), its per-row terms (c1 T, c3 T (P+m)) by
    llama.cpp's weights x tokens per second here over there (pp x weights); the draft's model passes on the NPU; the
    engine's own time, the stream proposer and the round trips `cpu_scale` slower (the little cores). `there`:
    (tg, pp, bytes, weights) on the board, by default the small model's published figures; `draft_pass_s`: a draft
    pass on the NPU, by default the distilled draft's."""
    c = m["passes"]["fit"]["c"]
    padded = m["passes"]["fit"]["padded"]
    b = BOARD
    tg, pp, nbytes, params = there or (b["cpu_tg"].value, b["cpu_pp"].value, b["cpu_model_bytes"].value,
                                       b["cpu_model_params"].value)
    mem = here_llama["tg"] * here_llama["bytes"] / (tg * nbytes)
    row = here_llama["pp"] * here_llama["params"] / (pp * params)
    scale = b["cpu_scale"].value if cpu_scale is None else cpu_scale

    def board_pass(T, P, r):
        f = _features(T, P, r, padded)
        return mem * (c[0] + c[2] * f[2]) + row * (c[1] * f[1] + c[3] * f[3])
    return Costs(board_pass, m["round_trips"]["verify"] * scale, m["round_trips"]["restart"] * scale,
                 b["kappa"].value, draft_pass_s or b["npu_draft_pass"].value, scale)


def project_small(m: dict, here_llama: dict) -> dict:
    """SmolLM2-135M on the A76 cores with the distilled draft on the NPU: {cpu_scale: predict(...)}."""
    return {str(s): predict(m, board_costs(m, here_llama, s)) for s in (2.0, BOARD["cpu_scale"].value, 8.0)}


def chain_speed(k: int, alpha: float, t, d: float, own: float, hop: float, draft_hop: float) -> dict:
    """A chain of k proposals each accepted with probability alpha given the ones before (the per-depth form of the
    trace model): tokens per verify 1 + sum alpha^i; serial step k d + t(k+1) + own; deferred, ahead with
    probability alpha^(k+1) (all accepted, the guess right): t + own + hop + max(0, (k+1) d - t - own - hop),
    otherwise t + own + hop + draft_hop + k d."""
    tokens = 1.0 + sum(alpha ** i for i in range(1, k + 1))
    tv = t(k + 1)
    ahead = alpha ** (k + 1)
    serial = k * d + tv + own
    deferred = tv + own + hop + ahead * max(0.0, (k + 1) * d - tv - own - hop) + (1 - ahead) * (draft_hop + k * d)
    return {"k": k, "tokens_per_verify": tokens, "serial": tokens / serial, "deferred": tokens / deferred}


# A pass of T rows of a large target on the CPU, from its decode (tg) and prompt (pp) rates, two ways around the
# truth: every row past the first at prompt cost on top of a decode step (additive: pessimistic), or the slower of
# reading the weights once and computing T rows at the prompt rate (roofline: optimistic). A lone row runs as two.
PASS_FORMS = {"additive": lambda T, tg, pp: 1.0 / tg + (max(T, 2) - 1) / pp,
              "roofline": lambda T, tg, pp: max(1.0 / tg, max(T, 2) / pp)}


def project_large(m: dict) -> list[dict]:
    """A 1.5B target on the A76 cores, a 0.5B draft on the NPU: target-only, and the best k (1..8) serial and
    deferred, per pass form, per (low, high) CPU figures and per acceptance."""
    b = BOARD
    own = statistics.median(g["own_s"] for g in m["traces"]["suffix_serial"]["log"]) * b["cpu_scale"].value
    hop, draft_hop = (m["round_trips"][k] * b["cpu_scale"].value for k in ("verify", "restart"))
    rows = []
    for form, cost in PASS_FORMS.items():
        for tg, pp in zip(b["large_tg"].value, b["large_pp"].value):
            def t(T, tg=tg, pp=pp, cost=cost):
                return cost(T, tg, pp)
            for alpha in b["large_acceptance"].value:
                options = [chain_speed(k, alpha, t, b["large_draft_token"].value, own, hop, draft_hop)
                           for k in range(1, 9)]
                best_s = max(options, key=lambda o: o["serial"])
                best_d = max(options, key=lambda o: o["deferred"])
                rows.append({"pass": form, "tg": tg, "pp": pp, "alpha": alpha, "target_only": 1.0 / (t(1) + own),
                             "serial": best_s["serial"], "serial_k": best_s["k"], "deferred": best_d["deferred"],
                             "deferred_k": best_d["k"]})
    return rows


# -- the verb --------------------------------------------------------------------------------------------------------
# A target's bytes read per decoded token by llama.cpp and its weights, which scale this machine's pass to the board.
READS = {"default": (110e6, 134.5e6, "docs/speed.md: 110 MB at ~670 positions; 134.5M weights"),
         "qwen2.5-coder-1.5b": (0.99e9, 1.54e9, "docs/models.md: the GGUF less its token table, 0.99 GB; 1.54B "
                                "weights")}


def here_llama_cpp(bench: dict, model: str = "default") -> dict | None:
    """llama.cpp's figures in the bench run (the log task): decode tok/s, prompt tok/s (512 tokens / TTFT), and the
    target's bytes per token and weights (`READS`)."""
    row = (bench or {}).get("log", {}).get("llama_cpp_plain")
    if not row or not row.get("tokens_per_s") or model not in READS:
        return None
    return {"tg": row["tokens_per_s"], "pp": 512.0 / (row["ttft_ms"] / 1000.0), "bytes": READS[model][0],
            "params": READS[model][1]}


# The pair on the board, beside it: what runs there today on the same class of model.
BOARD_PEERS = {"rkllm_qwen2.5_1.5b": Input(16.7, "tok/s", "RKLLM 1.3, Qwen2.5-1.5B w8a8 on the RK3588 NPU alone "
                                           "(airockchip/rknn-llm benchmark.md)"),
               "article_pair": Input(18.7, "tok/s", "the source article: a 1.8B target with a 0.3B draft, deferred "
                                     "speculation with the sink+ring cache (../shared/reference)")}


def project_pair(m: dict, here_llama: dict) -> list[dict]:
    """The pair measured here (its pass fit, its traces' acceptance and guesses, its engine's own time), on the
    board: the 1.5B on 4 Cortex-A76 at the published (low, high) 1.5B-class figures (`large_tg`, `large_pp`), the
    0.5B on the NPU at RKLLM's published decode rate (`large_draft_token`), per engine-CPU scale; every system the
    traces ran, serial and deferred, and the main job."""
    b, out = BOARD, []
    for tg, pp in zip(b["large_tg"].value, b["large_pp"].value):
        for scale in (2.0, b["cpu_scale"].value, 8.0):
            costs = board_costs(m, here_llama, scale, (tg, pp, here_llama["bytes"], here_llama["params"]),
                                b["large_draft_token"].value)
            out.append({"tg": tg, "pp": pp, "cpu_scale": scale, **predict(m, costs)})
    return out


@dataclass
class ProjectionReport(Report):
    """The validation first; the board only when every figure was within the tolerance (the pair's: for the figures
    that were)."""

    def as_dict(self):
        return {k: v for k, v in self.data.items() if k != "measurements"}

    def saved(self):
        return self.data

    def text(self) -> str:
        d = self.data
        out = ["validation: predicted from the micro-measurements against a separate run's figures (decode tok/s); "
               "checked: each speedup over the run's reference (target_only, or pipeline-bench's serial side) "
               "within 15%",
               f"  {'figure':36s} {'predicted':>9s} {'measured':>9s} {'ratio':>6s}   {'speedup predicted':>17s} "
               f"{'measured':>8s} {'ratio':>6s}"]
        for r in d["validation"]:
            line = f"  {r['figure']:36s} {r['predicted']:9.1f} {r['measured']:9.1f} {r['ratio']:5.2f}x   "
            if r["reference"]:
                line += "(the reference: the host's drift between the two runs)"
            else:
                line += (f"{r['predicted_speedup']:16.2f}x {r['measured_speedup']:7.2f}x {r['speedup_ratio']:5.2f}x"
                         f"{'' if r['within'] else '  OUTSIDE 15%'}")
            out.append(line)
        if not d["validation"]:
            out.append("  (no figures to check: give --bench and --pipeline-bench JSON from a separate run)")
        out.append("micro-measurements: " + ", ".join(f"{k} {v}" for k, v in d["inputs"].items()))
        if not d.get("board"):
            out.append(d["withheld"])
            return "\n".join(out)
        if "pair" in d["board"]:
            return "\n".join(out + self._pair_text())
        out.append("PROJECTION (not measured): RK3588, SmolLM2-135M on 4 Cortex-A76, the distilled draft on the NPU, "
                   "decode tok/s per engine-CPU scale (the little cores against this host's)")
        small = d["board"]["small"]
        scales = list(small)
        out.append(f"  {'task':9s} {'system':17s} " + " ".join(f"{'x' + s:>8s}" for s in scales))
        for task in TASKS:
            for name in small[scales[0]]["bench"][task]:
                out.append(f"  {task:9s} {name:17s} " + " ".join(f"{small[s]['bench'][task][name]:8.1f}"
                                                                 for s in scales))
        for side in ("serial", "pipelined"):
            out.append(f"  {'replay':9s} {side:17s} " + " ".join(f"{small[s]['pipeline-bench'][side]:8.1f}"
                                                                 for s in scales))
        out.append("PROJECTION (not measured): RK3588, a 1.5B target on 4 Cortex-A76, a 0.5B draft on the NPU "
                   "(24 ms a token), best chain length")
        out.append(f"  {'pass':8s} {'tg':>5s} {'pp':>6s} {'alpha':>5s} {'target':>7s} {'serial':>7s} {'k':>2s} "
                   f"{'deferred':>8s} {'k':>2s}")
        for r in d["board"]["large"]:
            out.append(f"  {r['pass']:8s} {r['tg']:5.1f} {r['pp']:6.1f} {r['alpha']:5.2f} {r['target_only']:7.1f} "
                       f"{r['serial']:7.1f} {r['serial_k']:2d} {r['deferred']:8.1f} {r['deferred_k']:2d}")
        out.append("inputs: " + "; ".join(f"{k} = {v.value} {v.unit} ({v.source})" for k, v in BOARD.items()))
        return "\n".join(out)

    def _pair_text(self) -> list[str]:
        board = self.data["board"]
        rows = board["pair"]
        names = [(task, name) for task in TASKS for name in rows[0]["bench"][task]]
        out = ["PROJECTION (not measured): RK3588, the pair measured here: the 1.5B on 4 Cortex-A76 at the published "
               "(low, high) 1.5B-class figures, the 0.5B on the NPU at RKLLM's 41.58 tok/s; decode tok/s per "
               "engine-CPU scale",
               f"  {'task':9s} {'system':17s} " + " ".join(f"{r['tg']:5.1f}tg x{r['cpu_scale']:<3g}" for r in rows)]
        for task, name in names:
            out.append(f"  {task:9s} {name:17s} " + " ".join(f"{r['bench'][task][name]:12.1f}" for r in rows))
        for side in rows[0]["pipeline-bench"]:
            out.append(f"  {'replay':9s} {side:17s} " + " ".join(f"{r['pipeline-bench'][side]:12.1f}" for r in rows))
        if board.get("withheld"):
            out.append("not projected (outside 15% or not in the checked runs): " + ", ".join(board["withheld"]))
        out.append("beside it, published: " + "; ".join(f"{v['value']} {v['unit']} ({v['source']})"
                                                         for v in board["peers"].values()))
        out.append(f"reads: {board['reads']}; inputs: " + "; ".join(
            f"{k} = {v['value']} {v['unit']} ({v['source']})" for k, v in board["inputs"].items()
            if k.startswith("large") or k == "cpu_scale"))
        return out

    @property
    def exit_code(self) -> int:
        return 0 if validated(self.data["validation"]) else 1


def run_project(profile: str | None, log: str | None, pipeline_log: str, measured: str | None, bench_json: str | None,
                pipeline_json: str | None, offsets: int = 5, max_lines: int = 100,
                repeats: int = 3) -> ProjectionReport:
    """A model of serial and deferred decode speed built from micro-measurements taken in one run, checked against
    `bench` and `pipeline-bench` figures from a separate run (each within 15%), and only then used to project RK3588
    figures from published per-token costs (every input listed with its source). Exit 1 when a figure misses.

    The micro-measurements (about ten minutes; --from reuses a run's --out file): the target's pass time over rows x
    pool columns x recent columns, fitted as c0 + c1 T + c2 P + c3 T (P + m); the owner -> actor -> owner round
    trip over the pipeline's channels; the target's pass slowed by a draft model beside it; and a trace of the
    serial engine's steps per system and task (rows, proposals, accepted, drafting, the draft's guesses). The figures
    to check: `python run.py bench --repeats 3 --offsets 5 --json --out B.json` and `python run.py pipeline-bench
    --policies fixed --json > P.json`, run apart from the measurements. The model is written out at the top of
    bench/projection.py; docs/speed.md, "A projection", has its figures."""
    progress = (lambda s: print(s, file=sys.stderr, flush=True))
    log = log or config.replay_log(config.load(profile))
    if measured:
        m = json.loads(Path(measured).read_text())
        m = m.get("measurements", m)                # a run's --out, or the measurements alone
    else:
        m = measure(profile, log, pipeline_log, offsets, max_lines, repeats, progress)
    bench = json.loads(Path(bench_json).read_text()) if bench_json else None
    pipe = json.loads(Path(pipeline_json).read_text()) if pipeline_json else None
    predicted = predict(m)
    rows = validate(predicted, bench, pipe)
    inputs = {"pass_fit_max_error": f"{m['passes']['fit']['max_rel_error']:.1%}",
              "verify_round_trip_us": round(m["round_trips"]["verify"] * 1e6),
              "restart_round_trip_us": round(m["round_trips"]["restart"] * 1e6),
              "kappa": round(m["contention"]["kappa"], 2),
              "pass_levels": {k: (round(v, 2) if isinstance(v, float) else {t: round(x, 2) for t, x in v.items()})
                              for k, v in levels(m).items()}}
    out = {"predicted": predicted, "validation": rows, "inputs": inputs,
           "acceptance": {**{name: {task: acceptance(m["traces"][name][task]) for task in TASKS} for name in SERIAL},
                          "replay": acceptance(m["traces"]["replay"])},
           "measurements": m}
    model = config.load(profile).model.gguf
    llama = here_llama_cpp(bench, model)
    if llama:       # llama.cpp's figures moved to the traces' minutes by the host's drift in target_only's row
        drift = predicted["bench"]["log"]["target_only"] / bench["log"]["target_only"]["tokens_per_s"]
        llama = {**llama, "tg": llama["tg"] * drift, "pp": llama["pp"] * drift}
    checked = validated(rows) and pipe is not None
    vouched = trusted(rows) if pipe is not None else set()
    if (checked or {v for v in vouched if not v.endswith((" target_only", " serial"))}) and llama and \
            model != "default":
        # the pair: its own traces on the board, for the systems the checked run vouches for
        board = project_pair(m, llama)
        out["board"] = {"pair": board if checked else _only(board, vouched),
                        "peers": {k: vars(v) for k, v in BOARD_PEERS.items()},
                        "inputs": {k: vars(v) for k, v in BOARD.items()}, "reads": READS[model][2],
                        "withheld": [] if checked else sorted(_figures(board) - vouched)}
    elif checked and llama:
        out["board"] = {"small": project_small(m, llama), "large": project_large(m),
                        "inputs": {k: vars(v) for k, v in BOARD.items()}}
    else:
        out["withheld"] = ("no projection: " + ("the bench JSON has no llama_cpp_plain row (pip install -e "
                                                "'.[bench]'), which scales this machine's pass to the board"
                                                if checked else "the model is not validated here (every bench and "
                                                "pipeline-bench speedup within 15%)"))
    return ProjectionReport(out)

"""The speed bench's `pipelined` system: target and draft actors in processes of their own, driven from the bench.

Owns their lifetime for one bench run (`ModelActors`, which the pipelined engine's tests use too): the two channels
they answer on (created here), the actor processes (spawned with `process.enter`, pinned to the profile's CPUs, killed
if the bench dies), and a `DeferredEngine` in this process standing where the cache owner stands in `serve` and
`replay`. Same interface as the bench's workers: `run(prompt)` returns the generation's figures, `close()` stops
everything. Never measures anything itself.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time

import numpy as np

import actors.draft
import actors.target
from actors.args import DraftArgs, TargetArgs
from bench.systems import load, settings
from kernels.sampling import SamplingParams
from pipeline.channel import Channel, cleanup_stale
from pipeline.config import cpu_set, ring_spec
from pipeline.decode.assemble import policy
from pipeline.decode.deferred import DeferredEngine
from pipeline.process import StopFlag, attach_when_ready, enter, proc_status
from pipeline.topology import model_links


def _enter(run, args) -> None:
    """An actor that dies with the bench (PR_SET_PDEATHSIG), then the launcher's entry point."""

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    enter(run, args)


class ModelActors:
    """The target and draft actors of `cfg` in processes of their own (pinned to `cpus`, killed if this process dies),
    and a `DeferredEngine` over their links in this process, standing where the cache owner stands."""

    def __init__(self, cfg, spec=None, threads: bool = False):
        """threads: run the two actors as threads of this process instead (a test that must see their allocations
        with tracemalloc; nothing else differs)."""
        self.cfg = cfg
        self.spec = spec or ring_spec(cfg)                          # the serial systems' pool (make_engine)
        vocab = cfg.target.config["vocab_size"]
        self.run_dir = tempfile.mkdtemp(prefix="ringspec_benchpipe_")
        self.stop = StopFlag(f"{self.run_dir}/stop")
        links = model_links(cfg, self.spec, vocab, f"b{os.getpid()}_{int(time.time() * 1000) % 1_000_000}")
        to_target, to_draft = links["to_target"], links["to_draft"]
        self.from_target = Channel.create(links["from_target"])
        self.from_draft = Channel.create(links["from_draft"])
        ctx = mp.get_context("spawn")
        start = ((lambda run, args: threading.Thread(target=run, args=(args,), daemon=True)) if threads else
                 (lambda run, args: ctx.Process(target=_enter, args=(run, args))))
        self.procs = [
            start(actors.target.run, TargetArgs(inboxes=(to_target,), outboxes=(self.from_target.spec.name,), cfg=cfg,
                                         spec=self.spec, stop=self.stop)),
            start(actors.draft.run, DraftArgs(inboxes=(to_draft,), outboxes=(self.from_draft.spec.name,), cfg=cfg,
                                       spec=self.spec, vocab=vocab, stop=self.stop))]
        for p in self.procs:
            p.start()
        self.to_target = attach_when_ready(to_target.name, self.stop)
        self.to_draft = attach_when_ready(to_draft.name, self.stop)
        self.engine = DeferredEngine(self.spec, policy(cfg, vocab), self.to_target, self.from_target,
                                     self.to_draft, self.from_draft)

    def close(self) -> None:
        try:
            self.engine.close()
        except Exception:                                           # noqa: BLE001 -- stopping anyway
            pass
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive() and hasattr(p, "kill"):
                p.kill()
                p.join()
        for ch in (self.to_target, self.to_draft, self.from_target, self.from_draft):
            ch.__exit__(None, None, None)                           # closes; the owner end also unlinks
        shutil.rmtree(self.run_dir, ignore_errors=True)
        cleanup_stale()


class PipelinedWorker:
    def __init__(self, system, threads: int, window: int, cpus: list[int], profile: str | None = None):
        """The actors on the profile's CPU split when it pins both (configs/pair.toml: the target on cpu0, the draft
        on cpu1), the target's threads at most its CPUs; else both on the bench's `cpus`."""
        self.system = system
        base = load(profile).actors
        split = {"actors.target_cpus": base.target_cpus, "actors.draft_cpus": base.draft_cpus}
        if base.target_cpus and base.draft_cpus:
            threads = min(threads, len(cpu_set(base.target_cpus)))
        else:
            split = dict.fromkeys(split, ",".join(map(str, cpus)))
        self.actors = ModelActors(load(profile, {**settings(system, threads, window), **split}))
        self.engine = self.actors.engine

    def _reply(self):                     # the bench's workers say "ready" once their model is loaded
        return {"exactness": self.engine.exactness}

    def run(self, prompt) -> dict:
        self.engine.reset()                                         # a fresh context and draft, as the serial systems
        res = self.engine.generate(np.asarray(prompt.ids, np.int64), prompt.new_tokens, SamplingParams(),
                                   stop_ids=prompt.stop_ids)
        st = res.stats.as_dict()
        return {"token_ids": res.token_ids, **st, "overhead_share": st["decode_overhead_share"],
                "peak_mb": sum(proc_status(p.pid)["vmhwm_mb"] for p in self.actors.procs)}

    def close(self) -> None:
        self.actors.close()

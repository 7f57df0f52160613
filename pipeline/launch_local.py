"""Local launcher: the actors as processes (multiprocessing, spawn), wired by shared-memory channels.

Owns process lifetimes: start order, SIGINT/SIGTERM (stop, drain, join), the death of an actor (everything stops,
the cause is reported, no orphan process and no leftover segment). Nothing numeric lives here.

Topology at this stage: ingest -> cache owner (hosting target and draft through the serial engine) -> output.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from actors import cache_owner, ingest, output
from pipeline.channel import ChannelSpec, cleanup_stale


class ActorDied(RuntimeError):
    pass


def run_pipeline(cfg, log: str, fmt: str | None = None, max_lines: int = 0, journal: str | None = None,
                 pub: str | None = None, quiet_lines: bool = False, speed: float = 0.0) -> None:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    tag = f"p{os.getpid()}_{int(time.time() * 1000) % 1_000_000}"
    lines = ChannelSpec(f"{tag}_lines", slots=64, payload_bytes=64 << 10, header_bytes=16 << 10)
    events = ChannelSpec(f"{tag}_events", slots=64, payload_bytes=64 << 10, header_bytes=16 << 10)
    source = {"path": log, "format": fmt, "max_lines": max_lines, "speed": speed}
    actors = {   # consumers first: each creates the channel it reads, producers attach
        "output": ctx.Process(target=output.run, args=(events, cfg.model.gguf, journal, pub, quiet_lines,
                                                       cfg.actors.output_cpus, stop), name="ringspec-output"),
        "cache_owner": ctx.Process(target=cache_owner.run, args=(lines, events.name, cfg, stop),
                                   name="ringspec-cache-owner"),
        "ingest": ctx.Process(target=ingest.run, args=(lines.name, source, cfg.model.gguf, cfg.actors.ingest_cpus,
                                                       stop), name="ringspec-ingest"),
    }
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for proc in actors.values():
            proc.start()
        _watch(actors, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop.set()
        deadline = time.monotonic() + 10.0                 # drain: actors see `stop` within a poll interval
        for proc in actors.values():
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for proc in actors.values():
            if proc.is_alive():
                proc.kill()
                proc.join()
        cleanup_stale()


def _watch(actors: dict, stop) -> None:
    """Return when every actor exited normally or a stop was asked (the caller then joins with a deadline and kills
    stragglers); raise ActorDied when one exits otherwise."""
    while any(p.is_alive() for p in actors.values()) and not stop.is_set():
        for name, proc in actors.items():
            code = proc.exitcode
            if code not in (None, 0) and not stop.is_set():
                stop.set()
                cause = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit code {code}"
                raise ActorDied(f"actor {name} (pid {proc.pid}) died: {cause}; the pipeline was stopped")
        time.sleep(0.05)

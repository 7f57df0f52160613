"""Supervision: a run's groups started by the configured launcher and, when an actor dies, started again.

Owns the run from the memory plan's check to its end: every actor of a group is stopped when one dies and the group
is started again from the journal's last durable checkpoints (Erlang/OTP's one_for_all restart strategy: the five
share one sequence state, so none can restart alone), unless the death is a start-up failure or a crash loop
(`[supervise]`, deaths.py); then everything stops, the cause is reported, exit code 2, no orphan process and no
leftover segment. Streams on several nodes run as one group per node, each supervised alone, with one front (the site
actor) when served. Before the first start, the memory plan (pipeline/launch/memory.py) must fit. Nothing numeric here.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from actors.args import RestartReason, SiteLinks
from actors.output import pub_dir
from models.npu import one_owner
from pipeline.launch import memory
from pipeline.channel import cleanup_stale
from pipeline.launch.deaths import STOPPED, ActorDied, Supervisor
from pipeline.launch.local_processes import run_local
from pipeline.launch.plan import Group, StreamRun, actor_plans, groups, source_id
from pipeline.launch.ray_actors import ray_session
from pipeline.launch.signals import Signals
from pipeline.launch.site_actor import Site, site_host
from pipeline.process import StopFlag
from pipeline.stream.journal import files, records, resume_point


def run_pipeline(cfg, streams: list[StreamRun], run_dir: str, pub: str | None = None, quiet_lines: bool = False,
                 resume: bool = False) -> None:
    """Run the actors with the configured launcher until every stream ends (or a signal drains or stops them),
    restarting them from the last durable checkpoints when one dies (see the module's docstring). resume: start
    each stream from its journal's last checkpoint (a whole-service restart; a file source continues after it).
    Streams on several nodes run as one group per node, each supervised alone: a group's death stops and restarts
    that group only; the others go on."""
    run = groups(streams, run_dir)
    if pub:
        pub_dir(pub)                                       # an ipc PUB's directory: private, or refused here
    if cfg.draft.backend == "rknn" and cfg.actors.launcher != "ray":    # one NPU here: each group's draft opens it
        one_owner([group.actor("draft") for group in run], "the local launcher runs every node's group on this "
                  "machine: run the groups on a Ray cluster (--launcher ray), put their streams on one node, or run "
                  "the drafts on the CPU (draft.backend = \"onnx\")")
    if len(run) > 1 and cfg.actors.launcher != "ray":     # every node's group on this machine: their plans together
        memory.check_host(cfg, [group.node for group in run])
    for group in run:                                      # each node's plan fits its board, its cores are right
        memory.check(cfg, group.node if len(run) > 1 else None)
    signals = Signals(run_dir)
    try:
        with ray_session(cfg) if cfg.actors.launcher == "ray" else contextlib.nullcontext(run_local) as launcher:
            if len(run) == 1:
                _supervise(cfg, run[0], pub, quiet_lines, launcher, signals, resume)
            elif pub or cfg.serve.enabled:                 # one front for every node: the site actor, here
                with Site(cfg, run, run_dir, pub, site_host(cfg, launcher), signals) as site:
                    _side_by_side(cfg, run, quiet_lines, launcher, signals, resume, site)
            else:
                _side_by_side(cfg, run, quiet_lines, launcher, signals, resume)
        if signals.forced:
            print("ringspec: stopped at once (a second signal): the journal has no final record; --resume continues "
                  "after its last checkpoint", file=sys.stderr, flush=True)
            raise KeyboardInterrupt
    finally:
        signals.restore()
        cleanup_stale()


def _side_by_side(cfg, run: list[Group], quiet_lines, launcher, signals, resume, site: Site | None = None) -> None:
    """Every node's group supervised in a thread of its own; a group that cannot go on (a start-up failure, a crash
    loop, no node left to place it on) is reported down and the others go on. ActorDied at the end if one was.
    site: the run's one front (served), which every group's output actor relays to."""
    down: list[ActorDied] = []

    def supervise(group: Group) -> None:
        try:
            _supervise(cfg, group, None, quiet_lines, launcher, signals, resume, site and site.links)
        except ActorDied as died:
            down.append(died)
            print(f"ringspec: streams {group.names} (node {group.node or '(any)'}) are down: {died}; the other nodes' "
                  f"streams go on", file=sys.stderr, flush=True)
        except BaseException as exc:                     # noqa: BLE001 -- reported as the group's, never swallowed
            down.append(ActorDied(f"{type(exc).__name__}: {exc}", group.actor("target")))
            print(f"ringspec: streams {group.names} (node {group.node or '(any)'}) are down: {type(exc).__name__}: "
                  f"{exc}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=supervise, args=(g,), name=f"group-{g.node}", daemon=True) for g in run]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.2)                      # the main thread stays free for the operator's signals
    if down:
        raise ActorDied("; ".join(str(d) for d in down), down[0].actor, down[0].died_at)


def _supervise(cfg, group: Group, pub, quiet_lines, launcher, signals, resume: bool,
               site: SiteLinks | None = None) -> None:
    """Start a group's pipeline; when an actor dies, start it again from the last durable checkpoints (one_for_all),
    until the streams end, the operator drains them, or the death is a start-up failure or a crash loop
    (ActorDied)."""
    streams = group.streams
    points = [resume_point(st.journal, source_id(st.source)) for st in streams] if resume else None
    restart = RestartReason("", "resume", None, {}) if resume else None
    supervisor = Supervisor(cfg.supervise)
    while True:
        tag = f"p{os.getpid()}_{int(time.time() * 1000) % 1_000_000}{'_' + group.node if group.node else ''}"
        started_at = [_end_of(st.journal) for st in streams]
        plans = actor_plans(cfg, group, pub, quiet_lines, tag, points, restart, site)
        try:
            return launcher(plans, group, cfg, signals)
        except ActorDied as died:
            if signals.drain_since is not None:
                raise                                # an operator's drain or stop is not undone by a restart
            if restart is None and not all(map(_started, (st.journal for st in streams), started_at)):
                raise ActorDied(f"{died.args[0].removesuffix(STOPPED)} while the pipeline was starting (not "
                                f"restarted: a start-up failure){STOPPED}", died.actor) from None
            restart = supervisor.restart(died, [st.source for st in streams])
            points = [resume_point(st.journal, source_id(st.source)) for st in streams]
            where = "; ".join(f"{st.name + ' ' if st.name else ''}"
                              f"{'offset ' + str(p.offset) if p else 'the start'}" for st, p in zip(streams, points))
            down = f"streams {group.names} (node {group.node or '(any)'}) are down: " if group.one_of_several else ""
            print(f"ringspec: {down}{died.args[0].removesuffix(STOPPED)}; restarting "
                  f"{'them' if down else 'the pipeline'} from {where} (restart {restart.restarts[died.actor]} of "
                  f"{died.actor})", file=sys.stderr, flush=True)
            StopFlag(f"{group.dir}/stop").clear()
            cleanup_stale()


def _end_of(journal: str) -> tuple[int, int] | None:
    """(inode, size) of the journal as a start begins; None when there is none yet."""
    try:
        st = os.stat(journal)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size


def _started(journal: str, at: tuple[int, int] | None) -> bool:
    """The pipeline started since the journal was `at` (`_end_of`): a `start` record (the target was up) was written
    after it, in the file that was the journal then (from its old end) or in any file rotated in since. The journal
    rotates on size alone, so a rotation proves nothing: answers the archive gives alone can fill it before the
    start, and a rotated-in file begins with the last checkpoint carried over, an earlier run's maybe."""
    for each in reversed(files(journal)):            # newest first, down to the file that was the journal at `at`
        try:
            st = os.stat(each)
        except FileNotFoundError:
            continue
        then = at is not None and st.st_ino == at[0]
        if any(rec.get("kind") == "start" for rec in records(each, at[1] if then else 0)):
            return True
        if then:
            return False
    return False

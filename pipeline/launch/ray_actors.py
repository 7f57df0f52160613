"""The Ray launcher: each actor of a start as a named Ray actor, a group's actors in one STRICT_PACK placement group of
fractional CPUs on one node (the node labelled `ringspec-node=NODE` while one is alive, else any with room).

Owns the Ray session of a run (joined or started, `ray_session`) and one start's placement group and Ray actors:
placed, started, watched until they end, the group's stop or the operator's drain runs over, then killed and the
placement group removed. A death is ActorDied, named as Ray reported it; the supervisor decides what follows
(supervise.py). Never decides what an actor runs with (plan.py); Ray is imported only inside `ray_session`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import signal
import sys
import time

from actors.args import OutputArgs
from models.registry import home
from pipeline.config import ROOT
from pipeline.launch.deaths import DEATH_GRACE_S, STOP_GRACE_S, STOPPED, ActorDied
from pipeline.launch.plan import ActorPlan, Group, write_pids
from pipeline.launch.signals import Signals
from pipeline.process import enter

PLACE_S = 120.0       # a Ray placement group not placed after this: no node has room (the group is down)
NODE_LABEL = "ringspec-node"          # `ray start --labels ringspec-node=NAME`: where [[streams]] node = NAME runs


class RayActor:
    """The Ray face of an actor: the same `run(args)`, in a Ray worker process."""

    def __init__(self):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # until the actor installs its figures handler

    def pid(self) -> tuple[int, str]:
        return os.getpid(), host_id()

    def run(self, run, args, console_pid: int, console_host: str) -> None:
        """console_pid: the launcher, whose stdout and stderr this actor writes to when it shares its host (the
        operator reads the output actor's lines as they are, not through Ray's prefixed log forwarding)."""
        for fd in (1, 2) if console_host == host_id() else ():
            try:
                target = os.open(f"/proc/{console_pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
            except OSError:
                continue                                 # the launcher is gone: Ray forwards this worker's log
            sys.stdout.flush() if fd == 1 else sys.stderr.flush()
            os.dup2(target, fd)
            os.close(target)
        enter(run, args)


def host_id() -> str:
    """This kernel's boot id: a pid means the same process only where it is the same (Ray nodes may share a host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _live_label(ray, node: str) -> bool:
    return any(n.get("Alive") and (n.get("Labels") or {}).get(NODE_LABEL) == node for n in ray.nodes())


def _place(ray, placement_group, remove_placement_group, group: Group, bundles: int, share: float):
    """A placement group holding the group's actors on one node: the node labelled `ringspec-node=NODE` while one is
    alive; when none is (it died, before or while this waits), any node with room, so the group resumes there.
    ActorDied when no node has room within PLACE_S."""
    deadline, labelled = time.monotonic() + PLACE_S, bool(group.node) and _live_label(ray, group.node)
    while True:
        pg = placement_group([{"CPU": share}] * bundles, strategy="STRICT_PACK",
                             bundle_label_selector=[{NODE_LABEL: group.node}] * bundles if labelled else None)
        ready = pg.ready()
        while time.monotonic() < deadline:
            if ray.wait([ready], timeout=1.0)[0]:
                return pg
            if labelled and not _live_label(ray, group.node):
                break
        remove_placement_group(pg)
        if not labelled or time.monotonic() >= deadline:
            raise ActorDied(f"no Ray node had room for streams {group.names or '(one)'} ({bundles} actors, "
                            f"{share * bundles:.0f} CPU{', node ' + group.node if labelled else ''}) within "
                            f"{PLACE_S:.0f} s{STOPPED}", group.actor("target"))
        labelled = False
        print(f"ringspec: no live Ray node is labelled {NODE_LABEL}={group.node}: streams {group.names} start on any "
              f"node that has room", file=sys.stderr, flush=True)


def _landed(ray, pg, plans: list[ActorPlan]) -> list[ActorPlan]:
    """The plans, the output actor's site links told the node the group landed on (its `ringspec-node` label; the
    configured node's until it died, then whichever had room): the site labels the group's streams with it."""
    node_id = next(iter(ray.util.placement_group_table(pg)["bundles_to_node_id"].values()), None)
    label = next(((n.get("Labels") or {}).get(NODE_LABEL, "") for n in ray.nodes() if n.get("NodeID") == node_id), "")
    return [dataclasses.replace(p, args=dataclasses.replace(p.args, site=dataclasses.replace(p.args.site, node=label)))
            if isinstance(p.args, OutputArgs) and p.args.site else p for p in plans]


def _ray_token() -> bool:
    """A Ray auth token this process would present (Ray's own lookup order: variable, file variable, default)."""
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.exists(os.path.expanduser("~/.ray/auth_token")))


@contextlib.contextmanager
def ray_session(cfg):
    """Ray for the whole run, restarts included: join the configured cluster (left running) or start a local
    instance (stopped at the end). Yields `_ray` bound to it, its `host` this node's address."""
    address = cfg.actors.ray_address or None
    if address not in (None, "auto") and "RAY_AUTH_MODE" not in os.environ and _ray_token():
        # Ray 2.60 starts clusters with token auth by default; ray.init presents the token when it joins "auto"
        # but not an explicit HOST:PORT, whose GCS then refuses it ("InvalidAuthToken"). Read at import: set first.
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    started = not ray.is_initialized()
    if started:
        # "local": always a new instance (None would join whatever /tmp/ray/ray_current_cluster names, live or not)
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=True, namespace="ringspec",
                 num_cpus=None if address else os.cpu_count(), configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RINGSPEC_HOME": str(home())}})
    try:
        launch = functools.partial(_ray, ray, placement_group, remove_placement_group, PlacementGroupSchedulingStrategy)
        launch.host = ray.util.get_node_ip_address()      # where this node is reached (a site's links: `Site`)
        yield launch
    finally:
        if started:
            ray.shutdown()


_starts = itertools.count()           # a restarted pipeline's Ray actors get new names


def _ray(ray, placement_group, remove_placement_group, PlacementGroupSchedulingStrategy,  # noqa: N803 -- Ray's
         plans: list[ActorPlan], group: Group, cfg, signals: Signals) -> None:
    start = next(_starts)
    share = 1.0 / len(plans)                          # one node, fractional CPUs: the five fit on one core's worth
    pg = _place(ray, placement_group, remove_placement_group, group, len(plans), share)
    plans = _landed(ray, pg, plans)
    handles, refs, pids, died = {}, {}, {}, False
    signals.pids[group.dir] = lambda: list(pids.values())
    stop = group.stop
    try:
        remote = ray.remote(RayActor)
        for i, p in enumerate(plans):
            handles[p.name] = remote.options(
                name=f"ringspec-{p.name}-{os.path.basename(group.run_dir)}-{start}", num_cpus=share, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
        here = host_id()
        for name, h in handles.items():               # a pid on another host is not ours to signal or measure
            pid, host = ray.get(h.pid.remote(), timeout=120)
            if host == here:
                pids[name] = pid
        write_pids(group.dir, pids)
        refs = {handles[p.name].run.remote(p.run, p.args, os.getpid(), here): p.name for p in plans}
        todo = list(refs)
        while todo and not stop.is_set():
            done, todo = ray.wait(todo, num_returns=1, timeout=0.1)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as exc:                # noqa: BLE001 -- the actor's death, reported as ours
                    stop.set()
                    died = True
                    name = refs[ref]
                    # Ray hands back no exit code or signal: name what it reported, never a guessed cause
                    where = f"pid {pids[name]}" if name in pids else "on another host"
                    raise ActorDied(f"actor {name} ({where}) died: {type(exc).__name__}{STOPPED}", name) from None
            if signals.overdue():
                stop.set()
    finally:
        stop.set()
        if refs:
            ray.wait(list(refs), num_returns=len(refs), timeout=DEATH_GRACE_S if died else STOP_GRACE_S)
        for h in handles.values():
            ray.kill(h, no_restart=True)
        remove_placement_group(pg)

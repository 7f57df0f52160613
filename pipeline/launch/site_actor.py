"""The site actor's lifetime: the one front of a served run whose streams are on several nodes (actors/site.py).

Owns that one process: a local process of the launcher's own, on its host, started before the groups (their output
actors connect to its links: `links`), watched, and started again on the same endpoints when it dies; its deaths count
as an actor's do, and a crash loop stops the run. Never touches the groups' pipelines (supervise.py runs them).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import sys
import threading
import time

import actors.site
from actors.args import SiteArgs, SiteLinks, SiteStream
from pipeline.launch.deaths import STOP_GRACE_S, STOPPED, ActorDied, Supervisor, cause
from pipeline.launch.local_processes import processes, start_all
from pipeline.launch.plan import ActorPlan, Group, pids_file
from pipeline.launch.signals import Signals
from pipeline.process import StopFlag

SITE_START_S = 300.0  # the site actor has bound its links by then (it loads the tokenizer first), or it is down


class Site:
    """The site actor: started on entering, stopped on leaving (ActorDied then if it died in a crash loop). Its pid
    is listed in the run directory's pids file."""

    def __init__(self, cfg, run: list[Group], run_dir: str, pub: str | None, host: str, signals: Signals):
        # the key MACs every message on the links and their CURVE keys derive from it (pipeline/serve/site_link.py); it
        # reaches both ends as an actor argument and serves every start of the site: the starts are told apart by
        # `restarts` (handed to each start in _start), which the links carry so no earlier start's message is taken
        self.links = SiteLinks(f"tcp://{host}:0", f"tcp://{host}:0", secrets.token_bytes(32))
        self.file, self.run_dir, self.signals = f"{run_dir}/site.json", run_dir, signals
        self.stop = StopFlag(f"{run_dir}/site_stop", f"{run_dir}/stop")
        self.args = SiteArgs(cfg=cfg, streams=tuple(SiteStream(st.name, g.id, g.node, st.archive)
                                                    for g in run for st in g.streams),
                             links=self.links, endpoints_file=self.file, pub=pub,
                             pids_files=(pids_file(run_dir), *(pids_file(g.dir) for g in run)), stop=self.stop)
        self.supervisor, self.error, self.proc = Supervisor(cfg.supervise), None, None

    def __enter__(self) -> Site:
        self._start()
        self._watcher = threading.Thread(target=self._watch, name="site", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self._watcher.join(timeout=STOP_GRACE_S)
        self._end()
        if self.error is not None and exc[0] is None:
            raise self.error

    def _start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.file)
        args = dataclasses.replace(self.args, links=self.links, restarts=self.supervisor.restarts.get("site", 0))
        proc = self.proc = processes([ActorPlan("site", actors.site.run, args)])["site"]
        start_all([proc])
        self.signals.pids[self.run_dir] = lambda: [proc.pid] if proc.is_alive() else []
        with open(pids_file(self.run_dir), "w") as f:
            json.dump({"site": proc.pid}, f)
        deadline = time.monotonic() + SITE_START_S
        while not os.path.exists(self.file):
            if proc.exitcode is not None or time.monotonic() > deadline:
                self._end()
                why = cause("site", proc.pid, proc.exitcode) if proc.exitcode is not None else \
                    f"actor site (pid {proc.pid}) bound no links within {SITE_START_S:.0f} s"
                raise ActorDied(f"{why.removesuffix(STOPPED)} while starting: nothing was started", "site")
            time.sleep(0.05)
        with open(self.file) as f:
            bound = json.load(f)                          # a restart binds the same ports: the links reconnect
        self.links = dataclasses.replace(self.links, events=bound["events"], asks=bound["asks"])

    def _watch(self) -> None:
        while not self.stop.is_set():
            time.sleep(0.1)
            if self.proc.exitcode is None or self.stop.is_set():
                continue
            died = ActorDied(cause("site", self.proc.pid, self.proc.exitcode), "site")
            try:
                restart = self.supervisor.restart(died, [])
                print(f"ringspec: {died.args[0].removesuffix(STOPPED)}; the site's front starts again (restart "
                      f"{restart.restarts['site']}); questions in flight were lost", file=sys.stderr, flush=True)
                self._start()
            except ActorDied as down:
                self.error = down
                print(f"ringspec: error: {down}; every node's streams stop", file=sys.stderr, flush=True)
                StopFlag(f"{self.run_dir}/stop").set()
                return

    def _end(self) -> None:
        self.stop.set()
        self.proc.join(timeout=STOP_GRACE_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def site_host(cfg, launcher) -> str:
    """Where the groups' output actors reach the site: serve.site, else this Ray node's address (the Ray session's
    launcher carries it: `ray_session`), else loopback."""
    return cfg.serve.site or getattr(launcher, "host", "127.0.0.1")

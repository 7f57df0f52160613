"""Launchers: the five actors as local processes (multiprocessing, spawn) or as named Ray actors, one topology.

Owns which actors a run starts with what (the channels' geometry is pipeline/topology.py's) and process lifetimes:
start, the operator's signals (SIGINT/SIGTERM, to the launcher or to its whole process group, drain the pipeline:
the source stops, what was read is processed, the journal gets its final record; a second signal or a stuck drain
stops everything; SIGUSR1 makes every actor print its figures; the actors themselves ignore SIGINT and SIGTERM, so a
terminal's Ctrl-C reaches them only through the launcher), and supervision: when an actor dies, every actor of the
pipeline is stopped and the pipeline is started again from the journal's last durable checkpoint (Erlang/OTP's
one_for_all restart strategy: the five share one sequence state, so none can restart alone), unless the death is a
start-up failure or a crash loop (`[supervise]`); then everything stops, the cause is reported, exit code 2, no
orphan process and no leftover segment. Before the first start, the memory plan (pipeline/budget.py) must fit.
Nothing numeric here.

    ingest --lines--> cache owner --events--> output
                       |  ^   |  ^
            to_target  |  |   |  | from_draft
                       v  |   v  |
                     target   draft
                    from_target  to_draft

Each channel is created by its consumer; producers attach when it appears (models take seconds to load).
`run_replay` and `run_serve` are the `replay` and `serve` verbs: a log through the configured launcher (or, for
`replay`, the serial engine in this process).
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib
import itertools
import json
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

from models.convert import load_card
from models.npu import one_owner
from models.registry import converted_dir, home, resolve_gguf
from pipeline import budget
from pipeline.channel import cleanup_stale
from pipeline.config import replay_log, streams_of, with_logs
from pipeline.decode.drafts import speaks
from pipeline.process import CHAOS_DIR, StopFlag, Stopped, run_each
from pipeline.report import Report
from pipeline.serve.auth import load_keys
from pipeline.stream.frame import replay_frame
from pipeline.stream.replay import ReplayReport, printer, replay
from pipeline.stream.journal import records, resume_point
from pipeline.stream.sources import source_of
from pipeline.topology import actor_name, channels, per_stream_file

DRAIN_S = 60.0        # a drain that takes longer than this is cut short
STOP_GRACE_S = 10.0   # actors told to stop that still run after this are killed
PLACE_S = 120.0       # a Ray placement group not placed after this: no node has room (the group is down)
DEATH_GRACE_S = 0.5   # ... after an actor died: what they hold is recovered from the checkpoint, not from them


class ActorDied(RuntimeError):
    def __init__(self, message: str, actor: str = "", died_at: float | None = None):
        super().__init__(message)
        self.actor, self.died_at = actor, died_at if died_at is not None else time.time()


@dataclass
class ActorPlan:
    name: str
    module: str           # actors.<name>: its run(**kwargs) is the actor
    kwargs: dict          # {"each": [kwargs, ...]}: one run per stream, threads of one process (process.py run_each)


@dataclass(frozen=True)
class StreamRun:
    """One stream of a run (one stream: name "")."""
    name: str
    cfg: object           # the profile with this stream's [replay] (pipeline/config.py streams_of)
    source: dict          # what its ingest reads (pipeline/stream/sources.py source_of)
    journal: str          # its journal: checkpoints, assessments, restarts (one file per stream)
    archive: str          # its archive of every line, when serving (one file per stream)
    node: str = ""        # the Ray node label it runs on ([[streams]] node): its group


@dataclass(frozen=True)
class Group:
    """The streams of one node (`[[streams]] node`): one target, one draft and one output for them, a pipeline of its
    own that is placed, stopped and restarted alone. Its directory (under the run's) holds its stop flag and pids."""
    node: str
    streams: tuple[StreamRun, ...]
    dir: str
    run_dir: str

    @property
    def stop(self) -> StopFlag:
        """Set for this group alone (an actor of it died), or by the run's (the operator's second signal)."""
        return StopFlag(f"{self.dir}/stop", f"{self.run_dir}/stop")

    def actor(self, role: str) -> str:
        """The group's actors (one of each role for all its streams): `target@NODE` when the run has several
        groups, else `target`."""
        return actor_name(role, node=self.node) if self.one_of_several else role

    @property
    def id(self) -> str:
        """Its name on a site's links: its directory's (`group0`, ...)."""
        return os.path.basename(self.dir)

    @property
    def one_of_several(self) -> bool:
        return self.dir != self.run_dir

    @property
    def names(self) -> str:
        return ", ".join(st.name for st in self.streams)


def groups(streams: list[StreamRun], run_dir: str) -> list[Group]:
    """The run's streams by node, in the order the profile names them; one group keeps the run's directory."""
    nodes = list(dict.fromkeys(st.node for st in streams))
    if len(nodes) == 1:
        return [Group(nodes[0], tuple(streams), run_dir, run_dir)]
    out = []
    for i, node in enumerate(nodes):
        os.makedirs(f"{run_dir}/group{i}", exist_ok=True)
        out.append(Group(node, tuple(st for st in streams if st.node == node), f"{run_dir}/group{i}", run_dir))
    return out


def stream_runs(cfg, fmt: str | None, speed: float, follow: bool, journal: str | None, run_dir: str,
                rate: float = 0.0, loop: bool = False) -> list[StreamRun]:
    """The run's streams from the profile (`[[streams]]`, or [replay]'s one) and the command line's flags. Several
    streams keep one journal and one archive each: `--journal F.jsonl` becomes F.NAME.jsonl."""
    runs = []
    nodes = [st.node for st in cfg.streams] or [""]
    for (name, scfg), node in zip(streams_of(cfg), nodes):
        src = source_of(replay_log(scfg), fmt or scfg.replay.format or None, scfg.replay.max_lines, speed, follow)
        if loop:
            if src["kind"] != "replay":
                raise ValueError("--loop replays a file; it cannot loop a socket, stdin or --follow")
            src["kind"] = "loop"
        if rate:
            src["rate"] = rate
        where = journal or f"{run_dir}/journal.jsonl"      # checkpoints need one; without --journal it is the run's
        archive = cfg.serve.archive or str(home() / "archive" / "stream.sqlite")
        runs.append(StreamRun(name, scfg, src, per_stream_file(where, name), per_stream_file(archive, name), node))
    return runs


def plan(cfg, group: Group, pub: str | None, quiet_lines: bool, tag: str, resume: list | None = None,
         restart: dict | None = None, site: dict | None = None) -> list[ActorPlan]:
    """The actors and their channels, sized once here from the config and the model's card: one output, one target and
    one draft for the group, an ingest and a cache owner per stream (several streams: each role's are threads of one
    process, `run_each`). resume: per stream, the last durable checkpoint to start from (ingest re-reads a file from
    its window; the owner restores its counts); restart: why this start is a restart (journaled by each owner with
    its first committed line); site: the site's links, when the front is the site actor's (`Site.links`): the output
    actor relays to it."""

    card = load_card(converted_dir(resolve_gguf(cfg.model.gguf)))      # converts on first use, with progress
    vocab = card["config"]["vocab_size"]
    if cfg.draft.uses_model:
        draft_vocab = speaks(load_card(converted_dir(resolve_gguf(cfg.draft.model))))
        if draft_vocab != vocab:
            raise ValueError(f"draft vocabulary {draft_vocab} != target vocabulary {vocab}: a draft must share the "
                             f"target's tokenizer")
    spec = replay_frame(cfg).spec
    streams, stop, drain = group.streams, group.stop, f"{group.run_dir}/drain"
    resume = resume or [None] * len(streams)
    links = [channels(st.cfg, spec, vocab, f"{tag}_{n}" if st.name else tag) for n, st in enumerate(streams)]
    output_serve = {}
    if site:                              # the front is the site's: output relays (pipeline/serve/site.py)
        output_serve = dict(site={**site, "asks_channels": [ln["asks"].name for ln in links if "asks" in ln],
                                  "start": tag, "restarts": (restart or {}).get("restarts", {})})
        pub = None
    elif cfg.serve.enabled:               # operators' questions: the front (in output) -> each stream's owner
        output_serve = dict(cfg=cfg, serve={"asks": [ln["asks"].name for ln in links],
                                            "archive": [st.archive for st in streams],
                                            "pids_file": pids_file(group.dir),
                                            "restarts": (restart or {}).get("restarts", {})})
    plans = [
        ActorPlan(group.actor("output"), "actors.output", dict(in_specs=[ln["events"] for ln in links],
                                                  streams=[st.name for st in streams],
                                                  journals=[st.journal for st in streams], gguf=cfg.model.gguf,
                                                  pub=pub, quiet_lines=quiet_lines, cpus=cfg.actors.output_cpus,
                                                  stop=stop, **output_serve)),
        ActorPlan(group.actor("target"), "actors.target", dict(inboxes=[ln["to_target"] for ln in links],
                                                  outboxes=[ln["from_target"].name for ln in links],
                                                  cfg=cfg, spec=spec, stop=stop)),
        ActorPlan(group.actor("draft"), "actors.draft", dict(inboxes=[ln["to_draft"] for ln in links],
                                                outboxes=[ln["from_draft"].name for ln in links],
                                                cfg=cfg, spec=spec, vocab=vocab, stop=stop))]
    owners, ingests = [], []
    for st, ln, point in zip(streams, links, resume):
        source, owner_serve = st.source, {}
        if cfg.serve.enabled:
            source = {**source, "archive": {"path": st.archive, "max_lines": cfg.serve.archive_max_lines}}
            owner_serve = dict(questions=ln["asks"], drain=StopFlag(drain))
        owners.append(dict(inbox=ln["lines"], outbox=ln["events"].name, cfg=st.cfg, spec=spec, stop=stop,
                           source_id=source_id(source), resume=point, restart=restart,
                           model_links={"from_target": ln["from_target"], "from_draft": ln["from_draft"],
                                        "to_target": ln["to_target"].name, "to_draft": ln["to_draft"].name},
                           **owner_serve))
        ingests.append(dict(out_name=ln["lines"].name, source={**source, "resume": point}, gguf=cfg.model.gguf,
                            cpus=cfg.actors.ingest_cpus, stop=stop, drain=StopFlag(drain)))
    one = len(streams) == 1                  # several: a thread per stream in one process per role
    return plans + [ActorPlan(group.actor(role), f"actors.{role}", each[0] if one else dict(each=each))
                    for role, each in (("cache_owner", owners), ("ingest", ingests))]


def source_id(source: dict) -> str:
    """What a checkpoint names as its source: a file's absolute path, tcp://HOST:PORT, or "-" (stdin)."""
    if source["kind"] == "tcp":
        return f"tcp://{source.get('host', '127.0.0.1')}:{source.get('port', 0)}"
    return "-" if source["kind"] == "stdin" else source["path"]


def pids_file(run_dir: str) -> str:
    """Where the launcher lists the actors' pids ({name: pid}) once they run: the front's memory gauges read it."""
    return f"{run_dir}/pids.json"


def _write_pids(run_dir: str, pids: dict) -> None:
    for where in [run_dir] + ([CHAOS_DIR] if CHAOS_DIR else []):       # chaos: the fault injector reads them too
        with open(pids_file(where) + ".tmp", "w") as f:
            json.dump(pids, f)
        os.replace(pids_file(where) + ".tmp", pids_file(where))


def enter(module: str, kwargs: dict, parent: int | None = None) -> None:
    """An actor's entry point, in its own process: run it; a failure is one line on stderr and exit code 1.
    The process is named rs:<actor> (what `top` and `ps -o comm` show). With `parent` (the local launcher's pid) the
    actor dies with it: a launcher killed outright (SIGKILL, OOM) leaves no actor spinning on (PR_SET_PDEATHSIG)."""
    _name_process(f"rs:{module.split('.')[-1]}")
    _one_malloc_arena()
    if parent is not None:
        _die_with(parent)
    for sig in (signal.SIGINT, signal.SIGTERM):         # a terminal's Ctrl-C reaches the whole process group: the
        signal.signal(sig, signal.SIG_IGN)              # launcher drains the pipeline, the actors go on until told
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)       # until the actor installs its figures handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    try:
        actor = importlib.import_module(module).run
        if "each" in kwargs:                           # several streams' actors of one role: a thread each
            run_each(actor, kwargs["each"])
        else:
            actor(**kwargs)
    except Stopped:
        pass                                           # stopped before its peers were up: a clean exit
    except Exception as exc:                           # noqa: BLE001 -- reported, then the launcher stops the rest
        if os.environ.get("RINGSPEC_TRACEBACK"):
            traceback.print_exc()
        print(f"ringspec: error: actor {module.split('.')[-1]}: {type(exc).__name__}: {exc}"
              f"{'' if os.environ.get('RINGSPEC_TRACEBACK') else ' (RINGSPEC_TRACEBACK=1 prints where)'}",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _one_malloc_arena() -> None:
    """Every thread of this process allocates from glibc's main arena. By default a thread that finds the arena's
    lock taken gets an arena of its own (up to 8 per core) whose pages stay resident: an actor's memory then steps up
    whenever load makes more of its threads (the HTTP handlers, zmq's) allocate at once (4-7 arenas per actor seen in
    a short serving run; the likely cause of the output actor's 260 KiB step in the first million-token serving soak:
    docs/stream-quality.md). The GIL already serialises nearly all of an
    actor's allocations. Takes effect only before the process's second thread first allocates (a Ray worker has
    started its own by then); a C library without mallopt is left as it is."""
    try:
        ctypes.CDLL(None).mallopt(-8, 1)                            # M_ARENA_MAX = 1
    except (OSError, AttributeError):
        pass


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent exits; exit now if the parent is already gone."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)           # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:                                      # died before the request took effect
        os._exit(1)


def _name_process(name: str) -> None:
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)      # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def run_pipeline(cfg, streams: list[StreamRun], run_dir: str, pub: str | None = None, quiet_lines: bool = False,
                 resume: bool = False) -> None:
    """Run the actors with the configured launcher until every stream ends (or a signal drains or stops them),
    restarting them from the last durable checkpoints when one dies (see the module's docstring). resume: start
    each stream from its journal's last checkpoint (a whole-service restart; a file source continues after it).
    Streams on several nodes run as one group per node, each supervised alone: a group's death stops and restarts
    that group only; the others go on."""
    run = groups(streams, run_dir)
    if cfg.draft.backend == "rknn" and cfg.actors.launcher != "ray":    # one NPU here: each group's draft opens it
        one_owner([group.actor("draft") for group in run], "the local launcher runs every node's group on this "
                  "machine: run the groups on a Ray cluster (--launcher ray), put their streams on one node, or run "
                  "the drafts on the CPU (draft.backend = \"onnx\")")
    if len(run) > 1 and cfg.actors.launcher != "ray":     # every node's group on this machine: their plans together
        budget.check_host(cfg, [group.node for group in run])
    for group in run:                                      # each node's plan fits its board, its cores are right
        budget.check(cfg, group.node if len(run) > 1 else None)
    signals = _Signals(run_dir)
    try:
        with _ray_session(cfg) if cfg.actors.launcher == "ray" else contextlib.nullcontext(_local) as launcher:
            if len(run) == 1:
                _supervise(cfg, run[0], pub, quiet_lines, launcher, signals, resume)
            elif pub or cfg.serve.enabled:                 # one front for every node: the site actor, here
                with Site(cfg, run, run_dir, pub, _site_host(cfg, launcher), signals) as site:
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
            _supervise(cfg, group, None, quiet_lines, launcher, signals, resume, site and site.links(group))
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


SITE_START_S = 300.0  # the site actor has bound its links by then (it loads the tokenizer first), or it is down


class Site:
    """The site actor (actors/site.py): the one front of a served run whose streams are on several nodes. A process
    of the launcher's own, on its host, started before the groups (their output actors connect to it: `links`) and
    started again on the same endpoints when it dies; its deaths count as an actor's do, and a crash loop stops the
    run (ActorDied on leaving). Its pid is listed in the run directory's pids file."""

    def __init__(self, cfg, run: list[Group], run_dir: str, pub: str | None, host: str, signals: _Signals):
        # MACs every message on the links (pipeline/serve/site.py); it reaches both ends as an actor argument only
        self.key = secrets.token_bytes(32)
        self.file, self.run_dir, self.signals = f"{run_dir}/site.json", run_dir, signals
        self.bind = {"events": f"tcp://{host}:0", "asks": f"tcp://{host}:0"}
        self.stop = StopFlag(f"{run_dir}/site_stop", f"{run_dir}/stop")
        self.kwargs = dict(cfg=cfg, key=self.key, endpoints_file=self.file, pub=pub, stop=self.stop,
                           streams=[{"name": st.name, "group": g.id, "node": g.node,
                                     "archive": st.archive} for g in run for st in g.streams],
                           pids_files=[pids_file(run_dir)] + [pids_file(g.dir) for g in run])
        self.supervisor, self.error, self.proc = Supervisor(cfg.supervise), None, None

    def links(self, group: Group) -> dict:
        """What the group's output actor connects with."""
        return {**self.bind, "key": self.key, "group": group.id}

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
        proc = self.proc = _processes([ActorPlan("site", "actors.site", {
            **self.kwargs, "bind": self.bind, "restarts": self.supervisor.restarts.get("site", 0)})])["site"]
        _start_all([proc])
        self.signals.pids[self.run_dir] = lambda: [proc.pid] if proc.is_alive() else []
        with open(pids_file(self.run_dir), "w") as f:
            json.dump({"site": proc.pid}, f)
        deadline = time.monotonic() + SITE_START_S
        while not os.path.exists(self.file):
            if proc.exitcode is not None or time.monotonic() > deadline:
                self._end()
                why = _cause("site", proc.pid, proc.exitcode) if proc.exitcode is not None else \
                    f"actor site (pid {proc.pid}) bound no links within {SITE_START_S:.0f} s"
                raise ActorDied(f"{why.removesuffix('; the pipeline was stopped')} while starting: nothing was "
                                f"started", "site")
            time.sleep(0.05)
        with open(self.file) as f:
            self.bind = json.load(f)                      # a restart binds the same ports: the links reconnect

    def _watch(self) -> None:
        while not self.stop.is_set():
            time.sleep(0.1)
            if self.proc.exitcode is None or self.stop.is_set():
                continue
            died = ActorDied(_cause("site", self.proc.pid, self.proc.exitcode), "site")
            try:
                restart = self.supervisor.restart(died, [])
                print(f"ringspec: {died.args[0].removesuffix('; the pipeline was stopped')}; the site's front "
                      f"starts again (restart {restart['restarts']['site']}); questions in flight were lost",
                      file=sys.stderr, flush=True)
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


def _site_host(cfg, launcher) -> str:
    """Where the groups' output actors reach the site: serve.site, else this Ray node's address (the Ray session's
    launcher carries it: `_ray_session`), else loopback."""
    return cfg.serve.site or getattr(launcher, "host", "127.0.0.1")


def _supervise(cfg, group: Group, pub, quiet_lines, launcher, signals, resume: bool, site: dict | None = None) -> None:
    """Start a group's pipeline; when an actor dies, start it again from the last durable checkpoints (one_for_all),
    until the streams end, the operator drains them, or the death is a start-up failure or a crash loop
    (ActorDied)."""
    streams = group.streams
    points = [resume_point(st.journal, source_id(st.source)) for st in streams] if resume else None
    restart = {"actor": "", "cause": "resume", "died_at": None, "restarts": {}} if resume else None
    supervisor = Supervisor(cfg.supervise)
    while True:
        tag = f"p{os.getpid()}_{int(time.time() * 1000) % 1_000_000}{'_' + group.node if group.node else ''}"
        started_at = [os.path.getsize(st.journal) if os.path.exists(st.journal) else 0 for st in streams]
        plans = plan(cfg, group, pub, quiet_lines, tag, points, restart, site)
        try:
            return launcher(plans, group, cfg, signals)
        except ActorDied as died:
            if signals.drain_since is not None:
                raise                                # an operator's drain or stop is not undone by a restart
            if restart is None and not all(map(_started, (st.journal for st in streams), started_at)):
                cause = died.args[0].removesuffix("; the pipeline was stopped")
                raise ActorDied(f"{cause} while the pipeline was starting (not restarted: a start-up failure); the "
                                f"pipeline was stopped", died.actor) from None
            restart = supervisor.restart(died, [st.source for st in streams])
            points = [resume_point(st.journal, source_id(st.source)) for st in streams]
            where = "; ".join(f"{st.name + ' ' if st.name else ''}"
                              f"{'offset ' + str(p['offset']) if p else 'the start'}" for st, p in zip(streams, points))
            down = f"streams {group.names} (node {group.node or '(any)'}) are down: " if group.one_of_several else ""
            print(f"ringspec: {down}{died.args[0].removesuffix('; the pipeline was stopped')}; restarting "
                  f"{'them' if down else 'the pipeline'} from {where} (restart {restart['restarts'][died.actor]} of "
                  f"{died.actor})", file=sys.stderr, flush=True)
            StopFlag(f"{group.dir}/stop").clear()
            cleanup_stale()


def _started(journal: str, since: int) -> bool:
    """The pipeline started since byte `since` of the journal: its `start` record is there (the target was up)."""
    return any(rec.get("kind") == "start" for rec in records(journal, since)) if os.path.exists(journal) else False


class Supervisor:
    """Counts deaths per actor; a restart is allowed unless one actor died more than `max_restarts` times within
    `period_s` (a crash loop: ActorDied, which stops the pipeline with exit 2)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.deaths: dict[str, list[float]] = {}
        self.restarts: dict[str, int] = {}

    def restart(self, died: ActorDied, sources: list[dict]) -> dict:
        """What the next start journals, or ActorDied when this death makes a crash loop."""
        now = time.monotonic()
        recent = [t for t in self.deaths.get(died.actor, []) if now - t <= self.cfg.period_s] + [now]
        self.deaths[died.actor] = recent
        if len(recent) > self.cfg.max_restarts:
            why = (f"{died}" if self.cfg.max_restarts == 0 else
                   f"{died.args[0].removesuffix('; the pipeline was stopped')}: {len(recent)} deaths of {died.actor} "
                   f"within {self.cfg.period_s:.0f} s (supervise.max_restarts = {self.cfg.max_restarts}), a crash "
                   f"loop; the pipeline was stopped")
            raise ActorDied(why, died.actor, died.died_at)
        self.restarts[died.actor] = self.restarts.get(died.actor, 0) + 1
        cause = died.args[0].removesuffix("; the pipeline was stopped")
        if any(source["kind"] not in FILE_KINDS for source in sources):
            cause += ("; a live source cannot be read again: what the previous ingest held after the last checkpoint "
                      "is a gap")
        return {"actor": died.actor, "cause": cause, "died_at": died.died_at, "restarts": dict(self.restarts)}


FILE_KINDS = ("replay", "loop", "follow")          # read again from a checkpoint's offset after a restart


def run_replay(cfg, log: str | list[str] | None = None, fmt: str | None = None, speed: float = 0.0,
               follow: bool = False, journal: str | None = None, pub: str | None = None, quiet_lines: bool = False,
               resume: bool = False, rate: float = 0.0) -> Report:
    """Stream a log (plain lines, TEP alarm CSV or JSON lines) through the pipeline: ingest, cache owner, target,
    draft and output actors. Every N lines the model writes a short assessment of what it has seen. SIGINT/SIGTERM
    drain the pipeline (twice: stop now); SIGUSR1 prints every actor's figures.

    sources:
      FILE                 replay a captured file (--speed scales its timing)
      FILE --follow        tail -f FILE, surviving rename and copytruncate rotation
      tcp://HOST:PORT      a line server; clients connect one after another
      -                    standard input
      SRC SRC ...          several streams, one target: each stream has its own ring, owner,
                           draft and journal (F.NAME.jsonl), and its output lines say its name
                           (named after the files; a profile's [[streams]] names them itself)
    launchers (--launcher, or [actors] launcher in the profile):
      local   one process per actor over shared-memory channels (default)
      ray     the same actors as five named Ray actors on one node (--ray-address joins
              a cluster; otherwise a local Ray instance is started and stopped)
      serial  everything in this process (the reference the pipeline must equal, record for
              record in the journal); a file from its start, no --pub"""
    cfg = with_logs(cfg, [log] if isinstance(log, str) else list(log or ()))
    if cfg.actors.launcher != "serial":
        with _run_dir() as run_dir:
            run_pipeline(cfg, stream_runs(cfg, fmt, speed, follow, journal, run_dir, rate), run_dir, pub=pub,
                         quiet_lines=quiet_lines, resume=_resumes(cfg, resume, journal))
        return Report()
    log = replay_log(cfg)
    if cfg.streams:
        raise ValueError("the serial launcher replays one stream: use --launcher local for several")
    if log.startswith("tcp://") or log == "-" or follow:
        raise ValueError("the serial launcher replays a file from its start: use --launcher local for sockets, stdin "
                         "and --follow")
    if resume or cfg.replay.resume:
        raise ValueError("the serial launcher has no restarts to resume from: use --launcher local for --resume")
    if pub:
        raise ValueError("the serial launcher prints and journals its events; --pub is the output actor's: use "
                         "--launcher local")
    budget.check(cfg)
    emit = printer(quiet_lines, journal)
    try:
        return ReplayReport(replay(log, fmt, cfg, emit, max_lines=cfg.replay.max_lines, speed=speed, rate=rate))
    finally:
        emit.close()


def run_serve(cfg, log: str | list[str] | None = None, fmt: str | None = None, rate: float = 0.0, speed: float = 0.0,
              loop: bool = False, follow: bool = False, journal: str | None = None,
              quiet_lines: bool = False, resume: bool = False) -> Report:
    """Run the pipeline over a log and answer operators' questions while it flows. A question goes ahead of stream
    prefill and analyses, is answered from the current context plus older lines retrieved from the archive (every
    ingested line is indexed in SQLite FTS5), and streams its tokens as they are committed; the stream's lines wait
    in a bounded backlog meanwhile. After the stream ends the server keeps answering until SIGINT/SIGTERM.

    endpoints (HTTP):
      /                         web console: live tail, analyses, chat, gauges
      /v1/chat/completions      OpenAI chat API ("stream": true for server-sent events)
      /v1/completions           OpenAI completions: the prompt continues the log
      /healthz, /metrics        health, Prometheus metrics
    zmq: python run.py ask "when did PIR108 last go HIGH HIGH?"
    A non-loopback --http needs a key: RINGSPEC_API_KEY, --api-key or --api-keys-file (one
    `NAME KEY` line per operator, NAME their turn in the fair queue); clients send
    Authorization: Bearer KEY, and `ask` sends RINGSPEC_API_KEY. zmq binds loopback or ipc only."""
    if cfg.actors.launcher == "serial":
        raise ValueError("serve runs the actor pipeline: use launcher local or ray")
    load_keys(cfg.serve.api_key, cfg.serve.api_keys_file)      # a bad key file is refused before anything starts
    if rate < 0:
        raise ValueError("--rate must be >= 0")
    cfg = with_logs(cfg, [log] if isinstance(log, str) else list(log or ()))
    with _run_dir() as run_dir:
        run_pipeline(cfg, stream_runs(cfg, fmt, speed, follow, journal, run_dir, rate, loop), run_dir,
                     pub=cfg.serve.pub or None, quiet_lines=quiet_lines, resume=_resumes(cfg, resume, journal))
    return Report()


@contextlib.contextmanager
def _run_dir():
    """The run's scratch directory (stop and drain flags, pids, a journal not asked for), removed at the end."""
    run_dir = tempfile.mkdtemp(prefix="ringspec_run_")
    try:
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _resumes(cfg, resume: bool, journal: str | None) -> bool:
    """--resume or [replay] resume: true, which needs the journal its checkpoints are read from."""
    if (resume or cfg.replay.resume) and not journal:
        raise ValueError("--resume reads the last checkpoint from the journal: give --journal F.jsonl")
    return resume or cfg.replay.resume


class _Signals:
    """SIGINT/SIGTERM: the first drains, the second stops; SIGUSR1 is forwarded to every actor (figures). `pids`:
    per group, the running actors' pids, set by the launcher of each start."""

    def __init__(self, run_dir: str):
        self.drain, self.stop = StopFlag(f"{run_dir}/drain"), StopFlag(f"{run_dir}/stop")
        self.pids: dict[str, object] = {}
        self.drain_since: float | None = None
        self.forced = False                  # a second signal: stopped at once
        self.previous = {sig: signal.signal(sig, self._on_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_stop(self, signum, frame):
        if self.drain_since is None:
            self.drain_since = time.monotonic()
            self.drain.set()
            print(f"ringspec: {signal.Signals(signum).name}: draining (again to stop now)", file=sys.stderr,
                  flush=True)
        else:
            self.forced = True
            self.stop.set()

    def _on_usr1(self, signum, frame):
        for pid in [pid for pids in list(self.pids.values()) for pid in pids()]:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def overdue(self) -> bool:
        return self.drain_since is not None and time.monotonic() - self.drain_since > DRAIN_S

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _cause(name: str, pid: int, code: int) -> str:
    how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit code {code}"
    return f"actor {name} (pid {pid}) died: {how}; the pipeline was stopped"


def _processes(plans: list[ActorPlan]) -> dict[str, mp.Process]:
    """Each plan's actor as a local process (spawn, dying with this one), not started yet: `_start_all`."""
    ctx = mp.get_context("spawn")
    return {p.name: ctx.Process(target=enter, args=(p.module, p.kwargs, os.getpid()), name=f"ringspec-{p.name}")
            for p in plans}


def _start_all(procs) -> None:
    # children inherit a blocked SIGUSR1 through fork+exec, so an early operator request cannot kill an actor that
    # has not installed its handler yet; `enter` unblocks it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        for proc in procs:
            proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def _local(plans: list[ActorPlan], group: Group, cfg, signals: _Signals) -> None:
    procs = _processes(plans)
    signals.pids[group.dir] = lambda: [p.pid for p in procs.values() if p.pid]
    stop = group.stop
    try:
        _start_all(procs.values())
        _write_pids(group.dir, {name: p.pid for name, p in procs.items()})
        while any(p.is_alive() for p in procs.values()) and not stop.is_set():
            for name, proc in procs.items():
                if proc.exitcode not in (None, 0) and not stop.is_set():
                    stop.set()
                    raise ActorDied(_cause(name, proc.pid, proc.exitcode), name)
            if signals.overdue():
                stop.set()
            time.sleep(0.05)
    finally:
        stop.set()
        deadline = time.monotonic() + _grace(procs)      # actors see `stop` within a poll interval
        for proc in procs.values():
            if proc.pid is not None:
                proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for proc in procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join()


def _grace(procs: dict) -> float:
    died = any(p.exitcode not in (None, 0) for p in procs.values())
    return DEATH_GRACE_S if died else STOP_GRACE_S


class RayActor:
    """The Ray face of an actor: the same module's run(**kwargs), in a Ray worker process."""

    def __init__(self):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # until the actor installs its figures handler

    def pid(self) -> tuple[int, str]:
        return os.getpid(), host_id()

    def run(self, module: str, kwargs: dict, console_pid: int, console_host: str) -> None:
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
        enter(module, kwargs)


def host_id() -> str:
    """This kernel's boot id: a pid means the same process only where it is the same (Ray nodes may share a host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


NODE_LABEL = "ringspec-node"          # `ray start --labels ringspec-node=NAME`: where [[streams]] node = NAME runs


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
                            f"{PLACE_S:.0f} s; the pipeline was stopped", group.actor("target"))
        labelled = False
        print(f"ringspec: no live Ray node is labelled {NODE_LABEL}={group.node}: streams {group.names} start on any "
              f"node that has room", file=sys.stderr, flush=True)


def _landed(ray, pg, plans: list[ActorPlan]) -> list[ActorPlan]:
    """The plans, the output actor's site links told the node the group landed on (its `ringspec-node` label; the
    configured node's until it died, then whichever had room): the site labels the group's streams with it."""
    node_id = next(iter(ray.util.placement_group_table(pg)["bundles_to_node_id"].values()), None)
    label = next(((n.get("Labels") or {}).get(NODE_LABEL, "") for n in ray.nodes() if n.get("NodeID") == node_id), "")
    return [dataclasses.replace(p, kwargs={**p.kwargs, "site": {**p.kwargs["site"], "node": label}})
            if "site" in p.kwargs else p for p in plans]


def _ray_token() -> bool:
    """A Ray auth token this process would present (Ray's own lookup order: variable, file variable, default)."""
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.exists(os.path.expanduser("~/.ray/auth_token")))


@contextlib.contextmanager
def _ray_session(cfg):
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
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # "local": always a new instance (None would join whatever /tmp/ray/ray_current_cluster names, live or not)
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=True, namespace="ringspec",
                 num_cpus=None if address else os.cpu_count(), configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONPATH": root, "RINGSPEC_HOME": str(home())}})
    try:
        launch = functools.partial(_ray, ray, placement_group, remove_placement_group, PlacementGroupSchedulingStrategy)
        launch.host = ray.util.get_node_ip_address()      # where this node is reached (a site's links: `Site`)
        yield launch
    finally:
        if started:
            ray.shutdown()


_starts = itertools.count()           # a restarted pipeline's Ray actors get new names


def _ray(ray, placement_group, remove_placement_group, PlacementGroupSchedulingStrategy,  # noqa: N803 -- Ray's
         plans: list[ActorPlan], group: Group, cfg, signals: _Signals) -> None:
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
        _write_pids(group.dir, pids)
        refs = {handles[p.name].run.remote(p.module, p.kwargs, os.getpid(), here): p.name for p in plans}
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
                    raise ActorDied(f"actor {name} ({where}) died: {type(exc).__name__}; the pipeline was stopped",
                                    name) from None
            if signals.overdue():
                stop.set()
    finally:
        stop.set()
        if refs:
            ray.wait(list(refs), num_returns=len(refs), timeout=DEATH_GRACE_S if died else STOP_GRACE_S)
        for h in handles.values():
            ray.kill(h, no_restart=True)
        remove_placement_group(pg)


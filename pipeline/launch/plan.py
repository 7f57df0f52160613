"""What a run starts, with what: its streams (from the profile and the command line's stream options), grouped by node,
and each group's actors, each an `ActorPlan`: the actor's `run` and its arguments (actors/args.py).

Owns the sizing of one start, done once here from the config and the model's card (the channels' geometry is
pipeline/topology.py's), and the files a start leaves for others (the actors' pids). Never starts a process and never
watches one: the launchers do (local.py, ray_actors.py), supervised by supervise.py.

    ingest --lines--> cache owner --events--> output
                       |  ^   |  ^
            to_target  |  |   |  | from_draft
                       v  |   v  |
                     target   draft
                    from_target  to_draft

Each channel is created by its consumer; producers attach when it appears (models take seconds to load).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Callable

import actors.cache_owner
import actors.draft
import actors.ingest
import actors.output
import actors.target
from actors.args import (
    ActorArgs,
    DraftArgs,
    FrontArgs,
    IngestArgs,
    OutputArgs,
    OwnerArgs,
    RelayArgs,
    RestartReason,
    SiteLinks,
    TargetArgs,
)
from models.registry import home
from pipeline.config import replay_log, streams_of
from pipeline.decode.drafts.model import speaks
from pipeline.messages import Checkpoint
from pipeline.process import CHAOS_DIR, StopFlag
from pipeline.stream.frame import replay_frame
from pipeline.stream.sources import SourceSpec, source_of
from pipeline.topology import actor_name, channels, per_stream_file


@dataclass(frozen=True)
class StreamOptions:
    """The command line's stream options of `replay` and `serve` (run.py), beside the profile's."""
    fmt: str | None = None              # plain, csv, jsonl (None: the profile's, else from the file's extension)
    speed: float = 0.0                  # replay a capture at this many times its own pace (0: as fast as it goes)
    rate: float = 0.0                   # ... or at this many lines per second (0: off)
    follow: bool = False                # tail -f the file
    loop: bool = False                  # replay the file over and over (serve)
    journal: str | None = None          # the journal (None: a file of the run's own, deleted at the end)
    resume: bool = False                # start after the journal's last checkpoint
    quiet_lines: bool = False           # stream lines are not printed
    pub: str | None = None              # replay's zmq PUB endpoint (serve's is the profile's serve.pub)


@dataclass(frozen=True)
class StreamRun:
    """One stream of a run (one stream: name "")."""
    name: str
    cfg: object           # the profile with this stream's [replay] (pipeline/config.py streams_of)
    source: SourceSpec    # what its ingest reads (pipeline/stream/sources.py source_of)
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


@dataclass(frozen=True)
class ActorPlan:
    """One actor of a start: the process (or Ray actor) `name` runs `run(args)` (pipeline/process.py `enter`)."""
    name: str
    run: Callable[..., None]                    # the actor: its module's `run` (actors/ROLE.py), pickled by name
    args: ActorArgs | tuple[ActorArgs, ...]     # a tuple: one run per stream, threads of one process (`run_each`)


def stream_runs(cfg, options: StreamOptions, run_dir: str) -> list[StreamRun]:
    """The run's streams from the profile (`[[streams]]`, or [replay]'s one) and the command line's options. Several
    streams keep one journal and one archive each: `--journal F.jsonl` becomes F.NAME.jsonl."""
    runs = []
    nodes = [st.node for st in cfg.streams] or [""]
    for (name, scfg), node in zip(streams_of(cfg), nodes):
        src = source_of(replay_log(scfg), options.fmt or scfg.replay.format or None, scfg.replay.max_lines,
                        options.speed, options.follow)
        if options.loop:
            if src.kind != "replay":
                raise ValueError("--loop replays a file; it cannot loop a socket, stdin or --follow")
            src = dataclasses.replace(src, kind="loop")
        if options.rate:
            src = dataclasses.replace(src, rate=options.rate)
        where = options.journal or f"{run_dir}/journal.jsonl"   # checkpoints need one; without --journal, the run's
        archive = cfg.serve.archive or str(home() / "archive" / "stream.sqlite")
        runs.append(StreamRun(name, scfg, src, per_stream_file(where, name), per_stream_file(archive, name), node))
    return runs


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


def actor_plans(cfg, group: Group, pub: str | None, quiet_lines: bool, tag: str, resume: list[Checkpoint | None] | None = None,
         restart: RestartReason | None = None, site: SiteLinks | None = None) -> list[ActorPlan]:
    """The actors and their channels, sized once here from the config and the model's card: one output, one target and
    one draft for the group, an ingest and a cache owner per stream (several streams: each role's are threads of one
    process, `run_each`). resume: per stream, the last durable checkpoint to start from (ingest re-reads a file from
    its window; the owner restores its counts); restart: why this start is a restart (journaled by each owner with
    its first committed line); site: the site's links, when the front is the site actor's (`Site.links`): the output
    actor relays to it."""

    card = cfg.target.card              # converts on first use, with progress
    vocab = card["config"]["vocab_size"]
    if cfg.draft.uses_model:
        draft_vocab = speaks(cfg.draft_model.card)
        if draft_vocab != vocab:
            raise ValueError(f"draft vocabulary {draft_vocab} != target vocabulary {vocab}: a draft must share the "
                             f"target's tokenizer")
    spec = replay_frame(cfg).spec
    streams, stop, drain = group.streams, group.stop, f"{group.run_dir}/drain"
    resume = resume or [None] * len(streams)
    restarts = restart.restarts if restart else {}
    links = [channels(st.cfg, spec, vocab, f"{tag}_{n}" if st.name else tag) for n, st in enumerate(streams)]
    front = relay = None
    if site:                              # the front is the site's: output relays (pipeline/serve/site_link.py)
        relay = RelayArgs(site, group.id, tag, tuple(ln["asks"].name for ln in links if "asks" in ln), restarts)
        pub = None
    elif cfg.serve.enabled:               # operators' questions: the front (in output) -> each stream's owner
        front = FrontArgs(tuple(ln["asks"].name for ln in links), tuple(st.archive for st in streams),
                          pids_file(group.dir), restarts)
    plans = [
        ActorPlan(group.actor("output"), actors.output.run, OutputArgs(
            in_specs=tuple(ln["events"] for ln in links), streams=tuple(st.name for st in streams),
            journals=tuple(st.journal for st in streams), model=cfg.target, pub=pub, quiet_lines=quiet_lines,
            cpus=cfg.actors.output_cpus, stop=stop, cfg=cfg, serve=front, site=relay)),
        ActorPlan(group.actor("target"), actors.target.run, TargetArgs(
            inboxes=tuple(ln["to_target"] for ln in links), outboxes=tuple(ln["from_target"].name for ln in links),
            cfg=cfg, spec=spec, stop=stop)),
        ActorPlan(group.actor("draft"), actors.draft.run, DraftArgs(
            inboxes=tuple(ln["to_draft"] for ln in links), outboxes=tuple(ln["from_draft"].name for ln in links),
            cfg=cfg, spec=spec, vocab=vocab, stop=stop))]
    owners, ingests = [], []
    for st, ln, point in zip(streams, links, resume):
        source, serving = st.source, cfg.serve.enabled
        if serving:
            source = dataclasses.replace(source, archive=st.archive, archive_max_lines=cfg.serve.archive_max_lines,
                                         archive_max_values=cfg.serve.archive_max_values_per_line,
                                         archive_max_templates=cfg.serve.archive_max_templates)
        owners.append(OwnerArgs(
            inbox=ln["lines"], outbox=ln["events"].name, from_target=ln["from_target"], from_draft=ln["from_draft"],
            to_target=ln["to_target"].name, to_draft=ln["to_draft"].name, cfg=st.cfg, spec=spec, stop=stop,
            source_id=source_id(source), questions=ln["asks"] if serving else None,
            drain=StopFlag(drain) if serving else None, resume=point, restart=restart))
        ingests.append(IngestArgs(out_name=ln["lines"].name, source=dataclasses.replace(source, resume=point),
                                  model=cfg.target, cpus=cfg.actors.ingest_cpus, stop=stop, drain=StopFlag(drain)))
    one = len(streams) == 1                  # several: a thread per stream in one process per role
    roles = (("cache_owner", actors.cache_owner.run, owners), ("ingest", actors.ingest.run, ingests))
    return plans + [ActorPlan(group.actor(role), run, each[0] if one else tuple(each)) for role, run, each in roles]


def source_id(source: SourceSpec) -> str:
    """What a checkpoint names as its source: a file's absolute path, tcp://HOST:PORT, or "-" (stdin)."""
    if source.kind == "tcp":
        return f"tcp://{source.host}:{source.port}"
    return "-" if source.kind == "stdin" else source.path


def pids_file(run_dir: str) -> str:
    """Where the launcher lists the actors' pids ({name: pid}) once they run: the front's memory gauges read it."""
    return f"{run_dir}/pids.json"


def write_pids(run_dir: str, pids: dict) -> None:
    for where in [run_dir] + ([CHAOS_DIR] if CHAOS_DIR else []):       # chaos: the fault injector reads them too
        with open(pids_file(where) + ".tmp", "w") as f:
            json.dump(pids, f)
        os.replace(pids_file(where) + ".tmp", pids_file(where))

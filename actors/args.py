"""What each actor is started with: one frozen dataclass per actor, the one argument of its `run`.

Owns the actors' start-up arguments, field by field (what each is, who made it), and why a start is a restart
(`RestartReason`, the supervisor's, journaled by each cache owner). The launcher builds them (pipeline/launch/plan.py)
and hands them to `run` in the actor's process (pipeline/process.py `enter`); an actor reads them by attribute. Never
decides a value (the plan does, from the profile and the model's card) and never holds what does not pickle: spawn
and Ray carry these into another process.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels.ring import RingSpec
from models.handle import Model
from pipeline.channel import ChannelSpec
from pipeline.config import Config
from pipeline.messages import Checkpoint
from pipeline.process import StopFlag
from pipeline.stream.sources import SourceSpec


@dataclass(frozen=True)
class RestartReason:
    """Why this start of a pipeline is a restart: made by the supervisor (pipeline/launch/deaths.py), journaled by
    each cache owner with its first committed line (`Restarted`)."""
    actor: str                          # the actor that died ("" for a whole-service resume)
    cause: str                          # its death as the launcher reported it ("resume" for a whole-service resume)
    died_at: float | None               # time.time() of the death (None: a whole-service resume)
    restarts: dict[str, int]            # {actor: restarts after its deaths so far}, this run


@dataclass(frozen=True)
class IngestArgs:
    out_name: str                       # the cache owner's lines channel (attached to)
    source: SourceSpec                  # what to read, the checkpoint to resume after included
    model: Model                        # the target model: its tokenizer
    cpus: str                           # CPU set ([actors] ingest_cpus; "" = any)
    stop: StopFlag                      # the pipeline's stop flag
    drain: StopFlag                     # the operator asked to drain: stop reading, still hand over an eof
    drop_after_s: float = 5.0           # a live source's record is dropped when the owner stays full this long


@dataclass(frozen=True)
class OwnerArgs:
    inbox: ChannelSpec                  # lines from ingest (created here)
    outbox: str                         # events to output (attached to)
    from_target: ChannelSpec            # the target's answers (created here)
    from_draft: ChannelSpec             # the draft's proposals (created here)
    to_target: str                      # passes to the target (attached to)
    to_draft: str                       # committed text and restarts to the draft (attached to)
    cfg: Config                         # the profile, with this stream's [replay]
    spec: RingSpec                      # the ring (pipeline/stream/replay.py replay_frame)
    stop: StopFlag                      # the pipeline's stop flag
    source_id: str                      # what checkpoints name as the source (plan.py source_id)
    questions: ChannelSpec | None = None    # serving: operators' questions from the front (created here)
    drain: StopFlag | None = None           # serving: the operator's drain (serving outlasts the stream until then)
    resume: Checkpoint | None = None        # the last durable checkpoint to start from (a restart, or --resume)
    restart: RestartReason | None = None    # why this start is a restart: journaled with the first committed line


@dataclass(frozen=True)
class TargetArgs:
    inboxes: tuple[ChannelSpec, ...]    # stream n's passes (created here)
    outboxes: tuple[str, ...]           # stream n's answers: its owner's from_target (attached to)
    cfg: Config                         # the profile ([model], [actors] target_cpus, [sampling])
    spec: RingSpec                      # each stream's ring and pool
    stop: StopFlag                      # the pipeline's stop flag


@dataclass(frozen=True)
class DraftArgs:
    inboxes: tuple[ChannelSpec, ...]    # stream n's committed text, restarts, commits (created here)
    outboxes: tuple[str, ...]           # stream n's proposals: its owner's from_draft (attached to)
    cfg: Config                         # the profile ([draft], [actors] draft_cpus)
    spec: RingSpec                      # each stream's ring (the draft model's pool is sized by it)
    vocab: int                          # the target's vocabulary size (a draft model must speak it)
    stop: StopFlag                      # the pipeline's stop flag


@dataclass(frozen=True)
class FrontArgs:
    """The operators' front in the output actor: a served run whose streams are on one node."""
    asks: tuple[str, ...]               # stream n's owner's question channel (attached to)
    archives: tuple[str, ...]           # stream n's archive (SQLite FTS5), where older lines are retrieved from
    pids_file: str                      # where the launcher lists the actors' pids: the front's memory gauges
    restarts: dict[str, int]            # {actor: restarts so far}, for /metrics


@dataclass(frozen=True)
class SiteLinks:
    """The site's two links (pipeline/serve/site_link.py), made by the launcher (pipeline/launch/site_actor.py)."""
    events: str                         # tcp://HOST:PORT: node groups' output actors push events and records here
    asks: str                           # tcp://HOST:PORT: ... and take questions from here (port 0: before bound)
    key: bytes                          # the run's: authenticates every message on the links (never sent on them)


@dataclass(frozen=True)
class RelayArgs:
    """The output actor's end of the site's links: a served run whose streams are on several nodes, the front the
    site actor's (actors/site.py)."""
    links: SiteLinks                    # the site's links, bound
    group: str                          # this node group's name on the links (its directory's: group0, ...)
    start: str                          # this start's id: a new one tells the site the group was started again
    asks_channels: tuple[str, ...]      # stream n's owner's question channel (attached to)
    restarts: dict[str, int]            # {actor: restarts so far}, for the site's /metrics
    node: str | None = None             # the node the group landed on (its Ray label; None: as configured)


@dataclass(frozen=True)
class OutputArgs:
    in_specs: tuple[ChannelSpec, ...]   # stream n's events (created here)
    streams: tuple[str, ...]            # stream n's name ("" when the run has one stream)
    journals: tuple[str | None, ...]    # stream n's journal (JSONL, fsynced per record)
    model: Model                        # the target model: its tokenizer
    pub: str | None                     # zmq PUB endpoint of the stream's events (None: off; at a site, the site's)
    quiet_lines: bool                   # stream lines are not printed
    cpus: str                           # CPU set ([actors] output_cpus; "" = any)
    stop: StopFlag                      # the pipeline's stop flag
    cfg: Config                         # the profile ([serve], when serving)
    serve: FrontArgs | None = None      # serving on one node: the front runs here
    site: RelayArgs | None = None       # serving on several nodes: this actor relays to the site's front


@dataclass(frozen=True)
class SiteStream:
    name: str                           # the stream's name ([[streams]] name)
    group: str                          # its node group's name on the links
    node: str                           # the node it is configured on ([[streams]] node)
    archive: str                        # its archive, where older lines are retrieved from


@dataclass(frozen=True)
class SiteArgs:
    cfg: Config                         # the profile ([serve])
    streams: tuple[SiteStream, ...]     # every stream of the run, in the profile's order
    links: SiteLinks                    # where the links bind (port 0 the first time: the ports bound are written
    endpoints_file: str                 # ... here, for the launcher to hand to the groups)
    pub: str | None                     # zmq PUB endpoint of every stream's events (None: off)
    pids_files: tuple[str, ...]         # where the launcher lists the actors' pids, the site's and each group's
    stop: StopFlag                      # the site's stop flag (set with the run's too)
    restarts: int = 0                   # this actor's own restarts so far (for /metrics)


ActorArgs = IngestArgs | OwnerArgs | TargetArgs | DraftArgs | OutputArgs | SiteArgs      # one per actor's `run`

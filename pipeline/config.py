"""Configuration: TOML profiles in configs/, validated once at start-up into typed, frozen objects.

Owns the schema (sections, keys, types, ranges), every default (a key a profile leaves out takes the value written
here; a section whose object lives in a lower layer, the runner's options or the sampling parameters, takes that
object's defaults), the ring's size (`ring_spec`), where the replay log is (`replay_log`), the models it names as
handles (`Config.target`, `Config.draft_model`: models/handle.py) and the error messages. Never starts anything and
never reads files other than the profile it is given (a model's, only when its handle is asked).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_type_hints

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.graph import SOFTMAX_ROWS
from models.handle import Model
from models.npu_runner import NPU_DTYPES
from models.runner import KERNELS, KV_DTYPES, RunnerOptions

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = ROOT / "configs" / "default.toml"


class ConfigError(ValueError):
    """A profile that cannot be used; the message names the file, the key and what was expected."""


@dataclass(frozen=True)
class ModelSection:
    gguf: str = "default"            # "default" = the bundled SmolLM2-135M-Instruct, else a path to a GGUF
    threads: int = RunnerOptions.threads
    max_rows: int = RunnerOptions.max_rows      # largest verify block in one target pass
    prefill_rows: int = 32                      # rows of a prefill pass, and its grid (docs/operators.md, "Ingest")
    accuracy_level: int = RunnerOptions.accuracy_level
    kernel: str = RunnerOptions.kernel          # the pass: "native" (our own matmul over the GGUF's blocks as stored
    # and our own attention, no ONNX Runtime session: models/native.py) | "nbits" (ONNX Runtime's MatMulNBits) |
    # "auto": native where it reads the model here, else nbits (RunnerOptions.resolved)
    kv_dtype: str = RunnerOptions.kv_dtype      # the K/V pools: "float16" | "float32" | "auto": float16 on the native
    # pass (read in place: half the bytes a token), float32 on nbits (ONNX Runtime would cast it every pass)
    spin: bool = RunnerOptions.spin             # ONNX Runtime's threads spin-wait between ops
    batch_invariant: bool = RunnerOptions.batch_invariant   # no operator sees one row: exact on every CPU
    lone_graph: bool = True                     # several streams: the target keeps the single-stream graph beside
    # the several-stream one for passes of one stream's rows (about half their time; one more session)
    pass_streams: int = 2                       # several streams: the most one target pass carries, its widest
    # graph's slots (each costs its attention's nodes every pass and ~8 MB; more streams take turns: models/streams.py)

    def graph_sizes(self, streams: int) -> tuple[int, ...]:
        """The graphs a target of `streams` streams (two or more) opens, by their streams' slots (models/streams.py):
        the widest, with `pass_streams` slots (at most one per stream), and the single-stream one (`lone_graph`)."""
        widest = min(streams, self.pass_streams)
        return tuple(sorted({1, widest})) if self.lone_graph else (widest,)

    def runner_options(self, **extra) -> RunnerOptions:
        """The target runner's options from this section (`extra`: graph choices such as trees or rope_angles)."""
        return RunnerOptions(threads=self.threads, max_rows=max(self.max_rows, self.prefill_rows),
                             accuracy_level=self.accuracy_level, kernel=self.kernel, kv_dtype=self.kv_dtype,
                             spin=self.spin, batch_invariant=self.batch_invariant, **extra)

    def resolved(self, card: dict, **extra) -> RunnerOptions:
        """`runner_options` for the model of `card`, its kernel named ("auto" resolved: RunnerOptions.resolved)."""
        return self.runner_options(**extra).resolved(card)


@dataclass(frozen=True)
class CacheSection:
    sink: int = 4                    # attention-sink slots (the replay grows them to hold its system prompt)
    window: int = 1024               # W: the most recent tokens each query attends to
    slack: int = 0                   # extra ring slots: ring = window + max(slack, uncommitted rows): `ring_spec`


@dataclass(frozen=True)
class DraftSection:
    kind: str = "suffix"             # none | suffix | model | hybrid (suffix when the stream matches, else model)
    model: str = "default-draft"     # GGUF of the neural draft (kind = "model" or "hybrid"); default: bundled
    length: int = 6                  # proposals per verify pass (the upper bound when adaptive)
    adaptive: bool = False           # choose each pass's length online from observed acceptance and verify cost
    adaptive_costs: str = "measured"  # measured: the verify and draft seconds as timed | prior: the prior cost model
                                     # (a row 0.2 of a pass, drafting free), so the length follows acceptance alone
                                     # and a replay chooses the same blocks on a loaded host as on an idle one
    end_at_line: bool = False        # a block ends after its first proposed token that carries a newline
    siblings: int = 0                # token trees: other first tokens verified beside the chain (suffix, hybrid)
    threads: int = 1                 # ONNX Runtime threads of a draft model
    backend: str = "onnx"            # where a draft model runs: onnx (ONNX Runtime, CPU) | rknn (the board's NPU)
    npu_dtype: str = "float16"       # the NPU draft's numbers: float16 (a model per row bucket) | int8 (one model for
                                     # every pass, linears in int8, the rest float16: models/npu_runner.py)
    min_confidence: float = 0.0      # a draft model stops its chain when its top probability falls below this

    @property
    def uses_model(self) -> bool:
        """A draft GGUF is loaded (kind model, or hybrid's fallback)."""
        return self.kind in ("model", "hybrid")


@dataclass(frozen=True)
class SamplingSection:
    temperature: float = SamplingParams.temperature      # 0 = greedy
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    seed: int = SamplingParams.seed

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


@dataclass(frozen=True)
class ReplaySection:
    log: str = "data/tep_demo.csv"
    format: str = ""                 # plain | csv | jsonl; "" = from the file's extension (plain: sockets, stdin)
    every_lines: int = 10            # an assessment after this many stream lines (since the last one)
    trigger_pattern: str = ""        # regex on a rendered line: assess right after a matching line ("" = off)
    idle_s: float = 0.0              # assess unassessed lines after this many quiet seconds (0 = off)
    score_stream: bool = False       # each stream line's surprisal and how unusual it is (pipeline/stream/
                                     # surprise.py), journaled per line; the head runs on the rows of words too
    surprise_above: float = 0.0      # assess right after a line this unusual (its surprisal's z against its
                                     # template's baseline; 0 = off; > 0 turns score_stream on)
    score_every_token: bool = False  # score every token, not only words (tokens with a letter and no digit):
                                     # off, digits and punctuation (what a template folds or keeps) skip the head
    max_new_tokens: int = 60
    max_lines: int = 0               # 0 = the whole file
    line_rate: float = 0.0           # lines/s the stream must sustain: the run warns once its measured ingest
                                     # capacity is below it (0 = no claim; `bench --task ingest` measures it)
    resume: bool = False             # start a file source after the journal's last checkpoint (--resume)
    # What the stream is, in its own words (per stream in [[streams]]): the system turn and the label that opens the
    # log's user turn, both kept in the sinks; `entry`, what one line of the log is called in the words the engine
    # writes in a structured assessment ("The latest alarm is", "Latest alarm tags:"); the questions. The defaults
    # are the TEP alarm console's; configs/syslog.toml and configs/hadoop.toml state other logs.
    system_prompt: str = ("You are the alarm analyst of a chemical plant. You read the operator console's alarm "
                          "log and, when asked, summarise in one or two short sentences what is happening.")
    log_label: str = "Alarm log:"    # one line; the ring's lines continue the turn it opens
    entry: str = "alarm"             # one line of the log, in the structured form's engine-written words
    question: str = "Summarise the latest alarms above in one sentence, naming the tags."
    form: str = "structured"         # free | constrained (free text; a tag written must be one in view) | structured
                                     # (changed and what may follow written under the same rule; the latest tags
                                     # and the severity the lines state, computed: pipeline/stream/forms.py)
    form_question: str = ("Fill in the form for the latest alarms above: Changed (what changed, one short sentence) "
                          "and What may follow (one short sentence).")

    @property
    def scored(self) -> bool:
        """Stream lines are scored as they go in (their surprisal is asked for, or triggers)."""
        return self.score_stream or self.surprise_above > 0


@dataclass(frozen=True)
class ServeSection:
    """Operators' questions (`python run.py serve`): interfaces, bounds, and memory beyond the ring."""
    enabled: bool = False            # set by `serve`: the ring's slack grows to hold a question span and its answer
    http: str = "127.0.0.1:8080"     # HOST:PORT of the HTTP API and console ("" = off)
    zmq: str = "tcp://127.0.0.1:7701"    # zmq request socket, msgpack messages ("" = off)
    pub: str = ""                    # zmq PUB of stream events, never operators' answers ("" = off: any local user
                                     # can subscribe to tcp; ipc://DIR/NAME binds in DIR, made or kept 0700)
    api_key: str = ""                # one operator's key (Authorization: Bearer KEY); also RINGSPEC_API_KEY
    api_keys_file: str = ""          # one `NAME KEY` line per operator; NAME is the fair queue's identity
    allowed_hosts: str = ""          # Host/Origin names answered, comma-separated ("" = the bind address, localhost
                                     # and loopback; a wildcard bind answers any; "*" = any)
    max_connections: int = 64        # HTTP connections handled at once, those whose key checked out apart from
                                     # those not yet (each up to this many); a keyed one past it gets 503; an
                                     # unkeyed one past it cuts the oldest unkeyed (pipeline/serve/http_api.py)
    max_connections_per_peer: int = 16   # of the unkeyed ones, from one remote address (past it: its own oldest cut)
    request_timeout_s: float = 30.0  # a request's line, headers and body must all arrive within this (else cut)
    max_prompt_tokens: int = 384     # a question's span: the conversation plus the retrieved lines
    max_answer_tokens: int = 256
    max_body_bytes: int = 65536
    max_head_bytes: int = 16384      # an HTTP request's line and headers; longer: 431, closed, never buffered whole
    max_zmq_peers: int = 64          # zmq clients connected with a request taken; a new one past it gets 503
    max_waiting: int = 16            # requests waiting or being answered at once; more are refused with 503
    max_waiting_per_operator: int = 0    # of those, one operator's (its key's name) at most; more get 429 (0 = half
                                     # of max_waiting, rounded up, with a key file; all of it without one)
    deadline_s: float = 60.0         # a request not answered by then ends (queued: an error; answering: cut short)
    backlog_lines: int = 4096        # stream lines held while the model answers (then the channel, then drops)
    stream_share: float = 0.5        # while lines wait, the least share of the target's time (last ~30 s) the stream
                                     # gets before questions and analyses go first again (0 = questions always first)
    archive: str = ""                # SQLite FTS5 file of every line ("" = $RINGSPEC_HOME/archive/stream.sqlite)
    archive_max_lines: int = 1_000_000
    archive_max_values_per_line: int = 64    # values and cells of a line kept in the archive (the rest counted)
    archive_max_templates: int = 10_000      # line templates the archive's miner holds (least recently used go)
    question_budget_s: float = 1.0   # a cited question's work over the archive at most (past it: a partial answer
                                     # saying its bound, or "too broad"; pipeline/stream/evidence.py Budget)
    question_max_lines: int = 10_000    # ... and the archive's lines it reads at most (the newest candidates)
    site: str = ""                   # streams served on several nodes: the host their output actors reach the site's
                                     # one front at ("" = 127.0.0.1 with the local launcher, the launcher's Ray node
                                     # address with ray); its two link ports are picked at start (actors/site.py)
    retrieve: int = 2                # older lines retrieved into a question's span (0 = none; each costs its tokens
                                     # of prefill before the first answer token: ~25 for a TEP line, ~60 ms here)
    reader: str = "cited"            # cited: lookups and aggregates answered from the archive's values, each answer
                                     # a span of a cited line or a computed value (pipeline/serve/cited.py), other
                                     # questions as free; spans: as cited, a lookup's line and span chosen by the
                                     # ranker that names no format (pipeline/answer/pick.py, issue 59); free: the
                                     # model writes every answer over retrieved lines
    span_model: int = 0              # spans: the ranker's first K candidates of a lookup's line scored by the model
                                     # as whole continuations of a short prompt (pipeline/answer/score.py), the
                                     # ranker's score added (0 = the ranker alone, no model call: the 135M's best)


@dataclass(frozen=True)
class ActorsSection:
    """CPU sets (taskset syntax: "0", "0-1", "0,2"; "" = not pinned) applied in each actor process."""
    ingest_cpus: str = ""
    owner_cpus: str = ""
    target_cpus: str = ""
    draft_cpus: str = ""
    output_cpus: str = ""
    launcher: str = "local"          # local (processes) | ray (named Ray actors) | serial (one process, no actors)
    ray_address: str = ""            # "" = start a local Ray instance; else join this cluster (e.g. "auto")


@dataclass(frozen=True)
class SuperviseSection:
    """What the launcher does when an actor dies: restart the pipeline from the last durable checkpoint (all five
    actors, Erlang/OTP's one_for_all), unless one actor died `max_restarts` times within `period_s` (a crash loop:
    stop, exit 2). The cache owner writes a checkpoint every `checkpoint_s` while lines flow, and at every
    assessment; the journal holding them is rotated (pipeline/stream/journal.py)."""
    max_restarts: int = 5            # 0 = fail-stop: the first death stops the pipeline (exit 2)
    period_s: float = 60.0
    checkpoint_s: float = 2.0
    journal_max_mb: float = 64.0     # a journal file past this is rotated after its next checkpoint (0 = never)
    journal_keep: int = 4            # ... files kept, the current one included (F, F.1, ..., the oldest dropped)


@dataclass(frozen=True)
class BoardSection:
    """The machine a profile is for: `plan` holds the memory plan against its RAM, start-up checks its cores."""
    name: str = ""                   # "" = whatever machine runs the profile
    ram_mb: int = 0                  # 0 = this machine's MemTotal
    reserve_mb: int = 512            # left to the OS, its page cache and whatever else the box runs
    cpus: str = ""                   # the board's cores ("" = this machine's); actor CPU sets must lie within
    big_cpus: str = ""               # its fast cores (RK3588: "4-7", the Cortex-A76): the target's threads go there
    big_core: str = ""               # what they are ("cortex-a76"): checked against /proc/cpuinfo where it says
    npu: str = ""                    # "" = none; "rknpu2" = the RK3588's: draft.backend = "rknn" needs one
    npu_domain_mb: int = 4096        # one NPU IOMMU domain maps at most this (RKNPU2: 4 GB)


def cpu_set(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}; '' -> set() (no pinning)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list like \"0-1\" or \"0,2\"")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


STREAM_KEYS = ("log", "format", "every_lines", "trigger_pattern", "idle_s", "max_lines", "line_rate", "system_prompt",
               "log_label", "entry", "question", "form_question")
STREAM_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@dataclass(frozen=True)
class Stream:
    """One of several streams sharing a target (`[[streams]]`): a name, and its [replay] section: its source
    (`log`, `format`), its triggers and its own words (its system prompt, log label, entry and questions: STREAM_KEYS)
    from its own table, every other key from [replay]. Streams of one `node` (Ray's node label `ringspec-node`,
    docs/streams.md) share one target, each node's group its own. Each stream has its own cache owner and K/V pools,
    so what its sinks hold is its own; what the streams of a target share is the ring's shape (sink slots, window,
    slack: its several-stream graph runs their pools in one shape), sized for the longest head and the largest
    scratch span among them (pipeline/stream/frame.py)."""
    name: str
    replay: ReplaySection
    node: str = ""                   # "" = the run's first group, wherever Ray places it


@dataclass(frozen=True)
class Config:
    model: ModelSection = field(default_factory=ModelSection)
    cache: CacheSection = field(default_factory=CacheSection)
    draft: DraftSection = field(default_factory=DraftSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)
    replay: ReplaySection = field(default_factory=ReplaySection)
    actors: ActorsSection = field(default_factory=ActorsSection)
    serve: ServeSection = field(default_factory=ServeSection)
    supervise: SuperviseSection = field(default_factory=SuperviseSection)
    board: BoardSection = field(default_factory=BoardSection)
    streams: tuple[Stream, ...] = ()                 # () = one stream, [replay]'s
    source: str = "<defaults>"

    @property
    def target(self) -> Model:
        """The target model ([model] gguf): its file, converted directory, card and tokenizer (models/handle.py)."""
        return Model.of(self.model.gguf)

    @property
    def draft_model(self) -> Model:
        """The draft model ([draft] model), for a draft kind that loads one (`DraftSection.uses_model`)."""
        return Model.of(self.draft.model)


def streams_of(cfg: Config) -> list[tuple[str, Config]]:
    """(name, profile) per stream: each stream's profile is `cfg` with its own [replay]; one stream is ("", cfg)."""
    return [(st.name, dataclasses.replace(cfg, replay=st.replay, streams=())) for st in cfg.streams] or [("", cfg)]


def replay_of(cfg: Config, name: str) -> ReplaySection:
    """The [replay] section of the stream called `name` (its own words included); [replay]'s own for "" (one
    stream) or a name not listed."""
    return next((st.replay for st in cfg.streams if st.name == name), cfg.replay)


def node_profile(cfg: Config, node: str) -> Config:
    """`cfg` with the streams of one node only (what that node's group runs, and what its memory plan counts)."""
    return dataclasses.replace(cfg, streams=tuple(st for st in cfg.streams if st.node == node))


def with_logs(cfg: Config, logs: list[str]) -> Config:
    """`cfg` watching `logs` (the command line's sources): one keeps [replay] (its log given); several become
    streams named by their files' names (a socket's port, stdin's "stdin"), each with [replay]'s other keys."""
    logs = [log if log == "-" or log.startswith("tcp://") else str(Path(log).absolute()) for log in logs]
    if len(logs) <= 1:
        return dataclasses.replace(override(cfg, {"replay.log": logs[0]}), streams=()) if logs else cfg
    names: list[str] = []
    for log in logs:
        stem = "stdin" if log == "-" else re.sub(r"[^a-z0-9_-]+", "-", Path(log.rpartition(":")[2] if
                                                                            log.startswith("tcp://") else log)
                                                   .stem.lower()).strip("-_") or "stream"
        base, i = stem[:28], 2
        while stem in names:
            stem, i = f"{base}-{i}", i + 1
        names.append(stem)
    return dataclasses.replace(cfg, streams=tuple(Stream(n, dataclasses.replace(cfg.replay, log=log))
                                                  for n, log in zip(names, logs)))


def override(cfg: Config, values: dict) -> Config:
    """`cfg` with {"section.key": value} replaced (values a caller derived, e.g. a full cache sized to a text)."""
    tables: dict = {}
    for dotted, value in values.items():
        section, key = dotted.split(".", 1)
        tables.setdefault(section, {})[key] = value
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **table)
                                       for name, table in tables.items()})


def replay_log(cfg: Config) -> str:
    """The profile's replay.log as a path (a relative one is from the repository root, not the working directory),
    or a socket (tcp://HOST:PORT) or stdin (-) as written."""
    log = cfg.replay.log
    if log == "-" or log.startswith("tcp://") or Path(log).is_absolute():       # stdin, a socket, a full path
        return log
    return str(ROOT / log)


def ring_spec(cfg: Config, head: int = 0, scratch: int = 0) -> RingSpec:
    """The KV pool every engine of a run is built with; the one place a ring is sized.

    Sinks: [cache] sink, grown to hold a `head` kept forever (the replay's system prompt). Ring: the window plus a
    slack for the rows not yet committed: a target block (max_rows); with a `scratch` span (a question and its answer,
    rolled back after) the slack holds it too, plus two draft blocks, since a draft actor runs a block ahead."""
    rows = max(cfg.model.max_rows, cfg.model.prefill_rows)
    rows = max(rows, 2 * (cfg.draft.length + 1)) if scratch else rows
    return RingSpec(max(cfg.cache.sink, head), cfg.cache.window,
                    cfg.cache.window + max(cfg.cache.slack, scratch + rows))


_CHOICES = {("model", "kernel"): KERNELS, ("model", "kv_dtype"): KV_DTYPES,
            ("draft", "kind"): ("none", "suffix", "model", "hybrid"), ("draft", "backend"): ("onnx", "rknn"),
            ("draft", "npu_dtype"): NPU_DTYPES,
            ("board", "npu"): ("", "rknpu2"), ("replay", "format"): ("", "plain", "csv", "jsonl"),
            ("replay", "form"): ("free", "constrained", "structured"),
            ("actors", "launcher"): ("local", "ray", "serial"), ("draft", "adaptive_costs"): ("measured", "prior"),
            ("serve", "reader"): ("cited", "spans", "free")}
_MIN = {("model", "threads"): 1, ("model", "max_rows"): 2, ("model", "prefill_rows"): 2, ("cache", "sink"): 0,
        ("model", "pass_streams"): 1,
        ("cache", "window"): 1, ("cache", "slack"): 0, ("draft", "length"): 0, ("draft", "threads"): 1,
        ("draft", "siblings"): 0, ("sampling", "temperature"): 0.0,
        ("sampling", "top_k"): 0, ("replay", "every_lines"): 1, ("replay", "max_new_tokens"): 1,
        ("replay", "max_lines"): 0, ("replay", "idle_s"): 0.0, ("replay", "surprise_above"): 0.0,
        ("model", "accuracy_level"): 0,
        ("serve", "max_prompt_tokens"): 16, ("serve", "max_answer_tokens"): 1, ("serve", "max_body_bytes"): 1024,
        ("serve", "max_waiting"): 1, ("serve", "deadline_s"): 0.1, ("serve", "max_connections"): 1,
        ("serve", "max_connections_per_peer"): 1, ("serve", "max_head_bytes"): 256, ("serve", "max_zmq_peers"): 1,
        ("serve", "request_timeout_s"): 0.1, ("serve", "backlog_lines"): 0,
        ("serve", "archive_max_lines"): 1, ("serve", "archive_max_values_per_line"): 1,
        ("serve", "archive_max_templates"): 1, ("serve", "retrieve"): 0, ("supervise", "max_restarts"): 0,
        ("supervise", "period_s"): 0.0, ("supervise", "checkpoint_s"): 0.01, ("supervise", "journal_max_mb"): 0.0,
        ("supervise", "journal_keep"): 1,
        ("replay", "line_rate"): 0.0, ("serve", "stream_share"): 0.0, ("board", "ram_mb"): 0,
        ("board", "reserve_mb"): 0, ("board", "npu_domain_mb"): 1,
        ("serve", "max_waiting_per_operator"): 0, ("serve", "question_budget_s"): 0.01,
        ("serve", "question_max_lines"): 1, ("serve", "span_model"): 0}


# a pass's rows: the graph's softmax width (models/graph.py SOFTMAX_ROWS) and doctor's probes (1..64 rows); a slot
# of a pass carries 2 rows at least
_MAX = {("model", "max_rows"): SOFTMAX_ROWS, ("model", "prefill_rows"): SOFTMAX_ROWS,
        ("model", "pass_streams"): SOFTMAX_ROWS // 2,
        ("serve", "stream_share"): 1.0, ("serve", "span_model"): 8}


def load(path: str | Path | None = None, overrides: dict | None = None, here: bool = True) -> Config:
    """Read and validate a profile (default: configs/default.toml); `overrides` = {"section.key": value}. here: the
    profile runs on this machine, so its CPU sets must exist here (False: `plan` of another board)."""
    path = Path(path) if path else DEFAULT_PROFILE
    return parse(read_raw(path, overrides), str(path), here)


def read_raw(path: str | Path | None = None, overrides: dict | None = None) -> dict:
    """A profile's tables as read, not validated (default: configs/default.toml), with `overrides` written in."""
    path = Path(path) if path else DEFAULT_PROFILE
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".", 1)
        raw.setdefault(section, {})[key] = value
    return raw


def parse(raw: dict, source: str = "<dict>", here: bool = True) -> Config:
    sections = {}
    hints = get_type_hints(Config)
    for name, table in raw.items():
        if name == "streams":
            continue
        if name not in hints or name == "source":
            raise ConfigError(f"{source}: unknown section [{name}] (known: {', '.join(_section_names())})")
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
        sections[name] = _section(hints[name], name, table, source)
    _words(sections.get("replay", ReplaySection()), f"{source}: replay.")
    cfg = Config(**sections, streams=_streams(raw.get("streams", []), raw.get("replay", {}), source), source=source)
    if cfg.draft.uses_model and not cfg.draft.model:
        raise ConfigError(f"{source}: [draft] kind = \"{cfg.draft.kind}\" needs model = \"path/to/draft.gguf\"")
    if not 0.0 <= cfg.draft.min_confidence < 1.0:
        raise ConfigError(f"{source}: draft.min_confidence = {cfg.draft.min_confidence} must be in [0, 1) "
                          f"(0 = always propose `length` tokens)")
    if cfg.draft.siblings and cfg.draft.kind not in ("suffix", "hybrid"):
        raise ConfigError(f"{source}: draft.siblings = {cfg.draft.siblings} branches from the stream: it needs "
                          f"kind = \"suffix\" or \"hybrid\", not \"{cfg.draft.kind}\"")
    if cfg.draft.backend == "rknn" and not cfg.draft.uses_model:
        raise ConfigError(f"{source}: draft.backend = \"rknn\" runs a draft model on the NPU: it needs kind = "
                          f"\"model\" or \"hybrid\", not \"{cfg.draft.kind}\"")
    if cfg.draft.backend == "rknn" and not cfg.board.npu:
        raise ConfigError(f"{source}: draft.backend = \"rknn\" needs a board with an NPU: [board] npu = \"rknpu2\"")
    cfg = _cpus(cfg, source, here)
    try:
        re.compile(cfg.replay.trigger_pattern)
    except re.error as exc:
        raise ConfigError(f"{source}: replay.trigger_pattern {cfg.replay.trigger_pattern!r} is not a valid regular "
                          f"expression: {exc}") from None
    for key in ("http",):
        value = getattr(cfg.serve, key)
        host, _, port = value.rpartition(":")
        if value and (not host or not port.isdigit() or not 0 <= int(port) < 65536):
            raise ConfigError(f"{source}: serve.{key} = {value!r}; expected HOST:PORT, e.g. \"127.0.0.1:8080\"")
    for key in ("zmq", "pub"):
        value = getattr(cfg.serve, key)
        if value and not re.fullmatch(r"(tcp://[^:/]+:\d+|ipc://.+|inproc://.+)", value):
            raise ConfigError(f"{source}: serve.{key} = {value!r}; expected a zmq endpoint like "
                              f"\"tcp://127.0.0.1:7701\" or \"ipc:///tmp/ringspec.sock\"")
        if value.startswith("tcp://") and not is_loopback(value[len("tcp://"):].rpartition(":")[0]):
            raise ConfigError(f"{source}: serve.{key} = {value!r} is not a loopback address, and zmq carries no "
                              f"key here: bind tcp://127.0.0.1 or ipc:// and reach it through ssh -L, or use the "
                              f"HTTP API with a key")
    if cfg.serve.max_waiting_per_operator > cfg.serve.max_waiting:
        raise ConfigError(f"{source}: serve.max_waiting_per_operator = {cfg.serve.max_waiting_per_operator} exceeds "
                          f"serve.max_waiting = {cfg.serve.max_waiting}: it would never bind")
    if cfg.serve.site and not re.fullmatch(r"[A-Za-z0-9.-]+", cfg.serve.site):
        raise ConfigError(f"{source}: serve.site = {cfg.serve.site!r}; expected a host name or IPv4 address (the site "
                          f"picks its ports)")
    if cfg.serve.http and not is_loopback(cfg.serve.http.rpartition(":")[0]) and not (
            cfg.serve.api_key or cfg.serve.api_keys_file):
        raise ConfigError(f"{source}: serve.http = {cfg.serve.http!r} is not a loopback address: set "
                          f"RINGSPEC_API_KEY, serve.api_key or serve.api_keys_file (clients send Authorization: "
                          f"Bearer KEY)")
    if not 0.0 < cfg.sampling.top_p <= 1.0:
        raise ConfigError(f"{source}: [sampling] top_p must be in (0, 1], got {cfg.sampling.top_p}")
    return cfg


ACTOR_CPUS = ("ingest_cpus", "owner_cpus", "target_cpus", "draft_cpus", "output_cpus")


def _cpus(cfg: Config, source: str, here: bool) -> Config:
    """Every CPU set parses and lies within the board's cores (`[board] cpus`), the target's on its big cores; `here`,
    within this machine's too. RINGSPEC_UNPIN=1 runs a board's profile on another machine: every actor unpinned
    (the sets are still checked against the board)."""
    sets = {}
    for key in ("cpus", "big_cpus"):
        try:
            sets[key] = cpu_set(getattr(cfg.board, key))
        except ValueError as exc:
            raise ConfigError(f"{source}: board.{key}: {exc}") from None
    board = sets["cpus"]
    if sets["big_cpus"] - (board or sets["big_cpus"]):
        raise ConfigError(f"{source}: board.big_cpus = {cfg.board.big_cpus!r} lies outside board.cpus = "
                          f"{cfg.board.cpus!r}")
    usable = os.sched_getaffinity(0)
    unpin = os.environ.get("RINGSPEC_UNPIN", "") not in ("", "0")
    for key in ACTOR_CPUS:
        try:
            cpus = cpu_set(getattr(cfg.actors, key))
        except ValueError as exc:
            raise ConfigError(f"{source}: actors.{key}: {exc}") from None
        if board and cpus - board:
            raise ConfigError(f"{source}: actors.{key} = {getattr(cfg.actors, key)!r} names CPUs "
                              f"{sorted(cpus - board)} the board {cfg.board.name or ''} does not have "
                              f"(board.cpus = {cfg.board.cpus!r})")
        if key == "target_cpus" and sets["big_cpus"] and cpus - sets["big_cpus"]:
            raise ConfigError(f"{source}: actors.target_cpus = {cfg.actors.target_cpus!r} includes CPUs "
                              f"{sorted(cpus - sets['big_cpus'])} that are not the board's big cores "
                              f"(board.big_cpus = {cfg.board.big_cpus!r}): the target's threads would wait for them")
        if here and cpus - usable and not unpin:
            hint = (f"; the profile is for the {cfg.board.name} board: RINGSPEC_UNPIN=1 runs it here unpinned"
                    if cfg.board.name else "")
            raise ConfigError(f"{source}: actors.{key} = {getattr(cfg.actors, key)!r} names CPUs "
                              f"{sorted(cpus - usable)} this machine does not offer (usable: {sorted(usable)}){hint}")
    if unpin:
        cfg = dataclasses.replace(cfg, actors=dataclasses.replace(cfg.actors, **{k: "" for k in ACTOR_CPUS}))
    return cfg


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _streams(tables, replay: dict, source: str) -> tuple[Stream, ...]:
    """[[streams]]: each table a name and STREAM_KEYS, over [replay] (validated as a [replay] section)."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{source}: streams must be an array of tables: [[streams]] name = \"dcs\" log = \"...\"")
    out: list[Stream] = []
    for i, table in enumerate(tables):
        where = f"streams[{i}]"
        name = table.get("name")
        if not isinstance(name, str) or not STREAM_NAME.fullmatch(name):
            raise ConfigError(f"{source}: {where}.name = {name!r}; expected a short name of lower-case letters, "
                              f"digits, - and _ (it labels the stream's output, metrics and journal)")
        if name in (st.name for st in out):
            raise ConfigError(f"{source}: {where}.name = {name!r} is already the name of another stream")
        if "log" not in table:
            raise ConfigError(f"{source}: {where} ({name}) needs log = \"path\", \"tcp://HOST:PORT\" or \"-\"")
        extra = sorted(set(table) - {"name", "node", *STREAM_KEYS})
        if extra:
            raise ConfigError(f"{source}: {where} ({name}): unknown key {extra[0]} (a stream sets name, node and "
                              f"{', '.join(STREAM_KEYS)}; the rest is [replay]'s)")
        node = table.get("node", "")
        if not isinstance(node, str) or (node and not STREAM_NAME.fullmatch(node)):
            raise ConfigError(f"{source}: {where}.node = {node!r}; expected the value of a Ray node's ringspec-node "
                              f"label: lower-case letters, digits, - and _ (`ray start --labels ringspec-node=b`)")
        merged = {**(replay if isinstance(replay, dict) else {}),
                  **{k: v for k, v in table.items() if k not in ("name", "node")}}
        try:
            out.append(Stream(name, _section(ReplaySection, "replay", merged, source), node))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {where} ({name}): {str(exc).removeprefix(source + ': ')}") from None
        _words(out[-1].replay, f"{source}: {where} ({name}).")
    if sum(st.replay.log == "-" for st in out) > 1:
        raise ConfigError(f"{source}: more than one stream reads standard input (log = \"-\")")
    for st in out:
        try:
            re.compile(st.replay.trigger_pattern)
        except re.error as exc:
            raise ConfigError(f"{source}: streams ({st.name}).trigger_pattern {st.replay.trigger_pattern!r} is not "
                              f"a valid regular expression: {exc}") from None
    return tuple(out)


def _words(replay: ReplaySection, where: str) -> None:
    """A stream's own words can frame its prompt: a system prompt, and a label and an entry of one line each."""
    if not replay.system_prompt.strip():
        raise ConfigError(f"{where}system_prompt is empty; it is the system turn the sinks keep: say what the stream "
                          f"is (\"You read a Linux server's syslog ...\")")
    for key, example in (("log_label", "Syslog:"), ("entry", "message")):
        value = getattr(replay, key)
        if not value.strip() or value != value.strip() or "\n" in value or "\r" in value:
            raise ConfigError(f"{where}{key} = {value!r}; expected one line of text without surrounding spaces, e.g. "
                              f"\"{example}\"")


def _section_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Config) if f.name not in ("source", "streams")] + ["[streams]"]


def _section(cls, name: str, table: dict, source: str):
    hints = get_type_hints(cls)
    values = {}
    for key, value in table.items():
        if key not in hints:
            raise ConfigError(f"{source}: unknown key {name}.{key} (known: {', '.join(hints)})")
        want = hints[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(f"{source}: {name}.{key} must be {want.__name__}, got {type(value).__name__} "
                              f"{value!r}")
        if (name, key) in _CHOICES and value not in _CHOICES[(name, key)]:
            raise ConfigError(f"{source}: {name}.{key} = {value!r}; expected one of {_CHOICES[(name, key)]}")
        if (name, key) in _MIN and value < _MIN[(name, key)]:
            raise ConfigError(f"{source}: {name}.{key} = {value!r}; must be >= {_MIN[(name, key)]}")
        if (name, key) in _MAX and value > _MAX[(name, key)]:
            raise ConfigError(f"{source}: {name}.{key} = {value!r}; must be <= {_MAX[(name, key)]}")
        values[key] = value
    return cls(**values)

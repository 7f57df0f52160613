"""The actors' messages: one frozen dataclass per kind, the registry of kinds, and how a message rides a channel.

Owns what crosses a channel between actors: each kind's fields, with the dtype and rank of every array (the shape in
a comment beside it); the encoding (the kind and the plain fields in the msgpack header, the arrays in the channel's
payload slot, copied there once by `Channel.send` as before); and the check that what arrived is exactly one known
message. Never sends on its own account, never copies a received array (a decoded message's arrays are views into
the slot, valid until the channel's `Message` is released; `copied` takes them out), and never decides what a
message means: the actors do.

The flow, channel by channel (sender -> receiver: kinds, in the order they come):
    ingest -> cache owner (lines)          Line (with its tokens) per record, then Eof
    front -> cache owner (asks)            Question, Cancel
    cache owner -> target (to_target)      Prefill, Verify, Constrain (before an answer, when its rule changes);
                                           Close at the end
    target -> cache owner (from_target)    Ready first; Scored, Picked (after a Prefill), Verdict (after a Verify);
                                           Closed last
    cache owner -> draft (to_draft)        Observe, Rollback; Restart, Commit and Halt during a generation; Close
    draft -> cache owner (from_draft)      Proposal; Closed last
    cache owner -> output (events)         Start first; Line (as prefilled, annotated, without tokens), Assessment,
                                           Checkpoint, Recovery and Restarted (after a restart), Capacity (once, when
                                           the stream outruns the target), AnswerDelta, Answer, Status, StreamEnd
                                           (serving); Eof last
The cache owner's end of the four model links is `DeferredEngine` (pipeline/decode/deferred.py), which the speed
bench's `pipelined` system runs in its own process; the front (pipeline/serve/front.py) lives in the output actor
(at a site, in the site actor, and these messages cross between nodes on its links: pipeline/serve/site_link.py).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from pipeline.channel import Channel, Message

message = dataclass(frozen=True, kw_only=True, eq=False)    # eq=False: an array field has no single truth value


class MessageError(ValueError):
    """What arrived is not one of the messages below: an unknown kind, or a field missing, unknown or of the wrong
    type (an array of the wrong dtype or rank); the error names the kind and the field."""


def array(dtype, ndim: int, optional: bool = False):
    """A field that travels in the payload slot; `decode` checks its dtype and rank. An optional one may be None
    (then it is not sent)."""
    meta = {"dtype": np.dtype(dtype), "ndim": ndim}
    return field(default=None, metadata=meta) if optional else field(metadata=meta)


# ---- cache owner -> target -----------------------------------------------------------------------------------------

@message
class Prefill:
    """Run a chunk of committed text and store every row's K/V; answer Scored (`score`), then Picked (`pick`)."""
    kind: ClassVar[str] = "prefill"
    pick: bool                                  # answer the token after the chunk
    score: bool                                 # answer each token's NLL (Scored)
    ring_from: int                              # the first ring slot of the pass's pool view (RingIndex.pool_view)
    rule_state: str | None = None               # pick: the answer's rule state (pipeline/decode/rules.py)
    ids: np.ndarray = array(np.int64, 1)        # [T] tokens
    pos: np.ndarray = array(np.int64, 1)        # [T] their positions
    mask: np.ndarray = array(np.float32, 2)     # [T, P+m+T] additive mask (kernels/ring.py)
    recent: np.ndarray = array(np.int64, 1)     # [m] positions of the chunk's recent section (committed)
    slots: np.ndarray = array(np.int64, 1)      # [T] pool slots the rows' K/V go to


@message
class Verify:
    """Judge a block (the pending token, then the proposals); store the accepted rows' K/V; answer Verdict."""
    kind: ClassVar[str] = "verify"
    epoch: int                                  # echoed in the Verdict
    block: int                                  # the block's number within its epoch, echoed
    ring_from: int                              # the first ring slot of the pass's pool view (RingIndex.pool_view)
    rule_state: str | None = None               # the answer's rule state before the pending token; None: no rule
    ids: np.ndarray = array(np.int64, 1)        # [N+1] the pending token, then the proposals
    pos: np.ndarray = array(np.int64, 1)        # [N+1] row positions
    mask: np.ndarray = array(np.float32, 2)     # [N+1, P+m+N+1] additive mask
    parent: np.ndarray = array(np.int64, 1)     # [N] each proposal's parent (-1: the pending token)
    recent: np.ndarray = array(np.int64, 1)     # [m] positions of the block's recent section (committed, < n)
    slots: np.ndarray = array(np.int64, 1)      # [depth+1] pool slots of positions n, n+1, ... for accepted rows
    q: np.ndarray | None = array(np.float64, 2, optional=True)   # [N, V] draft distributions; None: deterministic
    path: np.ndarray | None = array(np.int64, 2, optional=True)  # [N+1, depth+1] a tree's root paths; None: a chain


@message
class Constrain:
    """Judge the coming answer against this rule (pipeline/decode/rules.py `rule_from`), or none; no answer."""
    kind: ClassVar[str] = "constrain"
    rule: dict | None                           # a rule's `spec`


@message
class Close:
    """End of the run (also to the draft): answer Closed with this actor's figures, then exit."""
    kind: ClassVar[str] = "close"


# ---- target -> cache owner -----------------------------------------------------------------------------------------

@message
class Ready:
    """The target's first word, once its model is loaded: its batch-invariance verdict and where it runs."""
    kind: ClassVar[str] = "ready"
    exactness: dict                             # pipeline/decode/exactness.py Invariance.as_dict()
    platform: dict                              # models/platform.py facts()


@message
class Scored:
    kind: ClassVar[str] = "scored"
    nll: np.ndarray = array(np.float32, 1)      # [T] -log p of each token of the chunk (NaN: not known)


@message
class Picked:
    kind: ClassVar[str] = "picked"
    next: int                                   # the token after the chunk (argmax, or sampled)


@message
class Verdict:
    kind: ClassVar[str] = "verdict"
    epoch: int
    block: int
    rows: list[int]                             # accepted rows along their path, 0 (the pending token) first
    next: int                                   # the token after them: a correction or the bonus
    t0: float                                   # perf_counter when the target took the block
    t1: float                                   # ... and when it answered
    forward_s: float                            # of which inside the forward pass


@message
class Closed:
    """A model actor's last word (target or draft), after Close."""
    kind: ClassVar[str] = "closed"
    figures: dict                               # pipeline/process.py Figures.snapshot()


# ---- cache owner -> draft ------------------------------------------------------------------------------------------

@message
class Observe:
    kind: ClassVar[str] = "observe"
    ids: np.ndarray = array(np.int64, 1)        # [T] committed tokens


@message
class Rollback:
    kind: ClassVar[str] = "rollback"
    position: int                               # committed text ends here again
    forget: bool                                # also drop what the stream proposer has seen (a new, unrelated text)


@message
class Restart:
    """Draft a generation from the pending token at committed position n, under a new epoch; the tokens of a
    verdict are committed first."""
    kind: ClassVar[str] = "redraft"
    epoch: int
    n: int                                      # committed tokens once `ids` are (checked against the draft's own)
    pending: int
    budget: int                                 # tokens the generation may still emit
    length: int                                 # proposals per block from now on (-1: the draft's configured length)
    ids: np.ndarray = array(np.int64, 1)        # [c] tokens a verdict committed (c = 0 at a generation's start)


@message
class Commit:
    """The tokens a verdict committed when the block's whole trunk was accepted: the draft keeps running ahead if
    they are the block it assumed."""
    kind: ClassVar[str] = "commit"
    epoch: int
    length: int                                 # proposals per block from now on (-1: the draft's configured length)
    ids: np.ndarray = array(np.int64, 1)        # [c] the pending token and the accepted trunk


@message
class Halt:
    """The generation ended: stop drafting it."""
    kind: ClassVar[str] = "halt"


# ---- draft -> cache owner ------------------------------------------------------------------------------------------

@message
class Proposal:
    """One block's proposals after `pending` at position n. n = pending = -1 with no tokens: the draft has no guess
    of its pending token (the owner restarts it at the verdict)."""
    kind: ClassVar[str] = "proposal"
    epoch: int
    block: int
    n: int
    pending: int
    t0: float                                   # perf_counter when drafting began
    t1: float                                   # ... and ended
    tokens: np.ndarray = array(np.int64, 1)     # [N] proposals
    parent: np.ndarray = array(np.int64, 1)     # [N] each one's parent (-1: the pending token)
    q: np.ndarray | None = array(np.float64, 2, optional=True)   # [N, V] distributions drawn from; None: greedy


# ---- ingest -> cache owner -> output -------------------------------------------------------------------------------

@message
class Line:
    """One stream record. From ingest with its tokens; the owner sends it on to output without them, annotated once
    it is in the ring (an annotation never set stays out of the record the output actor writes)."""
    kind: ClassVar[str] = "line"
    offset: int                                 # index of the record in its source
    time: str                                   # as the source wrote it ("" when it has none)
    tags: list[str]
    text: str                                   # the rendered line, newline excluded
    loop: int                                   # the pass over a looped file (0 otherwise)
    n_tokens: int
    seq: int                                    # its row in the archive (serving), else its number in the stream
    drops: dict                                 # what ingest dropped or repaired so far, by reason
    nll_sum: float | None = None                # owner, scoring (replay.score_stream): the line's -log p, summed
    nll_n: int | None = None                    # ... over this many tokens (pipeline/stream/surprise.py)
    surprise: float | None = None               # ... how unusual: z against its template's baseline
    unusual: bool | None = None                 # ... at or over replay.surprise_above (else surprise.UNUSUAL)
    window_from_seq: int | None = None          # owner: seq of the oldest line still in the window
    backlog: int | None = None                  # owner: lines waiting in its backlog
    recovery: bool = False                      # ingest: re-read after a restart to refill the window; it was
                                                # committed before (the owner prefills it, counts and sends it on never)
    ids: np.ndarray | None = array(np.int32, 1, optional=True)   # [n_tokens] tokens, from ingest only


@message
class StreamCounts:
    """What ingest counted over the stream: the fields Eof and StreamEnd share (not a message kind itself)."""
    sent: int
    tokens: int
    dropped_full: int
    invalid_utf8: int
    nul_bytes: int
    oversized: int
    lines: int
    stopped: bool                               # a stop or drain ended the reading


@message
class Eof(StreamCounts):
    """The stream ended (ingest's counts), and at the very end the run's figures (the owner adds its own and the
    model actors')."""
    kind: ClassVar[str] = "eof"
    figures: list[dict]                         # pipeline/process.py Figures.snapshot(), one per actor


# ---- front -> cache owner ------------------------------------------------------------------------------------------

@message
class Question:
    kind: ClassVar[str] = "question"
    id: str                                     # the front's request id (answers and cancels carry it)
    client: str
    max_tokens: int
    deadline_s: float                           # seconds from when the owner takes it
    rule: dict | None = None                    # a rule's spec the answer is written under (pipeline/decode/rules.py
                                                # `rule_from`), ending at a newline: the cited reader's choice
    ids: np.ndarray = array(np.int32, 1)        # [n] the framed question span (pipeline/stream/prompts.py), or a
                                                # scoring prompt when `spans` is given
    spans: np.ndarray = array(np.int32, 1, optional=True)     # [sum] candidates to score after `ids` instead of an
                                                # answer written (pipeline/answer/score.py), their tokens end to end
    span_ends: np.ndarray = array(np.int32, 1, optional=True)  # [k] where each candidate ends in `spans`


@message
class Cancel:
    kind: ClassVar[str] = "cancel"
    id: str


# ---- cache owner -> output -----------------------------------------------------------------------------------------

@message
class Start:
    """The run's first record: the target's exactness verdict, where it runs, and the cache's geometry."""
    kind: ClassVar[str] = "start"
    exactness: dict
    platform: dict
    model: str
    draft: str                                  # the draft's kind
    sink: int
    window: int
    ring: int


@message
class Assessment:
    kind: ClassVar[str] = "assessment"
    trigger: str                                # what made it due (pipeline/stream/triggers.py)
    offsets: list[int]                          # the first and last line in the window
    lines: int                                  # lines prefilled so far
    window_lines: int
    window_tags: list[str]                      # the identifiers of the lines every row of the answer could see
    latency_ms: float
    stats: dict                                 # pipeline/decode/step.py Stats.as_dict()
    checkpoint: dict                            # a Checkpoint's fields: written with it, the assessment is done
    fields: dict | None = None                  # structured form: field name -> its value's tokens
    ids: np.ndarray = array(np.int32, 1)        # [n] the answer's tokens


@message
class Checkpoint:
    """Lines committed since the previous checkpoint. Sent when no pass is in flight to the target, so their tokens
    are in its ring; durable (the line committed) once output has fsynced the journal record. A restart resumes a
    file source after `offset`, re-reading from `window_offset` to refill the window (pipeline/stream/journal.py)."""
    kind: ClassVar[str] = "checkpoint"
    source: str                                 # the source's path or address
    offset: int                                 # the last committed line: its offset, pass over a looped file, seq
    loop: int
    seq: int
    offsets: list[int]                          # every line committed since the previous checkpoint, by offset
    position: int                               # the ring's committed position
    window_offset: int                          # the oldest line still in the window (offset, loop, seq)
    window_loop: int
    window_seq: int
    lines: int                                  # lines committed since the stream began, over every restart
    since: int                                  # lines since the last assessment (pipeline/stream/triggers.py)
    due: str | None = None                      # an assessment due and not yet written: asked again on resume


@message
class Recovery:
    """After a restart, the window was refilled from the source: these lines were prefilled again, not committed."""
    kind: ClassVar[str] = "recovery"
    lines: int
    offsets: list[int]                          # the first and last line re-read
    position: int                               # the ring's committed position after them


@message
class Restarted:
    """The first line committed after a restart (an actor died, or the service was started with resume)."""
    kind: ClassVar[str] = "restart"
    actor: str                                  # the actor that died ("" for a whole-service resume)
    cause: str
    restarts: dict                              # {actor: restarts so far}
    recovery_s: float | None                    # from the death to this line's commit (None: a service resume)
    resumed_after: int | None                   # the checkpoint's offset (None: no checkpoint yet, from the start)


@message
class Capacity:
    """The stream's measured ingest capacity is below the line rate the profile says it must sustain."""
    kind: ClassVar[str] = "capacity"
    line_rate: float                            # replay.line_rate
    lines_per_s: float                          # lines/s the stream goes in at while the target works on it
    tokens_per_s: float
    stream_share: float                         # the stream's share of the target's recent time


@message
class AnswerDelta:
    """Tokens of an operator's answer as a verdict commits them."""
    kind: ClassVar[str] = "answer_delta"
    id: str
    ids: np.ndarray = array(np.int32, 1)        # [n] tokens (stop token included, nothing past it)


@message
class Answer:
    """An operator's request is done: answered (finish, stats), or refused (error)."""
    kind: ClassVar[str] = "answer"
    id: str
    error: str | None = None
    prompt_tokens: int
    finish: str | None = None                   # stop | length | cancelled | deadline
    stats: dict = field(default_factory=dict)
    queued_ms: float | None = None
    queued_blocks: int | None = None            # verify blocks sent after the question came, before its answer
    completion_tokens: int = 0
    scores: np.ndarray = array(np.float64, 1, optional=True)   # [k] a scoring question's: each candidate's sum of
                                                # log p over its tokens and the end, in the order sent


@message
class Status:
    """The owner's figures for the front's gauges and /metrics, about once a second while serving."""
    kind: ClassVar[str] = "status"
    queue: int
    backlog: int
    lines_inbox: int
    kv_pool_bytes: int
    position: int
    lines: int
    stream_tokens: int                          # tokens of the stream lines prefilled so far
    packed_feeds: int                           # feeds that carried several waiting lines at once
    stream_share: float                         # the stream's share of the target's recent time (stream/capacity.py)
    capacity_lines_per_s: float                 # lines/s the stream goes in at while the target works on it (0: not
                                                # measured yet)
    answers: int
    expired: int
    cancelled: int
    preempted: int
    analysing: bool                             # an analysis is being written (sent as it starts and as it ends)
    backlog_max_depth: int
    tokens_per_s: float
    generated: int
    accepted_per_verify: float
    acceptance_rate: float
    verify_calls: int


@message
class StreamEnd(StreamCounts):
    """Serving: the stream ended (ingest's counts); questions are still answered until the operator drains."""
    kind: ClassVar[str] = "stream_end"


KINDS = {cls.kind: cls for cls in (Prefill, Verify, Constrain, Close, Ready, Scored, Picked, Verdict, Closed, Observe,
                                   Rollback, Restart, Commit, Halt, Proposal, Line, Eof, Question, Cancel, Start,
                                   Assessment, Checkpoint, Recovery, Restarted, Capacity, AnswerDelta, Answer, Status,
                                   StreamEnd)}


# ---- encoding ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Layout:
    header: dict        # plain field -> the Python types its value may have (msgpack's; NoneType when optional)
    arrays: dict        # array field -> (dtype, rank)
    unset: frozenset    # fields whose default is None: an array left unsent, a plain one left out of `as_dict`


def _layout(cls) -> _Layout:
    hints = typing.get_type_hints(cls)
    header, arrays, unset = {}, {}, set()
    for f in dataclasses.fields(cls):
        if f.default is None:
            unset.add(f.name)
        if "dtype" in f.metadata:
            arrays[f.name] = (f.metadata["dtype"], f.metadata["ndim"])
            continue
        hint = hints[f.name]
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)    # int | None: int, None
        header[f.name] = tuple(t for option in options for t in _admits(option))
    return _Layout(header, arrays, frozenset(unset))


def _admits(annotation) -> tuple:
    """The types a value of one annotation may arrive as: list[int] -> list (elements are not checked); an int is a
    fine float (a bool is neither: see `decode`)."""
    return (float, int) if annotation is float else (typing.get_origin(annotation) or annotation,)


_LAYOUTS = {cls: _layout(cls) for cls in KINDS.values()}


def send(channel: Channel, msg, timeout: float | None = None) -> int:
    """Put `msg` on `channel`: the kind and the plain fields in the header, the arrays (an unset optional one left
    out) in the payload slot. Returns the channel's seq; blocks and raises as `Channel.send` does."""
    layout = _LAYOUTS[type(msg)]
    header = {"kind": msg.kind}
    for name in layout.header:
        header[name] = getattr(msg, name)
    arrays = {name: value for name in layout.arrays if (value := getattr(msg, name)) is not None}
    return channel.send(header, arrays, timeout=timeout)


def decode(received: Message):
    """The message a channel delivered, as its dataclass; its arrays are the slot's views, valid until `received`
    is released. MessageError unless the header and arrays are exactly the fields of one known kind."""
    header, arrays = received.header, received.arrays
    kind = header.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown message kind {kind!r} (known: {', '.join(KINDS)})")
    layout, values = _LAYOUTS[cls], {}
    for name in [*header, *arrays]:
        if name != "kind" and name not in layout.header and name not in layout.arrays:
            raise MessageError(f"{kind!r} has unknown field {name!r}")
    for name, accepted in layout.header.items():
        if name not in header:
            raise MessageError(f"{kind!r} lacks field {name!r}")
        value = header[name]
        if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
            raise MessageError(f"{kind!r} field {name!r}: expected {_names(accepted)}, got {_names([type(value)])}")
        values[name] = value
    for name, (dtype, ndim) in layout.arrays.items():
        value = arrays.get(name)
        if value is None:
            if name not in layout.unset:
                raise MessageError(f"{kind!r} lacks field {name!r}")
            continue
        if value.dtype != dtype or value.ndim != ndim:
            raise MessageError(f"{kind!r} field {name!r}: expected a {dtype} array of rank {ndim}, got {value.dtype} "
                               f"of rank {value.ndim}")
        values[name] = value
    return cls(**values)


def _names(types_: tuple) -> str:
    return " or ".join("None" if t is type(None) else t.__name__ for t in types_)


def copied(msg):
    """`msg` with its arrays copied out of the channel's slot, so that it outlives the received Message."""
    arrays = {name: np.array(value) for name in _LAYOUTS[type(msg)].arrays
              if (value := getattr(msg, name)) is not None}
    return dataclasses.replace(msg, **arrays) if arrays else msg


def as_dict(msg) -> dict:
    """The plain fields as the header carries them, kind first (arrays are not part of it); an optional field still
    None is left out, as if never set. The output actor's journal and PUB records start from this."""
    layout = _LAYOUTS[type(msg)]
    out = {"kind": msg.kind}
    for name in layout.header:
        value = getattr(msg, name)
        if value is not None or name not in layout.unset:
            out[name] = value
    return out

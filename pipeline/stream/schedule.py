"""The cache owner's schedule: what runs next on the target, decided from a snapshot of its state, with no I/O.

Owns `next_work` (state in, `Work` out) and `Turn`, the snapshot the cache owner (actors/cache_owner.py) takes at
each turn of its loop. Highest first: operator questions (fair across operators, each with a deadline: pipeline/serve/
answers.py), then a due analysis, then the stream's next line; but while lines wait and the stream has had less than
`serve.stream_share` of the target's recent time (pipeline/stream/capacity.py), the stream goes first ("owed").
Serving, a periodic ("every N lines") analysis waits while stream lines wait, so under load analyses thin out rather
than ingestion falling behind (a matching alarm's runs), and nothing is sent while the target still runs a line pass,
so a question never queues behind a stack of line passes. Lines read while the model generated (the backlog) go in
before new ones; the stream's end closes the run once a drain is asked (serving) or at once (not serving). Never
reads a channel, the clock or the session: the owner does, and acts on the decision.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Work(Enum):
    ANSWER = "answer"               # answer the next question in the queue
    ASSESS = "assess"               # write the due analysis
    WAIT_TARGET = "wait_target"     # serving: the target still runs a line pass; wait for questions only
    BACKLOG = "backlog"             # feed the oldest line read while the model generated
    CLOSE = "close"                 # the stream ended and the run may end
    WAIT_DRAIN = "wait_drain"       # the stream ended; serving goes on answering until the drain
    LISTEN = "listen"               # wait briefly for a line (taken if one comes; else the stream is quiet)


@dataclass(frozen=True)
class Turn:
    serving: bool                   # questions come in (`serve`)
    question_waits: bool            # the fair queue holds a question
    lines_wait: bool                # the backlog or the lines channel holds a line
    backlog: bool                   # ... the backlog does
    stream_share: float             # the stream's share of the target's recent time (StreamClock.share)
    share_min: float                # serve.stream_share (0: questions always first)
    due: str                        # the session's due analysis: "every", "pattern", "idle", ... or ""
    target_busy: bool               # a line pass sent to the target is not answered yet
    ended: bool                     # the stream's Eof was taken
    drain: bool                     # the run may end when the stream has: not serving, or the drain was asked


def owed(t: Turn) -> bool:
    """Serving: lines wait and the stream had less than its share of the target's recent time."""
    return t.serving and t.share_min > 0 and t.lines_wait and t.stream_share < t.share_min


def next_work(t: Turn) -> Work:
    if t.question_waits and not owed(t):
        return Work.ANSWER
    if t.due and not owed(t) and not (t.serving and t.due == "every" and t.lines_wait):
        return Work.ASSESS
    if t.serving and t.target_busy:
        return Work.WAIT_TARGET
    if t.backlog:
        return Work.BACKLOG
    if t.ended:
        return Work.CLOSE if t.drain else Work.WAIT_DRAIN
    return Work.LISTEN

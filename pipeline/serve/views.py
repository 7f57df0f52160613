"""What the console, /healthz and /metrics show of each stream, kept from its cache owner's events.

Owns `StreamView`: one stream as the front sees it (its owner's question channel, its archive, its node at a site)
and what is shown of it: its tail, analyses, latest status, start record (the exactness verdict), end, drops and the
surprise histogram; `take` folds an owner's event into it and says what the console's feed gets; `gauges` and
`health` are its part of the console's gauges and of /healthz. Also the consoles' live feed (`Feed`) and the actors'
resident memory (`resident_bytes`). Never sees a request or an answer (pipeline/serve/front.py owns those) and never
sends anything.
"""
from __future__ import annotations

import json
import os
import queue
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Assessment, Line, Start, Status, StreamEnd, as_dict
from pipeline.process import proc_status

MAX_SUBSCRIBERS = 32        # consoles following /v1/events at once
FEED_QUEUED = 2000          # events held for one console; a slower one loses the rest (counted)
SURPRISE_BUCKETS = np.array([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0])   # /metrics histogram bounds (z)


@dataclass
class StreamView:
    """One stream as the front sees it: its owner's question channel, its archive, and what the console and /metrics
    show of it (its tail, analyses, latest status, drops, surprise histogram)."""
    name: str                                         # "" when the pipeline has one stream
    asks: object                                      # the channel to its cache owner (at a site: its node's link)
    archive_path: str | None
    node: str | None = None                           # at a site (streams on several nodes): its node's name
    window_from_seq: int | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=200))    # recent line events, for a late console
    analyses: deque = field(default_factory=lambda: deque(maxlen=20))
    status: dict = field(default_factory=dict)
    start: dict = field(default_factory=dict)         # its owner's start record: exactness verdict, platform
    drops: dict = field(default_factory=dict)
    stream_end: dict | None = None
    surprise: np.ndarray = field(default_factory=lambda: np.zeros(len(SURPRISE_BUCKETS) + 1, np.int64))
    surprise_sum: float = 0.0                          # scored lines by surprise bucket (+Inf last), and their sum

    def labels(self) -> dict:
        """The /metrics labels of this stream's series (none with one stream; its node too at a site)."""
        return {**({"stream": self.name} if self.name else {}),
                **({"node": self.node or "(any)"} if self.node is not None else {})}

    def take(self, event, record: dict | None) -> tuple[str, dict] | None:
        """Fold one of its owner's events into the view (`record`: the journal record the output actor made of a
        Start, Line or Assessment); returns (kind, data) for the console's feed, or None."""
        match event:
            case Line():
                self.window_from_seq = event.window_from_seq
                self.drops = event.drops
                if event.surprise is not None:
                    self.surprise[np.searchsorted(SURPRISE_BUCKETS, event.surprise)] += 1
                    self.surprise_sum += event.surprise
                self.tail.append(_line_view(record))
                return "line", _line_view(record)
            case Assessment():
                shown = {k: record[k] for k in ("stream", "trigger", "lines", "offsets", "text", "latency_ms", "t")
                         if k in record}
                self.analyses.append(shown)
                return "assessment", shown
            case Start():
                self.start = record
            case Status():
                self.status = as_dict(event)
            case StreamEnd():
                self.stream_end = as_dict(event)
                return "stream_end", {**self.labels(), "sent": event.sent}
        return None

    def gauges(self) -> dict:
        """This stream's part of the console's gauges (from its owner's latest status)."""
        st = self.status
        return {"tokens_per_s": st.get("tokens_per_s", 0.0), "acceptance_rate": st.get("acceptance_rate", 0.0),
                "accepted_per_verify": st.get("accepted_per_verify", 0.0), "queue": st.get("queue", 0),
                "backlog": st.get("backlog", 0), "lines": st.get("lines", 0), "answers": st.get("answers", 0),
                "kv_pool_bytes": st.get("kv_pool_bytes", 0), "position": st.get("position", 0),
                "analysing": st.get("analysing", False), "drops": self.drops}

    def health(self) -> dict:
        """This stream's part of /healthz: its position and whether it ended."""
        return {"stream_ended": self.stream_end is not None, "position": self.status.get("position", 0),
                "lines": self.status.get("lines", 0)}


def _line_view(event: dict) -> dict:
    keys = ("seq", "offset", "time", "text", "backlog", "surprise", "unusual")
    return {**({"stream": event["stream"]} if "stream" in event else {}), **{k: event.get(k) for k in keys}}


class Feed:
    """The consoles following /v1/events: one bounded queue of (kind, data) each, for line, assessment and status
    events; a console too slow to keep up loses events, counted in `counts["console_events_dropped"]`."""

    def __init__(self, counts: Counter):
        self.counts = counts
        self.queues: list[queue.Queue] = []
        self._lock = threading.Lock()

    def subscribe(self) -> queue.Queue | None:
        """A new console's queue; None past MAX_SUBSCRIBERS."""
        q: queue.Queue = queue.Queue(maxsize=FEED_QUEUED)
        with self._lock:
            if len(self.queues) >= MAX_SUBSCRIBERS:
                return None
            self.queues.append(q)
        return q

    def unsubscribe(self, q: queue.Queue) -> None:
        with self._lock:
            if q in self.queues:
                self.queues.remove(q)

    def publish(self, kind: str, data: dict) -> None:
        with self._lock:
            for q in self.queues:
                try:
                    q.put_nowait((kind, data))
                except queue.Full:
                    self.counts["console_events_dropped"] += 1


def resident_bytes(pids_files: list[str]) -> dict[str, int]:
    """Resident memory of each actor of this pipeline on this node (from the launcher's pid lists; this process
    alone, as "output", when there are none)."""
    pids = {}
    for path in pids_files:
        try:
            with open(path) as f:
                pids.update(json.load(f))
        except (OSError, TypeError, ValueError):
            continue
    pids = pids or {"output": os.getpid()}
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = int(proc_status(pid)["vmrss_mb"] * 2**20)
        except (OSError, KeyError):                   # gone, or on another node
            continue
    return out

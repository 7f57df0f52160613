"""The site's wire: one front (actors/site.py) for streams whose pipelines run on several nodes (pipeline/launch.py
groups), and each node's output actor at the other end.

Owns the two zmq links and their framing. Each node group's output actor connects to both; the site binds them:
    events  group PUSH -> site PULL      "hello" (the group's start id, its restarts: at start and every few seconds,
                                         so a site started again learns them), "event": every event of its streams
                                         (pipeline/messages.py), with the output actor's record
    asks    site ROUTER -> group DEALER  "ask": a Question or Cancel for one of the group's streams (the group puts it
                                         on that stream's owner channel); "record": an answer's finished record, for
                                         the stream's journal
A message is the frames [token, kind, group, stream, msgpack([header, arrays' dtype and shape, record]), *arrays]:
the header and arrays exactly as a channel carries them, so `messages.send` writes one and `messages.decode` checks
one. The run's token (random, handed to both ends by the launcher) must lead every message; anything else is dropped
and counted, as is a message that cannot be parsed. Never decides what a message means: the site actor and the
output actor do.

A question for a group that is not connected (down, restarting, not started yet) fails at once: the ROUTER is
mandatory-routing, so `send` raises TimeoutError, which the front answers with 503. An event the site cannot take
(it is restarting and the group's queue is full) is dropped and counted at the group.

Threads: the site's ROUTER is written by the HTTP and zmq request threads and the site's event loop, under one lock;
the PULL is read by the event loop alone. A group's two sockets live in its output actor's one thread.
"""
from __future__ import annotations

import hmac
import threading
from collections import Counter
from dataclasses import dataclass

import msgpack
import numpy as np
import zmq

from pipeline import messages

MAX_MESSAGE_BYTES = 4 << 20      # larger than any event or question (a slot's payload is at most ~1 MiB): a peer
                                 # sending more is cut off by zmq
EVENTS_QUEUED = 10_000           # a group's events held while the site is away (restarting); more are dropped


@dataclass(frozen=True)
class Frames:
    """A message as it arrived: `header` and `arrays` are what `messages.decode` reads (as from a channel)."""
    kind: str
    group: str
    stream: str
    header: dict
    arrays: dict
    record: dict | None


class _Sender:
    """What `messages.send` writes to: the channel's `send(header, arrays, timeout)` over one of these links."""

    def __init__(self, write, kind: str, group: str, stream: str, record: dict | None = None):
        self._write, self._lead, self._record = write, (kind, group, stream), record

    def send(self, header: dict, arrays: dict, timeout: float | None = None) -> int:
        self._write(pack(*self._lead, header, arrays, self._record))
        return 0


def pack(kind: str, group: str, stream: str, header: dict, arrays: dict, record: dict | None) -> list:
    """The frames after the token."""
    descr = [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]
    return [kind.encode(), group.encode(), stream.encode(),
            msgpack.packb([header, descr, record], use_bin_type=True),
            *(np.ascontiguousarray(a).data for a in arrays.values())]


def unpack(frames: list) -> Frames:
    """The frames after the token, as sent by `pack`; ValueError when they are not that."""
    if len(frames) < 4:
        raise ValueError(f"{len(frames)} frames, need at least 4")
    kind, group, stream = (bytes(f).decode() for f in frames[:3])
    try:
        header, descr, record = msgpack.unpackb(frames[3], raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"unreadable header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(descr, list) or len(descr) != len(frames) - 4 or \
            not (record is None or isinstance(record, dict)):
        raise ValueError("header, arrays and record do not match the frames")
    arrays = {}
    for entry, buf in zip(descr, frames[4:]):
        name, dtype, shape = entry
        dtype = np.dtype(dtype)
        if dtype.kind not in "biufc" or np.prod(shape, dtype=np.int64) * dtype.itemsize != len(buf):
            raise ValueError(f"array {name!r}: {len(buf)} bytes are not {dtype} of shape {shape}")
        arrays[name] = np.frombuffer(buf, dtype).reshape(shape)
    return Frames(kind, group, stream, header, arrays, record)


class SiteHub:
    """The site's end: binds both links (`endpoints` says where they are, ports resolved)."""

    def __init__(self, events: str, asks: str, token: bytes):
        ctx = zmq.Context.instance()
        self.token = token
        self._pull = ctx.socket(zmq.PULL)
        self._router = ctx.socket(zmq.ROUTER)
        for sock in (self._pull, self._router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)      # a question for a group not connected fails at once
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)       # a group started again takes its identity back
        self._lock = threading.Lock()
        try:
            self._pull.bind(events)
            self._router.bind(asks)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"the site cannot bind {events} and {asks}: {exc}") from None
        self.endpoints = {"events": self._pull.getsockopt_string(zmq.LAST_ENDPOINT),
                          "asks": self._router.getsockopt_string(zmq.LAST_ENDPOINT)}
        self.dropped: Counter = Counter()                     # messages refused, by why

    def close(self) -> None:
        self._pull.close(linger=0)
        self._router.close(linger=0)

    def recv(self, timeout: float) -> Frames | None:
        """The next message from a group within `timeout` s (None: none, or one dropped and counted)."""
        if not self._pull.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        frames = self._pull.recv_multipart(copy=False)
        if not frames or not hmac.compare_digest(bytes(frames[0]), self.token):
            self.dropped["bad_token"] += 1
            return None
        try:
            return unpack([f.buffer for f in frames[1:]])
        except (ValueError, UnicodeDecodeError) as exc:
            self.dropped[f"malformed: {exc}"[:80]] += 1
            return None

    def asks(self, group: str, stream: str) -> _Sender:
        """Where the front sends `stream`'s questions and cancels (pipeline/serve/front.py StreamView.asks)."""
        return _Sender(lambda frames: self._to(group, stream, frames), "ask", group, stream)

    def send_record(self, group: str, stream: str, record: dict) -> None:
        """An answer's finished record back to the group that journals the stream (dropped, counted, when the group
        is gone: its new start journals nothing of an answer it never gave)."""
        try:
            self._to(group, stream, pack("record", group, stream, {}, {}, record))
        except TimeoutError:
            self.dropped["record_group_gone"] += 1

    def _to(self, group: str, stream: str, frames: list) -> None:
        with self._lock:
            try:
                self._router.send_multipart([group.encode(), self.token, *frames], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:          # EHOSTUNREACH: not connected; EAGAIN: its queue is full
                raise TimeoutError(f"stream {stream}'s node ({group}) is not connected to the site "
                                   f"({exc.strerror}); retry shortly") from None


class NodeLink:
    """A node group's end, in its output actor: relays its streams' events to the site, takes questions from it.
    `site`: {"events", "asks": the site's endpoints, "token", "group": the group's id}."""

    def __init__(self, site: dict):
        ctx = zmq.Context.instance()
        self.token, self.group = site["token"], site["group"]
        self._push = ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 2000)               # the last events (the Eof) reach a live site
        self._push.setsockopt(zmq.SNDHWM, EVENTS_QUEUED)
        self._push.connect(site["events"])
        self._dealer = ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._dealer.setsockopt(zmq.ROUTING_ID, self.group.encode())
        self._dealer.connect(site["asks"])
        self.dropped: Counter = Counter()

    @property
    def socket(self) -> zmq.Socket:
        """What the output actor's Selector also waits on (pipeline/channel.py)."""
        return self._dealer

    def close(self) -> None:
        self._push.close()
        self._dealer.close()

    def hello(self, start: str, restarts: dict, starts: dict | None = None, node: str | None = None) -> None:
        """Who this group is: its start id, its supervisor's restarts, each stream's Start record so far (a site
        started again learns them here, not from the events, which it missed), and the node it runs on (a Ray
        launcher's: its label; None: as configured)."""
        self._write(pack("hello", self.group, "", {}, {}, {"start": start, "restarts": restarts,
                                                           "starts": starts or {}, "node": node}))

    def relay(self, stream: str, event, record: dict | None = None) -> None:
        """One event of `stream` (pipeline/messages.py), with the record the output actor made of it (if any)."""
        messages.send(_Sender(self._write, "event", self.group, stream, record), event)

    def take(self) -> list[Frames]:
        """What the site sent since the last call (never blocks); junk is dropped and counted."""
        out = []
        while self._dealer.poll(0, zmq.POLLIN):
            frames = self._dealer.recv_multipart(copy=False)
            if not frames or not hmac.compare_digest(bytes(frames[0]), self.token):
                self.dropped["bad_token"] += 1
                continue
            try:
                out.append(unpack([f.buffer for f in frames[1:]]))
            except (ValueError, UnicodeDecodeError) as exc:
                self.dropped[f"malformed: {exc}"[:80]] += 1
        return out

    def _write(self, frames: list) -> None:
        try:
            self._push.send_multipart([self.token, *frames], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped["site_away"] += 1

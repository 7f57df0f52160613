"""The site's wire: one front (actors/site.py) for streams whose pipelines run on several nodes (pipeline/launch/
plan.py groups), and each node's output actor at the other end.

Owns the two zmq links, their framing and their authentication. Each node group's output actor connects to both;
the site binds them:
    events  group PUSH -> site PULL      "hello" (the group's start id, its restarts: at start and every few seconds,
                                         so a site started again learns them), "event": every event of its streams
                                         (pipeline/messages.py), with the output actor's record
    asks    site ROUTER -> group DEALER  "ask": a Question or Cancel for one of the group's streams (the group puts it
                                         on that stream's owner channel); "record": an answer's finished record, for
                                         the stream's journal. Nothing is read from a DEALER: what arrives is dropped
A message is the frames [mac, envelope, kind, group, stream, msgpack([header, arrays' dtype and shape, record]),
*arrays]: the header and arrays exactly as a channel carries them, so `messages.send` writes one and
`messages.decode` checks one. `mac` is HMAC-SHA256, under the run's key, over the direction and every later frame;
the key (random per run, made by the launcher and handed to both ends as an actor argument) never crosses the wire.
The envelope says which start of the group the message belongs to and carries a counter, so a message captured on
the wire and replayed (from another run, an earlier start, or earlier in this one) is refused. Up, it also names the
DEALER's routing id: random per start of the group, so nobody can guess it, and the site sends a group's questions
only to the id its latest verified message named (a stranger's DEALER, whatever id it claims, receives nothing; a
group started again has a new id, so no handover is needed and none is allowed). Anything unverified, stale or
unreadable is dropped and counted, by a fixed reason. Never decides what a message means: the site actor and the
output actor do.

A question for a group that is not connected (down, restarting, not started yet, or not yet heard from by a site
started again) fails at once: the ROUTER is mandatory-routing, so `send` raises TimeoutError, which the front answers
with 503. An event the site cannot take (it is restarting and the group's queue is full) is dropped and counted at
the group.

Threads: the site's ROUTER is written by the HTTP and zmq request threads and the site's event loop, under one lock;
the PULL (and the ROUTER's inbound junk) is read by the event loop alone. A group's two sockets live in its output
actor's one thread.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import Counter
from dataclasses import dataclass

import msgpack
import numpy as np
import zmq

from pipeline import messages

MAX_MESSAGE_BYTES = 4 << 20      # larger than any event or question (a slot's payload is at most ~1 MiB): a peer
                                 # sending more is cut off by zmq
MAX_FRAMES = 64                  # a message's frames: 6 and one per array (an event has at most a few)
EVENTS_QUEUED = 10_000           # a group's events held while the site is away (restarting); more are dropped
UP, DOWN = b"ringspec site link up", b"ringspec site link down"    # a message MAC'd one way is refused the other


@dataclass(frozen=True)
class Frames:
    """A message as it arrived, verified: `header` and `arrays` are what `messages.decode` reads (as from a
    channel); `start` is the group's start id it belongs to."""
    kind: str
    group: str
    stream: str
    header: dict
    arrays: dict
    record: dict | None
    start: str = ""


class _Sender:
    """What `messages.send` writes to: the channel's `send(header, arrays, timeout)` over one of these links."""

    def __init__(self, write, kind: str, group: str, stream: str, record: dict | None = None):
        self._write, self._lead, self._record = write, (kind, group, stream), record

    def send(self, header: dict, arrays: dict, timeout: float | None = None) -> int:
        self._write(pack(*self._lead, header, arrays, self._record))
        return 0


def pack(kind: str, group: str, stream: str, header: dict, arrays: dict, record: dict | None) -> list:
    """The frames after the MAC and the envelope."""
    descr = [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]
    return [kind.encode(), group.encode(), stream.encode(),
            msgpack.packb([header, descr, record], use_bin_type=True),
            *(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data for a in arrays.values())]


def unpack(frames: list, start: str = "") -> Frames:
    """The frames after the MAC and the envelope, as sent by `pack`; ValueError when they are not that (the caller
    still catches everything: a peer's bytes must never end the reader)."""
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
    return Frames(kind, group, stream, header, arrays, record, start)


def mac(key: bytes, direction: bytes, frames: list) -> bytes:
    """HMAC-SHA256 over the direction and each frame, each length-prefixed (frames cannot be split or joined)."""
    h = hmac.new(key, direction, hashlib.sha256)
    for frame in frames:
        view = memoryview(frame)
        h.update(view.nbytes.to_bytes(8, "big"))
        h.update(view)
    return h.digest()


def seal(key: bytes, direction: bytes, envelope: list, frames: list) -> list:
    """A message ready to send: [mac, envelope, *frames]."""
    body = [msgpack.packb(envelope), *frames]
    return [mac(key, direction, body), *body]


def opened(key: bytes, direction: bytes, frames: list, dropped: Counter) -> tuple[list, list] | None:
    """(envelope, the frames after it) of a message whose MAC is right, else None (counted in `dropped`)."""
    if not 6 <= len(frames) <= MAX_FRAMES:
        dropped["frames"] += 1
        return None
    body = [f.buffer for f in frames[1:]]
    if not hmac.compare_digest(bytes(frames[0]), mac(key, direction, body)):
        dropped["bad_mac"] += 1
        return None
    try:
        envelope = msgpack.unpackb(body[0], raw=False)
        if not (isinstance(envelope, list) and len(envelope) == 3 and all(isinstance(e, str) for e in envelope[:2])
                and isinstance(envelope[2], int)):
            raise ValueError("bad envelope")
    except Exception:                 # noqa: BLE001 -- a key holder's bug, never the reader's end
        dropped["malformed: envelope"] += 1
        return None
    return envelope, body[1:]


class SiteHub:
    """The site's end: binds both links (`endpoints` says where they are, ports resolved)."""

    def __init__(self, events: str, asks: str, key: bytes):
        ctx = zmq.Context.instance()
        self._key = key
        self._pull = ctx.socket(zmq.PULL)
        self._router = ctx.socket(zmq.ROUTER)
        for sock in (self._pull, self._router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)      # a question for a group not connected fails at once
        # No ROUTER_HANDOVER: a second peer claiming a connected id is refused, and a group started again comes back
        # under its new start's new id (its verified messages name it), never by taking an old one over.
        self._lock = threading.Lock()
        try:
            self._pull.bind(events)
            self._router.bind(asks)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"the site cannot bind {events} and {asks}: {exc}") from None
        self.endpoints = {"events": self._pull.getsockopt_string(zmq.LAST_ENDPOINT),
                          "asks": self._router.getsockopt_string(zmq.LAST_ENDPOINT)}
        self._poller = zmq.Poller()
        self._poller.register(self._pull, zmq.POLLIN)
        self._poller.register(self._router, zmq.POLLIN)
        self._id = secrets.token_hex(8)                       # this start of the site: a group orders our counter by it
        self._sent = 0
        self._routes: dict[str, tuple[str, bytes]] = {}       # group -> (its start, its DEALER's id): verified only
        self._heard: dict[str, int] = {}                      # group -> its current start's last counter
        self._retired: dict[str, set] = {}                    # group -> its earlier starts: a message of one is stale
        self.dropped: Counter = Counter()                     # messages refused, by why (fixed reasons: bounded)

    def close(self) -> None:
        self._pull.close(linger=0)
        self._router.close(linger=0)

    def recv(self, timeout: float) -> Frames | None:
        """The next verified message from a group within `timeout` s (None: none, or one dropped and counted)."""
        ready = dict(self._poller.poll(int(timeout * 1000)))
        if self._router in ready:                             # groups never send here: a stranger's, dropped
            self._router.recv_multipart(copy=False)
            self.dropped["on_the_asks_link"] += 1
        if self._pull not in ready:
            return None
        got = opened(self._key, UP, self._pull.recv_multipart(copy=False), self.dropped)
        if got is None:
            return None
        (start, dealer, count), frames = got
        try:
            msg = unpack(frames, start)
        except Exception as exc:      # noqa: BLE001 -- whatever a message's bytes make decoding raise, never our end
            self.dropped[f"malformed: {type(exc).__name__}"] += 1
            return None
        group = msg.group
        if start in self._retired.get(group, ()):
            self.dropped["stale_start"] += 1
            return None
        current = self._routes.get(group)
        if current is not None and current[0] == start and count <= self._heard[group]:
            self.dropped["replayed"] += 1
            return None
        if current is not None and current[0] != start:
            self._retired.setdefault(group, set()).add(current[0])
        self._heard[group] = count
        with self._lock:
            self._routes[group] = (start, dealer.encode())
        return msg

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
            route = self._routes.get(group)
            try:
                if route is None:                             # not heard from (yet): nobody to send it to
                    raise zmq.ZMQError(zmq.EHOSTUNREACH)
                self._sent += 1
                self._router.send_multipart([route[1], *seal(self._key, DOWN, [route[0], self._id, self._sent],
                                                             frames)], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:          # EHOSTUNREACH: not connected; EAGAIN: its queue is full
                raise TimeoutError(f"stream {stream}'s node ({group}) is not connected to the site "
                                   f"({exc.strerror}); retry shortly") from None


class NodeLink:
    """A node group's end, in its output actor: relays its streams' events to the site, takes questions from it.
    `site`: {"events", "asks": the site's endpoints, "key": the run's, "group": the group's name, "start": this
    start's id}."""

    def __init__(self, site: dict):
        ctx = zmq.Context.instance()
        self._key, self.group, self.start = site["key"], site["group"], site["start"]
        self._id = secrets.token_hex(16)                      # the DEALER's routing id: nobody else can claim it
        self._sent, self._site = 0, ("", 0)                   # our counter; the site's start and its last counter
        self._push = ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 2000)               # the last events (the Eof) reach a live site
        self._push.setsockopt(zmq.SNDHWM, EVENTS_QUEUED)
        self._push.connect(site["events"])
        self._dealer = ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._dealer.setsockopt(zmq.ROUTING_ID, self._id.encode())
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
        """What the site sent since the last call (never blocks); anything unverified, stale or unreadable is
        dropped and counted."""
        out = []
        while self._dealer.poll(0, zmq.POLLIN):
            got = opened(self._key, DOWN, self._dealer.recv_multipart(copy=False), self.dropped)
            if got is None:
                continue
            (start, site, count), frames = got
            if start != self.start:                           # meant for another start of this group
                self.dropped["stale_start"] += 1
                continue
            if site == self._site[0] and count <= self._site[1]:
                self.dropped["replayed"] += 1
                continue
            self._site = (site, count)
            try:
                out.append(unpack(frames, start))
            except Exception as exc:  # noqa: BLE001 -- whatever a message's bytes make decoding raise
                self.dropped[f"malformed: {type(exc).__name__}"] += 1
        return out

    def _write(self, frames: list) -> None:
        self._sent += 1
        try:
            self._push.send_multipart(seal(self._key, UP, [self.start, self._id, self._sent], frames),
                                      flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped["site_away"] += 1

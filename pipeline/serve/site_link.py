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

Starts are ordered, both ways, by counters the launcher keeps for the whole run (the key is the run's, so only the
order within a run matters): a group's start is its place in its supervisor's count, the sum of its restarts so far
(pipeline/launch/supervise.py counts one per start; its hello states them), and the site's is the launcher's count
of the site's restarts (pipeline/launch/site_actor.py). Both ride in the MAC'd envelope: up [start, its order, DEALER id,
counter], down [the group's start, the site's order, counter]. The site takes a message of a start other than the
group's live one only when its order is higher (a captured hello of an earlier start, replayed after the site was
started again, retires nothing: before, any other start retired the live one); a group takes a site's message only
when the site's order is at least the highest it has seen, and within one site start only a higher counter (before,
any site id other than the last one was taken, so two site starts' messages alternated replay without end). A site
started again accepts the first message of whichever start of a group reaches it; the group's live start's next one
(an event, or its hello every few seconds) retires an earlier one for good.

Bounded before any work. The links run over CurveZMQ (libzmq's CURVE mechanism), the site the server: both ends
derive the keypairs from the run's key (`curve_keys`), so a peer without the key fails the handshake and never gets
a frame queued (a receive high-water mark counts whole messages, so a peer sending one message of endless MORE
frames would otherwise fill the site's memory: bench/flood.py measured 7 GB in 8 s); each refused handshake is
counted (`dropped["refused: handshake"]`). Behind it, for a key holder's bugs: a frame over MAX_FRAME_BYTES cuts its
peer off (zmq), each peer's queue is bounded in messages (the high-water marks below: a group's real messages are
a few KiB, so its queue at the site holds well under 64 MB), and a message's frame count, the MAC's length and the
envelope are checked before its MAC is computed. MAX_FRAME_BYTES is the protocol's largest frame
with room: the msgpack [header, descr, record] frame, at most a channel header (16 KiB, pipeline/topology.py's
events channel) and a record (an answer's: the operator's question, at most serve.max_body_bytes, 64 KiB by
default, and its text; a line's: 4 KiB of text and its fields; a hello's: its streams' Start records, a few KiB
each), ~100 KiB at the defaults; an array frame is at most a slot's payload (events 64 KiB; asks
4 x serve.max_prompt_tokens + 4 KiB). A sender never sends a frame over it: the message is dropped and counted
(`too_large`) where it was made.

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
from zmq.utils import z85

from pipeline import messages

MAX_FRAME_BYTES = 512 << 10     # the protocol's largest frame (~100 KiB at the defaults, see above) with room: a
                                # peer sending a larger one is cut off by zmq (ZMQ_MAXMSGSIZE), a sender drops it
MAX_FRAMES = 16                 # a message's frames: 6 and one per array (an event or a question has at most 1)
MAX_ENVELOPE_BYTES = 512        # the envelope: a start id (~40 chars), a DEALER id (32), two counters
EVENTS_HWM = 32                 # the site's PULL: messages queued per group (the group holds the rest: EVENTS_QUEUED)
ASKS_HWM = 256                  # the ROUTER's queue of questions and records per group; the DEALER's inbound queue
STRANGERS_HWM = 4               # the ROUTER's inbound queue per peer: groups never write there
HANDSHAKE_MS = 5000             # a peer that has not finished the handshake by then is cut off
MAC_BYTES = 32                  # HMAC-SHA256
EVENTS_QUEUED = 10_000          # a group's events held while the site is away (restarting); more are dropped
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
    order: int = 0                              # the group's start's place in its order (up only)


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


def unpack(frames: list, start: str = "", order: int = 0) -> Frames:
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
    return Frames(kind, group, stream, header, arrays, record, start, order)


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


def curve_keys(key: bytes) -> dict:
    """The links' CurveZMQ keypairs (z85), derived from the run's key (HMAC-SHA256 of a label: both ends make the
    same ones, and nobody without the key can): {"server": (public, secret), "client": (public, secret)}."""
    if not zmq.has("curve"):
        raise RuntimeError("the site's links need libzmq with CURVE (pyzmq's wheels have it): this libzmq has none")
    out = {}
    for who in ("server", "client"):
        secret = z85.encode(hmac.new(key, b"ringspec site link curve " + who.encode(), hashlib.sha256).digest())
        out[who] = (zmq.curve_public(secret), secret)
    return out


def secured(sock: zmq.Socket, key: bytes, server: bool) -> zmq.Socket:
    """`sock` as one end of the links: CURVE under the run's keys (the site's ends the server), and every inbound
    frame capped at MAX_FRAME_BYTES."""
    keys = curve_keys(key)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    if server:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys["server"][1])
    else:
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys["server"][0])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys["client"][0])
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys["client"][1])
    return sock


def fits(frames: list) -> bool:
    """`pack`'s frames within MAX_FRAME_BYTES each and, with the MAC and the envelope, at most MAX_FRAMES: what a
    peer takes without cutting us off or dropping it."""
    return len(frames) + 2 <= MAX_FRAMES and all(memoryview(f).nbytes <= MAX_FRAME_BYTES for f in frames)


_ENVELOPES = {UP: (str, int, str, int), DOWN: (str, int, int)}     # see the module's docstring


def opened(key: bytes, direction: bytes, frames: list, dropped: Counter) -> tuple[list, list] | None:
    """(envelope, the frames after it) of a message whose MAC is right, else None (counted in `dropped`). What can
    be checked without the key is checked first (frame count and sizes, the envelope's shape), so a message that
    cannot be right costs no MAC."""
    if not 6 <= len(frames) <= MAX_FRAMES:
        dropped["frames"] += 1
        return None
    body = [f.buffer for f in frames[1:]]
    if len(frames[0]) != MAC_BYTES:
        dropped["bad_mac"] += 1
        return None
    try:
        if len(body[0]) > MAX_ENVELOPE_BYTES:
            raise ValueError("envelope too long")
        envelope = msgpack.unpackb(body[0], raw=False)
        shape = _ENVELOPES[direction]
        if not (isinstance(envelope, list) and len(envelope) == len(shape)
                and all(type(e) is t for e, t in zip(envelope, shape))):
            raise ValueError("bad envelope")
    except Exception:                 # noqa: BLE001 -- a key holder's bug or a stranger's, never the reader's end
        dropped["malformed: envelope"] += 1
        return None
    if not hmac.compare_digest(bytes(frames[0]), mac(key, direction, body)):
        dropped["bad_mac"] += 1
        return None
    return envelope, body[1:]


REFUSED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | \
    zmq.EVENT_HANDSHAKE_FAILED_AUTH                         # a peer cut off in the handshake (no key: no CURVE)


class SiteHub:
    """The site's end: binds both links (`endpoints` says where they are, ports resolved). `start`: this start of
    the site's place in the run's order (the launcher's count of its restarts): a group takes our messages only
    from the newest start it has seen."""

    def __init__(self, events: str, asks: str, key: bytes, start: int = 0):
        ctx = zmq.Context.instance()
        self._key = key
        self._pull = secured(ctx.socket(zmq.PULL), key, server=True)
        self._router = secured(ctx.socket(zmq.ROUTER), key, server=True)
        for sock in (self._pull, self._router):
            sock.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.RCVHWM, EVENTS_HWM)
        self._router.setsockopt(zmq.RCVHWM, STRANGERS_HWM)
        self._router.setsockopt(zmq.SNDHWM, ASKS_HWM)
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
        self._monitors = [sock.get_monitor_socket(REFUSED) for sock in (self._pull, self._router)]
        self._poller = zmq.Poller()
        for sock in (self._pull, self._router, *self._monitors):
            self._poller.register(sock, zmq.POLLIN)
        self._start = start                                   # this start of the site: a group orders us by it
        self._sent = 0
        self._routes: dict[str, tuple[str, int, bytes]] = {}  # group -> its live start, its order, its DEALER's id
        self._heard: dict[str, int] = {}                      # group -> its live start's last counter
        self.dropped: Counter = Counter()                     # messages refused, by why (fixed reasons: bounded)

    def close(self) -> None:
        for sock in (self._pull, self._router):
            sock.disable_monitor()
        for sock in (*self._monitors, self._pull, self._router):
            sock.close(linger=0)

    def recv(self, timeout: float) -> Frames | None:
        """The next verified message from a group within `timeout` s (None: none, or one dropped and counted)."""
        ready = dict(self._poller.poll(int(timeout * 1000)))
        for monitor in self._monitors:
            while monitor in ready and monitor.poll(0, zmq.POLLIN):
                monitor.recv_multipart()
                self.dropped["refused: handshake"] += 1
        if self._router in ready:                             # groups never send here: a stranger's, dropped
            self._router.recv_multipart(copy=False)
            self.dropped["on_the_asks_link"] += 1
        if self._pull not in ready:
            return None
        got = opened(self._key, UP, self._pull.recv_multipart(copy=False), self.dropped)
        if got is None:
            return None
        (start, order, dealer, count), frames = got
        try:
            msg = unpack(frames, start, order)
        except Exception as exc:      # noqa: BLE001 -- whatever a message's bytes make decoding raise, never our end
            self.dropped[f"malformed: {type(exc).__name__}"] += 1
            return None
        group, live = msg.group, self._routes.get(msg.group)
        if live is not None and live[0] == start and count <= self._heard[group]:
            self.dropped["replayed"] += 1
            return None
        if live is not None and live[0] != start and order <= live[1]:   # an earlier start's: it retires nothing
            self.dropped["stale_start"] += 1
            return None
        self._heard[group] = count
        with self._lock:
            self._routes[group] = (start, order, dealer.encode())
        return msg

    def asks(self, group: str, stream: str) -> _Sender:
        """Where the front sends `stream`'s questions and cancels (pipeline/serve/views.py StreamView.asks)."""
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
                if not fits(frames):                          # the group's DEALER would cut us off: never sent
                    self.dropped["too_large"] += 1
                    return
                self._sent += 1
                self._router.send_multipart([route[2], *seal(self._key, DOWN, [route[0], self._start, self._sent],
                                                             frames)], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:          # EHOSTUNREACH: not connected; EAGAIN: its queue is full
                raise TimeoutError(f"stream {stream}'s node ({group}) is not connected to the site "
                                   f"({exc.strerror}); retry shortly") from None


class NodeLink:
    """A node group's end, in its output actor: relays its streams' events to the site, takes questions from it.
    `site`: {"events", "asks": the site's endpoints, "key": the run's, "group": the group's name, "start": this
    start's id}. Its first message is its hello, which states this start's place in the group's order (`order`)."""

    def __init__(self, site: dict):
        self._ctx = ctx = zmq.Context()                      # its own: `close` waits for the push's last events
        self._key, self.group, self.start = site["key"], site["group"], site["start"]
        self.order = 0                                        # this start's place in the group's (set by `hello`)
        self._id = secrets.token_hex(16)                      # the DEALER's routing id: nobody else can claim it
        self._sent, self._site = 0, (-1, 0)                   # our counter; the newest site start seen, its counter
        self._push = secured(ctx.socket(zmq.PUSH), key=self._key, server=False)
        self._push.setsockopt(zmq.LINGER, 2000)               # the last events (the Eof) reach a live site
        self._push.setsockopt(zmq.SNDHWM, EVENTS_QUEUED)
        self._push.connect(site["events"])
        self._dealer = secured(ctx.socket(zmq.DEALER), key=self._key, server=False)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.RCVHWM, ASKS_HWM)
        self._dealer.setsockopt(zmq.ROUTING_ID, self._id.encode())
        self._dealer.connect(site["asks"])
        self.dropped: Counter = Counter()

    @property
    def socket(self) -> zmq.Socket:
        """What the output actor's Selector also waits on (pipeline/channel.py)."""
        return self._dealer

    def close(self) -> None:
        """The push's queued events (the Eof) go out for up to its linger; the context's `term` is that wait, which
        a linger alone does not get in a process that leaves through os._exit (multiprocessing's children)."""
        self._push.close()
        self._dealer.close()
        self._ctx.term()

    def hello(self, start: str, restarts: dict, starts: dict | None = None, node: str | None = None) -> None:
        """Who this group is: its start id, its supervisor's restarts, each stream's Start record so far (a site
        started again learns them here, not from the events, which it missed), and the node it runs on (a Ray
        launcher's: its label; None: as configured). The restarts order this start: their sum is its place in the
        group's (its supervisor counts one per start), which every later message carries."""
        self.order = sum(n for n in restarts.values() if isinstance(n, int))
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
            if site < self._site[0]:                          # an earlier start of the site's: never again
                self.dropped["stale_site"] += 1
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
        if not fits(frames):                                  # the site's PULL would cut us off: never sent
            self.dropped["too_large"] += 1
            return
        self._sent += 1
        try:
            self._push.send_multipart(seal(self._key, UP, [self.start, self.order, self._id, self._sent], frames),
                                      flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped["site_away"] += 1

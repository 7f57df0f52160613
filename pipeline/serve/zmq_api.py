"""The zmq face of the front: a ROUTER socket taking msgpack questions, and the `ask` client for it.

Owns the message shapes. A client (DEALER) sends one msgpack map per question:
    {"question": str, "max_tokens": int?, "deadline_s": float?, "stream": str (of several)?}
and receives, in order, maps {"id", "delta": str} as the answer's tokens are committed, then one final map
{"id", "done": true, "text", "finish_reason", "usage", "ringspec": {...}} (usage and ringspec's fields as the HTTP
face's: pipeline/serve/openai_api.py) or {"error": str, "code": int}.
Several clients and several questions per client may be in flight. A server with keys takes connections only from
clients that give one in zmq's PLAIN handshake (ZMQ_PLAIN_PASSWORD; the user name is not read): its ZAP handler
checks the key before the connection can queue a single frame, so a peer without the key costs the handshake only
(counted as zmq_handshakes_refused; the client sees the handshake fail). Who asks is the key's operator (the
message's User-Id, set by the handler), or the client's socket when the server has no keys (a request's own fields
never name it; a "key" field is ignored). Messages over serve.max_body_bytes are not read: zmq drops the connection
that sent one. Every other message gets a reply: 400 when it is not a readable request, the front's 4xx/429/503 when
refused, 503 server_busy past the bounds below, 500 naming the error's type when handling it failed (counted as
internal_errors); a reply msgpack cannot write is dropped and counted. Never touches a model or a channel.

Bounds (issue 55, finding 4: 24 keyless peers grew the process by 1.6 GB while its one thread answered a question
inline), each a reply or a counted drop before any work:
- the key at the handshake (above): a high-water mark counts whole messages, so a peer sending one message of
  endless MORE frames, each under the size cap, was queued without bound (4 raw ZMTP peers: +1.5 GB in 3 s); now
  only a key holder can. A server without keys is loopback-only and trusts its local users: that flood stays open
  there.
- zmq queues sized to the protocol: RCV_HWM requests per client wait in zmq before it stops reading that client's
  connection (so a flood waits in the client's own buffers, not here: at most RCV_HWM x serve.max_body_bytes a
  client), and a client's replies queue up to serve.max_waiting answers' worth (past it, zmq drops them).
- at most serve.max_zmq_peers clients (routing ids) with a request taken and still connected (the socket monitor
  tells when one leaves); a request from another is refused with 503 server_busy, counted as zmq_peers_refused.
- the answering off the socket thread: serve.max_waiting workers, each taking one request from `front.ask` to its
  answer's end; a request when none is free is refused at once with 503 server_busy, counted as zmq_busy. The
  socket thread only vouches for handshakes, receives, reads the message and hands it on, so a slow question (an
  aggregate over the archive) never stops it from reading, refusing and answering the others.

`run_ask` is the `ask` verb: the client, the answer streamed to stdout as it comes, and `AskReport`.

Threads: the socket and the ZAP handler live in one thread (zmq sockets are not thread-safe), in a zmq context of
their own (ZAP's endpoint is per context); the workers hand every reply back to it through a queue.
"""
from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass
from typing import ClassVar

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from pipeline.report import Report
from pipeline.serve.auth import Keys, env_key
from pipeline.serve.framing import RequestError
from pipeline.serve.front import Front
from pipeline.serve.openai_api import meta, usage

POLL_MS = 5
HANDSHAKE_MS = 5000            # a peer that has not finished the handshake by then is cut off
ZAP = "inproc://zeromq.zap.01"  # where libzmq asks whether a handshake's credentials are good (ZMQ RFC 27)
RCV_HWM = 4                    # requests queued in zmq per client: the socket thread drains them at once, so more
                               # would only hold a flood here (each up to serve.max_body_bytes)
REFUSED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)     # the monitor's events of a handshake refused
TAKEN_PER_TURN = 64            # messages read before the replies waiting are sent


class ZmqFront:
    def __init__(self, front: Front, endpoint: str, keys: Keys = Keys()):
        self.front, self.endpoint, self.keys = front, endpoint, keys
        serve = front.serve
        self._out: queue.Queue = queue.Queue()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._free = threading.BoundedSemaphore(serve.max_waiting)     # workers not answering
        self.peers = _Peers(serve.max_zmq_peers)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: Exception | None = None
        self._workers = [threading.Thread(target=self._work, daemon=True, name=f"zmq-ask-{i}")
                         for i in range(serve.max_waiting)]
        for worker in self._workers:
            worker.start()
        self._thread = threading.Thread(target=self._run, daemon=True, name="zmq")
        self._thread.start()
        self._ready.wait(5.0)
        if self.error:
            raise self.error

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        for _ in self._workers:
            self._jobs.put(None)

    def _run(self) -> None:
        serve = self.front.serve
        ctx = zmq.Context()
        zap = None
        sock = self.sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        if self.keys.required:
            zap = ctx.socket(zmq.REP)
            zap.setsockopt(zmq.LINGER, 0)
            zap.bind(ZAP)
            sock.setsockopt(zmq.PLAIN_SERVER, 1)
            sock.setsockopt(zmq.ZAP_DOMAIN, b"ringspec")
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)     # a reply to a client that left is dropped, not an error
        sock.setsockopt(zmq.MAXMSGSIZE, serve.max_body_bytes)
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        sock.setsockopt(zmq.SNDHWM, serve.max_waiting * (serve.max_answer_tokens + 2))   # each answer's replies
        monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | REFUSED)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            self.error = OSError(f"zmq: cannot bind {self.endpoint}: {exc}")
            self._ready.set()
            self._close(ctx, sock, monitor, zap)
            return
        self._ready.set()
        poller = zmq.Poller()
        for s in (sock, monitor, zap):
            if s is not None:
                poller.register(s, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if zap in ready:
                    self._vouch(zap)
                if monitor in ready:
                    self._events(monitor)
                for _ in range(TAKEN_PER_TURN if sock in ready else 0):
                    self._events(monitor)             # first: what the message's fd is now
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    who = frames[0].bytes
                    try:
                        self._take(who, frames[-1], frames[-1].bytes)
                    except Exception as exc:          # noqa: BLE001 -- one request fails, this thread goes on
                        self._failed(who, None, exc)
                while True:
                    try:
                        who, reply = self._out.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        sock.send_multipart([who, msgpack.packb(reply)])
                    except (TypeError, ValueError, OverflowError, zmq.ZMQError) as exc:   # one reply lost, counted
                        self.front.counts["zmq_replies_dropped"] += 1
                        print(f"ringspec: zmq: reply to {who.hex()} dropped: {type(exc).__name__}: {exc}",
                              file=sys.stderr, flush=True)
        finally:
            self._close(ctx, sock, monitor, zap)

    @staticmethod
    def _close(ctx, sock, monitor, zap) -> None:
        sock.disable_monitor()
        for s in (monitor, sock, zap):
            if s is not None:
                s.close()
        ctx.term()

    def _vouch(self, zap: zmq.Socket) -> None:
        """One ZAP request (ZMQ RFC 27): a PLAIN handshake whose password is an operator's key is let in as that
        operator (the User-Id its messages carry); anything else is refused before a frame is queued (counted by
        `_events`, with the handshakes that were not PLAIN)."""
        frames = zap.recv_multipart()
        version, request_id, mechanism, creds = frames[0], frames[1], frames[5], frames[6:]
        name = None
        if mechanism == b"PLAIN" and len(creds) == 2:
            name = self.keys.identify(creds[1].decode("utf-8", "replace"))
        zap.send_multipart([version, request_id, b"200" if name else b"400",
                            b"OK" if name else b"missing or wrong API key", (name or "").encode(), b""])

    def _events(self, monitor: zmq.Socket) -> None:
        """Connections accepted and closed, for the peers' table; refused handshakes are counted."""
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.peers.accepted(int(event["value"]))
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.peers.gone(int(event["value"]))
            elif event["event"] & REFUSED:
                self.front.counts["zmq_handshakes_refused"] += 1

    def _take(self, who: bytes, frame: zmq.Frame, payload: bytes) -> None:
        """One message, on the socket thread: a precise error reply (400 unreadable, 503 past the peers or the
        workers) or the request handed to a worker; anything unexpected raised here is the caller's 500
        (`_failed`). Nothing here waits."""
        try:
            req = msgpack.unpackb(payload, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:    # bytes, UTF-8, depth, non-string map keys
            self._out.put((who, {"error": f"not a msgpack request: {type(exc).__name__}: {exc}", "code": 400}))
            return
        try:
            if not isinstance(req, dict):
                raise RequestError(400, "expected a msgpack map with a non-empty string \"question\"")
            client = frame.get("User-Id") if self.keys.required else f"zmq:{who.hex()}"
            if not isinstance(req.get("question"), str) or not req["question"].strip():
                raise RequestError(400, "expected a msgpack map with a non-empty string \"question\"")
            if not self.peers.admit(who, frame.get(zmq.SRCFD)):
                self.front.counts["zmq_peers_refused"] += 1
                raise RequestError(503, f"{self.peers.cap} clients are already connected and asking "
                                        f"(serve.max_zmq_peers); retry shortly", "server_busy")
            if not self._free.acquire(blocking=False):
                self.front.counts["zmq_busy"] += 1
                raise RequestError(503, f"{len(self._workers)} requests are already being answered "
                                        f"(serve.max_waiting); retry shortly", "server_busy")
        except RequestError as exc:
            self._out.put((who, {"error": str(exc), "code": exc.status}))
            return
        self._jobs.put((who, client, req))

    def _work(self) -> None:
        """A worker: one request at a time, from `front.ask` to its answer's last reply."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            who, client, req = job
            try:
                self._answer(who, client, req)
            except Exception as exc:                  # noqa: BLE001 -- the asker hears why rather than nothing
                self._failed(who, None, exc)
            finally:
                self._free.release()

    def _answer(self, who: bytes, client: str, req: dict) -> None:
        try:
            answer = self.front.ask(client, messages=[{"role": "user", "content": req["question"]}],
                                    max_tokens=req.get("max_tokens"), deadline_s=req.get("deadline_s"),
                                    stream=req.get("stream"))
        except RequestError as exc:
            self._out.put((who, {"error": str(exc), "code": exc.status}))
            return
        try:
            self._relay(who, answer)
        except Exception as exc:                      # noqa: BLE001 -- the asker hears why rather than nothing
            self._failed(who, answer.id, exc)

    def _failed(self, who: bytes, answer_id: str | None, exc: BaseException) -> None:
        """A request that failed unexpectedly (a bug, the archive locked): its asker gets a 500 naming the error's
        type, the failure is counted and logged, and every other request goes on."""
        self.front.counts["internal_errors"] += 1
        print(f"ringspec: zmq: request from {who.hex()}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        self._out.put((who, {**({"id": answer_id} if answer_id else {}),
                             "error": f"internal error: {type(exc).__name__}: {exc}", "code": 500}))

    def _relay(self, who: bytes, answer) -> None:
        while True:
            try:
                what, data = answer.items.get(timeout=self.front.serve.deadline_s + 30.0)
            except queue.Empty:
                self.front.cancel(answer, "client_disconnects")
                self._out.put((who, {"id": answer.id, "error": "no answer in time", "code": 504}))
                return
            if what == "delta":
                self._out.put((who, {"id": answer.id, "delta": data}))
                continue
            if data["error"]:
                self._out.put((who, {"id": answer.id, "error": data["error"], "code": 504}))
            else:
                self._out.put((who, {"id": answer.id, "done": True, "text": answer.text,
                                     "finish_reason": data["finish_reason"], "usage": usage(data),
                                     "ringspec": meta(data)}))
            return


class _Peers:
    """The clients asking: routing id -> the fd of the connection its requests came on, at most `cap` of them. A
    client enters with its first request taken and leaves when its connection closes (zmq's socket monitor names the
    fd); one more is refused while `cap` are in. A message read after its connection closed (zmq delivers what it
    had queued) holds no place: its fd is closed until the monitor reports a new connection accepted on it.
    Socket thread only."""

    def __init__(self, cap: int):
        self.cap = cap
        self.fd_of: dict[bytes, int] = {}
        self.on_fd: dict[int, set[bytes]] = {}
        self.closed: set[int] = set()              # fds whose connection closed, none accepted on them since

    def admit(self, who: bytes, fd: int) -> bool:
        if who in self.fd_of or fd in self.closed:
            return True
        if len(self.fd_of) >= self.cap:
            return False
        self.fd_of[who] = fd
        self.on_fd.setdefault(fd, set()).add(who)
        return True

    def accepted(self, fd: int) -> None:
        self.closed.discard(fd)

    def gone(self, fd: int) -> None:
        self.closed.add(fd)
        for who in self.on_fd.pop(fd, ()):
            self.fd_of.pop(who, None)

    def __len__(self) -> int:
        return len(self.fd_of)


def client(endpoint: str, key: str | None = None) -> zmq.Socket:
    """A DEALER connected to the front at `endpoint`, giving `key` (an operator's) in zmq's PLAIN handshake: what a
    server with keys asks for; without one, the handshake a server without keys takes."""
    return watched(endpoint, key, 0)[0]


def watched(endpoint: str, key: str | None, events: int) -> tuple[zmq.Socket, zmq.Socket | None]:
    """`client`, and a monitor of its `events` attached before it connects (so the first handshake's are seen)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if key:
        sock.setsockopt(zmq.PLAIN_USERNAME, b"operator")
        sock.setsockopt(zmq.PLAIN_PASSWORD, key.encode())
    monitor = sock.get_monitor_socket(events) if events else None
    sock.connect(endpoint)
    return sock, monitor


def ask(endpoint: str, question: str, max_tokens: int | None = None, timeout_s: float = 120.0, on_delta=None,
        key: str | None = None, log_stream: str | None = None) -> dict:
    """The client: send one question, hand each delta to on_delta(text), return the final map (or raise).
    key: the operator's (default RINGSPEC_API_KEY), for a server that has keys (a server without keys refuses a
    handshake that gives one: asked again without it); log_stream: the stream asked, of a server that watches
    several. A refused handshake raises at once: a wrong key, or none for a server with keys."""
    req = {"question": question}
    if max_tokens is not None:
        req["max_tokens"] = max_tokens
    if log_stream is not None:
        req["stream"] = log_stream
    key = key or env_key()
    try:
        return _ask(endpoint, msgpack.packb(req), timeout_s, on_delta, key)
    except _Mismatch:
        if not key:
            raise RuntimeError(f"{endpoint}: the server refused the handshake: missing API key, this server "
                               f"needs one (RINGSPEC_API_KEY) (code 401)") from None
        return _ask(endpoint, msgpack.packb(req), timeout_s, on_delta, None)


class _Mismatch(Exception):
    """The server's handshake is not the client's: PLAIN (a key) on one side, none on the other."""


def _ask(endpoint: str, request: bytes, timeout_s: float, on_delta, key: str | None) -> dict:
    sock, monitor = watched(endpoint, key, REFUSED)
    try:
        sock.send(request)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(int(timeout_s * 1000)))
            if monitor in ready:
                if recv_monitor_message(monitor)["event"] != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    raise _Mismatch()
                raise RuntimeError(f"{endpoint}: the server refused the handshake: wrong API key (code 401)")
            if sock not in ready:
                raise TimeoutError(f"no reply from {endpoint} within {timeout_s:.0f} s (is `run.py serve` running "
                                   f"with --zmq {endpoint}?)")
            reply = msgpack.unpackb(sock.recv(), raw=False)
            if "error" in reply:
                raise RuntimeError(f"{endpoint}: {reply['error']} (code {reply.get('code')})")
            if "delta" in reply:
                if on_delta:
                    on_delta(reply["delta"])
                continue
            return reply
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


@dataclass
class AskReport(Report):
    """The final reply of `ask`; its text (streamed already) ends with a newline, the retrieved lines and timings go
    to stderr."""
    indent: ClassVar[int | None] = 2

    def text(self) -> str:
        return ""

    def notes(self) -> str:
        meta = self.data.get("ringspec", {})
        lines = [f"  [{meta.get('route', 'other')}: answer {meta.get('answer')!r}]"]
        lines += [f"  [cited: line #{line['seq']} at {line['time'] or '?'}] {line['text']}"
                  for line in meta.get("citations", [])]
        lines += [f"  [nearest: line #{line['seq']} at {line['time'] or '?'}] {line['text']}"
                  for line in meta.get("nearest", [])]
        ttft = meta.get("ttft_ms")
        lines.append(f"({self.data['usage']['completion_tokens']} tokens, {self.data['finish_reason']}, ttft "
                     f"{'-' if ttft is None else f'{ttft:.0f}'} ms, total {meta.get('total_ms', 0):.0f} ms)")
        return "\n".join(lines)


def run_ask(endpoint: str, question: str, max_tokens: int | None = None, timeout_s: float = 120.0,
            stream: bool = True, log_stream: str | None = None) -> AskReport:
    """Ask a running `serve` a question over zmq: the answer streams to stdout as it is decoded, then the retrieved
    older lines and the timings go to stderr.

    stream False: nothing is written while waiting (--json prints the final reply instead); log_stream: the stream
    asked (--stream NAME), of a server that watches several."""

    def show(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    return AskReport(ask(endpoint, question, max_tokens, timeout_s, on_delta=show if stream else None,
                         log_stream=log_stream))

"""The HTTP face of the front: an OpenAI-compatible API, health, Prometheus metrics and the web console.

Owns the HTTP protocol only: routes, request bounds, server-sent events, and what a client that goes away costs
(its request is cancelled, counted). Everything a request means is `Front`'s; OpenAI's request and reply shapes are
pipeline/serve/openai_api.py's; who may ask is `auth`'s. Never touches a model or a channel.

Bounds, each a precise 4xx/503 or a counted drop, never a traceback: Host and Origin outside serve.allowed_hosts
(403), a missing or wrong key (401; a query key only on /v1/events), a request line and headers over
serve.max_head_bytes (431, closed: read up to the bound, never buffered whole), a body without one decimal
Content-Length (400/411), over serve.max_body_bytes (413, and never read), a request whose line, headers and body
have not all arrived within serve.request_timeout_s (cut, however steadily it trickles), a body not read (the
connection closed after the answer, so it is never parsed as a next request), a body of JSON too deep, numbers too
long or lone surrogates (400), a client that resets (counted). Every path outside the routes is counted under one
label.

Connections are taken in, cut and given their two budgets by pipeline/serve/http_conns.py.

    GET  /                       the console (pipeline/serve/console.html; the key goes in its fragment, /#key=KEY)
    GET  /healthz                {"status": "ok", ...}; never needs the key
    GET  /metrics                Prometheus text format
    GET  /v1/models              the model served: "ringspec", or "ringspec/NAME" per stream when
                                 the pipeline has several (a request's "model" picks its stream)
    GET  /v1/status              the console's gauges as JSON
    GET  /v1/events              server-sent events: line, assessment, status (the console's live feed)
    POST /v1/chat/completions    OpenAI chat completions, "stream": true as SSE ending with "data: [DONE]"
    POST /v1/completions         OpenAI completions: the prompt continues the log
"""
from __future__ import annotations

import io
import json
import queue
import re
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from pipeline.serve.auth import Keys, allowed_hosts, refused_origin
from pipeline.serve.framing import RequestError
from pipeline.serve.front import Front
from pipeline.serve.http_conns import Conn, Cut, Deadline, HeadTooLarge, Pools, Server
from pipeline.serve import openai_api
from pipeline.serve.metrics import render
from pipeline.serve.views import MAX_SUBSCRIBERS

CONSOLE = Path(__file__).with_name("console.html")
KEEPALIVE_S = 15.0
HANGUP_CHECK_S = 0.5                             # how often a waiting request looks for its client
OPEN = ("/healthz", "/")                         # need no key: health, and the console's page (it holds no data)
_SURROGATE = re.compile(r"[\ud800-\udfff]")      # what json.loads leaves of a "\\udXXX" escape outside a pair


def serve_http(front: Front, host: str, port: int, keys: Keys = Keys()) -> ThreadingHTTPServer:
    """Start the server in a daemon thread; `shutdown()` stops it. keys: the operators' (none: no key asked)."""
    server = Server((host, port), _Handler)
    server.front, server.keys = front, keys
    server.hosts = allowed_hosts(front.serve.allowed_hosts, host)
    server.conns = {}
    server.pools = Pools(front.serve.max_connections, front.serve.max_connections_per_peer)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                     name="http").start()
    return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.1"         # a request line without a version is answered with headers too
    server_version = "ringspec"
    operator = ""                                 # who asks: the key's name, or the peer when no key is asked
    _look_at = 0.0                                # when `_next` next looks at the socket for a hang-up
    deadline = 0.0                                # when the request being read must have arrived whole
    got = 0                                       # bytes of it read so far
    head_left: int | None = None                  # bytes its head may still take (None: the head is read)
    conn: Conn                                   # this connection's place in the server's pools
    unread = False                                # its body is still on the wire: the connection closes after it

    def setup(self):
        self.timeout = self.server.front.serve.request_timeout_s     # a write's; a read gets what is left of it
        self.conn = self.server.conns[self.request]
        super().setup()
        self.rfile.close()                            # the socket stays open: only the stdlib's reader is dropped
        self.rfile = io.BufferedReader(Deadline(self))

    def handle_one_request(self):
        self.deadline, self.got = time.monotonic() + self.timeout, 0
        self.head_left = self.server.front.serve.max_head_bytes
        self.command, self.request_version, self.requestline = None, self.default_request_version, ""
        try:
            super().handle_one_request()
        except HeadTooLarge:
            self.server.front.counts["heads_too_large"] += 1
            self.send_error(431, f"the request line and headers exceed {self.server.front.serve.max_head_bytes} "
                                 f"bytes (serve.max_head_bytes)")

    def parse_request(self):
        try:
            return super().parse_request()
        finally:
            self.head_left = None                     # the head is read (or refused): the body has its own bound

    def _end_headers(self):
        """Every answer on a connection about to close says so, and a body left unread closes it: read as the next
        request, a 401's or a GET's body could carry a second, smuggled one."""
        if self.close_connection or self.unread:
            self.send_header("Connection", "close")         # the stdlib then closes after this answer
        self.end_headers()

    def log_message(self, fmt, *args):          # the operator reads the pipeline's lines, not an access log
        pass

    def send_error(self, code, message=None, explain=None):
        """The stdlib's own refusals (a malformed request line, headers too long, an unknown method) in the API's
        JSON error shape, and the connection closed: what follows a malformed request cannot be trusted."""
        self.close_connection = True
        message = message or self.responses.get(code, ("error",))[0]
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}}).encode()
        self.send_response(code, message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self._end_headers()
        if getattr(self, "command", None) != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    # -- routing -----------------------------------------------------------------------------------------------------
    ROUTES = {"GET": {"/": "_console", "/healthz": "_health", "/metrics": "_metrics", "/v1/models": "_models",
                      "/v1/status": "_status", "/v1/events": "_events"},
              "POST": {"/v1/chat/completions": "_chat", "/v1/completions": "_completions"}}

    def do_GET(self):
        self._route()

    def do_POST(self):
        self._route()

    def _route(self):
        front, server = self.server.front, self.server
        path = urlparse(self.path).path
        self.unread = bool(self.headers.get("Transfer-Encoding")) or any(
            n.strip() != "0" for n in self.headers.get_all("Content-Length") or ())
        refused = refused_origin(server.hosts, self.headers.get("Host"), self.headers.get("Origin"))
        if refused:
            self.close_connection = True
            return self._error(RequestError(403, refused, "forbidden"))
        routes = self.ROUTES[self.command]
        if path not in routes:
            known = path in _PATHS
            return self._error(RequestError(405 if known else 404, f"{self.command} {_short(path)}: " +
                                            ("method not allowed" if known else "no such endpoint")))
        self.operator = server.keys.identify(self._key(path)) if server.keys.required else \
            f"peer:{self.client_address[0]}"
        if self.operator is None and path not in OPEN:
            return self._error(RequestError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                            "authentication_error"))
        if path not in OPEN and not server.pools.keyed_slot(self.conn):     # keyed from now on: never cut
            front.counts["connections_refused"] += 1
            self.close_connection = True
            return self._error(RequestError(503, f"{server.pools.cap} connections whose key checked out are open "
                                                 f"(serve.max_connections); retry shortly", "server_busy"))
        try:
            getattr(self, routes[path])()
        except RequestError as exc:
            self._error(exc)
        except Cut:                                  # counted where it was cut
            self.close_connection = True
        except (ConnectionError, TimeoutError):       # the client went away or went silent mid-request
            front.counts["client_disconnects"] += 1
            self.close_connection = True
        except Exception as exc:                      # noqa: BLE001 -- one request fails, the server carries on
            front.counts["internal_errors"] += 1
            print(f"ringspec: http: {self.command} {path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            try:
                self._error(RequestError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))
            except OSError:
                pass

    def _key(self, path: str) -> str:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer "):].strip()
        if path == "/v1/events":                      # only there: EventSource cannot set headers
            return parse_qs(urlparse(self.path).query).get("key", [""])[0]
        return ""

    # -- plain endpoints ---------------------------------------------------------------------------------------------
    def _console(self):
        self._send(200, CONSOLE.read_bytes(), "text/html; charset=utf-8")

    def _health(self):
        self._json(200, self.server.front.health())

    def _models(self):
        self._json(200, openai_api.models(getattr(self.server.front, "views", {})))

    def _status(self):
        self._json(200, self.server.front.gauges())

    def _metrics(self):
        self._send(200, render(self.server.front).encode(), "text/plain; version=0.0.4; charset=utf-8")

    def _events(self):
        front = self.server.front
        sub = front.feed.subscribe()
        if sub is None:
            raise RequestError(503, f"{MAX_SUBSCRIBERS} consoles are already following the stream", "server_busy")
        try:
            self._start_stream()
            for stream in front.views.values():
                for line in list(stream.tail)[-50:]:
                    self._sse(json.dumps(line), "line")
                for view in stream.analyses:
                    self._sse(json.dumps(view), "assessment")
            self._sse(json.dumps(front.gauges()), "status")
            while True:
                try:
                    kind, data = sub.get(timeout=KEEPALIVE_S)
                except queue.Empty:
                    self._chunk(b": keepalive\n\n")
                    continue
                self._sse(json.dumps(data), kind)
        finally:
            front.feed.unsubscribe(sub)

    # -- OpenAI endpoints --------------------------------------------------------------------------------------------
    def _chat(self):
        self._answer(self._body(), chat=True)

    def _completions(self):
        self._answer(self._body(), chat=False)

    def _answer(self, body: dict, chat: bool):
        """Ask the front, then write its answer whole or as server-sent events as it arrives; a client gone meanwhile
        cancels it (counted)."""
        front = self.server.front
        answer = front.ask(self.operator, **openai_api.question_of(body, chat))
        created = int(time.time())
        try:
            if not body.get("stream"):
                info = self._wait(answer)
                if info["error"]:
                    raise RequestError(504 if "deadline" in info["error"] else 500, info["error"], "timeout")
                return self._json(200, openai_api.whole(answer, info, chat, created))
            self._start_stream()
            first = True
            while True:
                what, data = self._next(answer)
                if what == "delta":
                    self._sse(json.dumps(openai_api.delta_chunk(answer, data, chat, created, first)))
                    first = False
                    continue
                self._sse(json.dumps(openai_api.last_chunk(answer, data, chat, created)))
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
                return
        except (ConnectionError, TimeoutError, queue.Empty):
            front.cancel(answer, "client_disconnects")
            self.close_connection = True

    def _wait(self, answer) -> dict:
        while True:
            what, data = self._next(answer)
            if what == "done":
                return data

    def _next(self, answer) -> tuple:
        """The answer's next item. Meanwhile the socket is looked at every HANGUP_CHECK_S, whether items arrive or
        not: a client that hung up while its question waited or was answered raises ConnectionResetError, so the
        question is cancelled then, and the owner stops it at its next block or drops it from the queue, not when a
        token would be written. (Looking only when no item came for HANGUP_CHECK_S missed a whole-reply client that
        hung up just before its answer began: tokens then came faster than that, and it ran to its end.)"""
        deadline = time.monotonic() + self.server.front.serve.deadline_s + 30.0
        while True:
            now = time.monotonic()
            if now >= self._look_at:
                self._look_at = now + HANGUP_CHECK_S
                if self._hung_up():
                    raise ConnectionResetError("the client hung up")
            try:
                return answer.items.get(timeout=HANGUP_CHECK_S)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise

    def _hung_up(self) -> bool:
        """Has the client closed its end? (Readable with nothing to read is an orderly close; a reset raises.)"""
        try:
            if not select.select([self.connection], [], [], 0)[0]:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- the wire ----------------------------------------------------------------------------------------------------
    def _body(self) -> dict:
        limit = self.server.front.serve.max_body_bytes
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise RequestError(411, "chunked request bodies are not taken: send the body with a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise RequestError(411, "a request body needs a Content-Length")
        if len(lengths) > 1 or not lengths[0].strip().isdigit() or not lengths[0].strip().isascii():
            self.close_connection = True
            raise RequestError(400, f"Content-Length must be one decimal number of bytes, got "
                                    f"{', '.join(map(repr, lengths))[:80]}")
        length = int(lengths[0])
        if length > limit:
            self.close_connection = True
            raise RequestError(413, f"request body of {length} bytes exceeds {limit} (serve.max_body_bytes)")
        raw = self.rfile.read(length)
        if len(raw) < length:
            self.close_connection = True
            raise RequestError(400, f"the body ended after {len(raw)} of its {length} bytes")
        self.unread = False
        try:
            body = json.loads(raw)
        except RecursionError:
            raise RequestError(400, "the body's JSON is nested too deeply") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(400, f"the body is not JSON: {exc}") from None
        except ValueError as exc:                     # int()'s digit limit: a number of thousands of digits
            raise RequestError(400, f"the body holds a number too long: {str(exc)[:120]}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        if _lone_surrogate(body):                     # valid JSON, but no text: the tokenizer cannot encode it
            raise RequestError(400, "the body holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape outside a "
                                    "pair): not text")
        return body

    def _count(self, status: int) -> None:
        """One request by endpoint and status; every path outside the routes under one label (anyone can send any
        path, and each would be a counter and a /metrics line of its own)."""
        path = urlparse(self.path).path
        self.server.front.counts[("requests", path if path in _PATHS else "other", status)] += 1

    def _error(self, exc: RequestError):
        self._count(exc.status)
        headers = {"Retry-After": "1"} if exc.status == 503 else {}
        self._json(exc.status, {"error": {"message": str(exc), "type": exc.kind, "code": exc.status}}, headers)

    def _json(self, status: int, obj: dict, headers: dict | None = None):
        if status < 400:
            self._count(status)
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self._end_headers()
        self.wfile.write(body)

    def _start_stream(self):
        self._count(200)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._end_headers()

    def _sse(self, data: str, event: str | None = None):
        self._chunk((f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode())

    def _chunk(self, data: bytes):
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


_PATHS = frozenset(path for routes in _Handler.ROUTES.values() for path in routes)


def _lone_surrogate(value) -> bool:
    """Does any string in a parsed body, key or value, hold a surrogate? (A loop, not recursion: json.loads took
    the body as deep as the interpreter allows.)"""
    todo = [value]
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            if not value.isascii() and _SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            todo.extend(value)
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    return False


def _short(path: str) -> str:
    return path if len(path) <= 80 else path[:77] + "..."

"""The HTTP server's connections: one thread each, two budgets, and a request's read deadline.

Owns `Server` (the stdlib's threading server, taking each connection in before its thread starts), `Pools` (the
connections held, unkeyed apart from keyed), `Conn` (one connection's place) and `Deadline` (a connection's reads,
bounded by what is left of its request's time and head bytes). What a request means and who may make it are
pipeline/serve/http_api.py's and pipeline/serve/auth.py's. Never parses HTTP.

Connections, two budgets (issue 55, finding 11: 16 keyless sockets from 127.0.0.1 held the per-address cap, and every
loopback /healthz got 503). A connection starts unkeyed: nothing it sent has shown a key yet. It becomes keyed when a
request on it passes the key check of a path that needs one (any such path on a server without keys), before its
body is read; it then holds one of serve.max_connections keyed slots until it closes (none free: 503, closed).
Unkeyed connections are never refused: past serve.max_connections_per_peer from one address the address's own oldest
unkeyed connection is cut, past serve.max_connections in all the oldest of all (each counted as connections_cut).
So keyless connections can hold only unkeyed places, and a new connection always gets its request's head read: a
keyed client or a /healthz check is served whatever number of keyless sockets wait (they would have to open
connections faster than it sends its head to cut it first). The key is checked as soon as the head has arrived,
which is serve.max_head_bytes at most, before any body byte is read.
"""
from __future__ import annotations

import io
import socket
import sys
import threading
import time
from collections import Counter
from http.server import ThreadingHTTPServer


class Conn:
    """One connection's place: unkeyed (no request on it has shown a key yet), keyed, or cut to make room."""
    __slots__ = ("peer", "sock", "keyed", "cut")

    def __init__(self, peer: str, sock):
        self.peer, self.sock, self.keyed, self.cut = peer, sock, False, False


class Pools:
    """The connections held, unkeyed apart from keyed (the module's docstring says why)."""

    def __init__(self, cap: int, per_peer: int):
        self.cap, self.per_peer = cap, per_peer
        self.lock = threading.Lock()
        self.unkeyed: dict[Conn, None] = {}           # oldest first
        self.by_peer: Counter = Counter()              # unkeyed connections per remote address
        self.keyed = 0

    def enter(self, conn: Conn) -> Conn | None:
        """Take `conn` in as unkeyed; the connection cut to make room for it, if any (the caller closes it)."""
        with self.lock:
            cut = None
            if self.by_peer[conn.peer] >= self.per_peer:
                cut = next(c for c in self.unkeyed if c.peer == conn.peer)
            elif len(self.unkeyed) >= self.cap:
                cut = next(iter(self.unkeyed))
            if cut is not None:
                self._drop(cut)
                cut.cut = True
            self.unkeyed[conn] = None
            self.by_peer[conn.peer] += 1
            return cut

    def keyed_slot(self, conn: Conn) -> bool:
        """Move `conn` to the keyed pool (it stays there until it closes); False when that pool is full."""
        with self.lock:
            if conn.keyed:
                return True
            if self.keyed >= self.cap:
                return False
            if not conn.cut:
                self._drop(conn)
            conn.keyed, conn.cut = True, False
            self.keyed += 1
            return True

    def leave(self, conn: Conn) -> None:
        with self.lock:
            if conn.keyed:
                self.keyed -= 1
            elif not conn.cut:
                self._drop(conn)

    def _drop(self, conn: Conn) -> None:
        del self.unkeyed[conn]
        self.by_peer[conn.peer] -= 1
        if not self.by_peer[conn.peer]:
            del self.by_peer[conn.peer]                # a table of every address ever seen would only grow


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128                      # the listen backlog: at the stdlib's 5, a burst of connections
                                                  # waited out SYN retries (1 s each) before the accept loop saw them
    front: object                                 # the Front (pipeline/serve/front.py)
    keys: object                                  # the operators' Keys (pipeline/serve/auth.py)
    hosts: frozenset[str] | None
    pools: Pools
    conns: dict                                   # socket -> its Conn, while its thread runs

    def process_request(self, request, client_address):
        """One thread per connection, taken in as unkeyed; past the unkeyed bounds the oldest unkeyed connection
        (of this address first) is cut: shut down, so its thread's read ends at once."""
        conn = self.conns[request] = Conn(client_address[0], request)
        cut = self.pools.enter(conn)
        if cut is not None:
            self.front.counts["connections_cut"] += 1
            try:
                cut.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.pools.leave(self.conns.pop(request))

    def handle_error(self, request, client_address):
        """A failure outside a route (a client that resets its connection while the next request line is read, a
        malformed request the parser chokes on) costs that connection only: counted, one line, never a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            self.front.counts["client_disconnects"] += 1
            return
        self.front.counts["internal_errors"] += 1
        print(f"ringspec: http: connection from {client_address[0]}: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)


class Cut(TimeoutError):
    """A request that did not arrive whole within serve.request_timeout_s, or a connection cut to make room."""


class HeadTooLarge(Exception):
    """A request line and headers longer than serve.max_head_bytes."""


class Deadline(io.RawIOBase):
    """The connection's reads, each allowed only what is left of the request's serve.request_timeout_s (a timeout per
    read let a client that sends a byte just inside it hold its slot for ever) and, while the head is read, only what
    is left of serve.max_head_bytes (the stdlib would buffer 100 header lines of 64 KiB each). Writes keep the
    socket's own timeout."""

    def __init__(self, handler):
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        handler, sock = self.handler, self.handler.connection
        if handler.head_left is not None:
            if handler.head_left <= 0:
                raise HeadTooLarge()
            buf = memoryview(buf)[:handler.head_left]
        left = handler.deadline - time.monotonic()
        try:
            if left <= 0:
                raise Cut()
            sock.settimeout(left)
            n = sock.recv_into(buf)
        except TimeoutError:
            if handler.got:                          # a request under way, not a connection idle between requests
                handler.server.front.counts["client_disconnects"] += 1
            raise Cut(f"the request did not arrive within {handler.timeout} s (serve.request_timeout_s)") from None
        finally:
            sock.settimeout(handler.timeout)
        if not n and handler.conn.cut:
            raise Cut("cut to make room for a newer connection")
        handler.got += n
        if handler.head_left is not None:
            handler.head_left -= n
        return n

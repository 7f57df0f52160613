"""Flooding the operators' fronts (pipeline/serve/zmq_api.py, pipeline/serve/http_api.py): how much the process
serving them grows, and whether keyed clients and health checks are still answered (issue 55, findings 4, 11, 12).
`python -m bench.front_flood HOW` prints one flood's figures; `python -m bench.bounds` puts them in its table.

Owns these floods and their measure, nothing else: a child process (spawned: no zmq context inherited) serves the
real zmq or HTTP face over a stand-in front (`Stub`: its first question blocks `slow_s`, as an aggregate answered
inline did; the rest answer at once), with one operator key; this process's peers flood it; the child's growth is
its peak resident size (/proc/PID/status VmHWM) over its resident size before the flood. The floods:
    zmq         24 keyless DEALERs push ~64 KiB messages while one keyed question holds the stand-in's `ask`;
                then a keyed question is asked during the flood
    zmq-nokeys  the same at a server without keys (every peer may ask)
    multipart   4 raw ZMTP peers (bench/flood.py's `_zmtp_peer`) send one endless message of 60 KiB MORE frames
    heads       16 keyless sockets each send 99 header lines of 64,000 bytes, never ending the head
    loopback    16 keyless sockets from 127.0.0.1 hold a begun request; 12 /healthz and 12 keyed /v1/models from
                127.0.0.1 meanwhile: their status codes
The bench process and the child are killed after each flood. Never starts a model or a real owner.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import multiprocessing as mp
import queue
import socket
import threading
import time

import msgpack
import zmq

from bench.flood import _zmtp_peer
from pipeline import config
from pipeline.process import proc_status
from pipeline.serve.auth import Keys
from pipeline.serve.http_api import serve_http
from pipeline.serve.zmq_api import ZmqFront, client

KEY = "flood-key-0001"
HOWS = ("zmq", "zmq-nokeys", "multipart", "heads", "loopback")


class Stub:
    """A front whose first question blocks `slow_s` (an aggregate answered inline), then answers at once."""

    def __init__(self, slow_s: float = 0.0):
        self.serve = dataclasses.replace(config.ServeSection(), api_key=KEY)
        self.counts = collections.Counter()
        self.views, self.slow_s, self.n = {}, slow_s, 0

    def health(self):
        return {"status": "ok"}

    def ask(self, client, **q):
        self.n += 1
        if self.n == 1 and self.slow_s:
            time.sleep(self.slow_s)
        a = type("Answer", (), {"id": f"q{self.n}", "text": "ok", "items": queue.Queue()})()
        a.items.put(("done", {"error": None, "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1,
                              "route": "other", "answer": None, "citations": [], "nearest": [], "frame_ms": 0,
                              "queued_ms": 0, "queued_blocks": 0, "ttft_ms": 1, "total_ms": 1, "stats": {}}))
        return a

    def cancel(self, a, why):
        self.counts[why] += 1


def _keys(keyed: bool) -> Keys:
    return Keys((("op", KEY.encode()),)) if keyed else Keys()


def _serve_zmq(endpoint: str, ready, keyed: bool, slow_s: float) -> None:
    ZmqFront(Stub(slow_s), endpoint, _keys(keyed))
    ready.set()
    time.sleep(3600)


def _serve_http(port_q) -> None:
    server = serve_http(Stub(), "127.0.0.1", 0, _keys(True))
    port_q.put(server.server_address[1])
    time.sleep(3600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Child:
    """A spawned child serving one face; `port` or `endpoint` where it listens; killed on exit."""

    def __init__(self, kind: str, keyed: bool = True, slow_s: float = 0.0):
        ctx = mp.get_context("spawn")
        if kind == "zmq":
            self.endpoint, ready = f"tcp://127.0.0.1:{_free_port()}", ctx.Event()
            self.proc = ctx.Process(target=_serve_zmq, args=(self.endpoint, ready, keyed, slow_s), daemon=True)
            self.proc.start()
            if not ready.wait(60):
                raise RuntimeError("the zmq face did not start within 60 s")
        else:
            port_q = ctx.Queue()
            self.proc = ctx.Process(target=_serve_http, args=(port_q,), daemon=True)
            self.proc.start()
            self.port = port_q.get(timeout=60)
        time.sleep(0.5)
        self.base = proc_status(self.proc.pid)["vmrss_mb"]

    def growth_mb(self) -> int:
        return round(proc_status(self.proc.pid)["vmhwm_mb"] - self.base, 1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.join(10)


def zmq_flood(seconds: float = 3.0, keyed: bool = True) -> dict:
    """24 keyless DEALERs push ~64 KiB messages for `seconds` while a keyed question holds `ask`; then a keyed
    question: answered within 2 s or not."""
    with _Child("zmq", keyed, slow_s=seconds + 30) as child:
        ctx = zmq.Context.instance()
        slow = client(child.endpoint, KEY if keyed else None)
        slow.send(msgpack.packb({"question": "how many lines say connecting?"}))   # holds the stand-in's ask
        time.sleep(0.2)
        peers = []
        for _ in range(24):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(child.endpoint)
            peers.append(s)
        payload = msgpack.packb({"question": "x" * 65000})
        t0, sent = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            for s in peers:
                try:
                    s.send(payload, zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
            for s in peers:                              # read (and drop) the refusals, as a client would
                while s.poll(0):
                    s.recv()
        other = client(child.endpoint, KEY if keyed else None)
        other.send(msgpack.packb({"question": "hi"}))
        answered = bool(other.poll(2000))
        growth = child.growth_mb()
        for s in (*peers, slow, other):
            s.close(linger=0)
    return {"how": "zmq" if keyed else "zmq-nokeys", "seconds": seconds, "messages_sent": sent,
            "growth_mb": growth, "keyed_answered": answered}


def multipart(seconds: float = 3.0) -> dict:
    """4 raw ZMTP peers send one endless message of 60 KiB MORE frames for `seconds`."""
    with _Child("zmq") as child:
        sent, until = [0], time.monotonic() + seconds
        peers = [threading.Thread(target=_zmtp_peer, args=(b"DEALER", child.endpoint, until, sent), daemon=True)
                 for _ in range(4)]
        for t in peers:
            t.start()
        for t in peers:
            t.join()
        return {"how": "multipart", "seconds": seconds, "sent_mb": sent[0] >> 20, "growth_mb": child.growth_mb()}


def heads() -> dict:
    """16 keyless sockets each send 99 header lines of 64,000 bytes: the server's growth and its replies."""
    with _Child("http") as child:
        socks, line = [], b"X-Pad: " + b"a" * 64000 + b"\r\n"
        for _ in range(16):
            socks.append(socket.create_connection(("127.0.0.1", child.port)))
        for s in socks:
            try:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                for _ in range(99):
                    s.sendall(line)
            except OSError:
                pass                                     # cut off: the reply tells
        time.sleep(1.0)
        codes = collections.Counter()
        for s in socks:
            s.settimeout(0.5)
            try:
                codes[s.recv(200)[9:12].decode() or "closed"] += 1
            except OSError:
                codes["none"] += 1
            s.close()
        return {"how": "heads", "growth_mb": child.growth_mb(), "codes": dict(codes)}


def loopback() -> dict:
    """16 keyless sockets hold a begun request; 12 /healthz and 12 keyed /v1/models from 127.0.0.1: their codes."""
    with _Child("http") as child:
        socks = []
        for _ in range(16):
            s = socket.create_connection(("127.0.0.1", child.port))
            s.sendall(b"GET /heal")                      # begun, never finished
            socks.append(s)
        time.sleep(0.3)
        codes = collections.Counter()
        for _ in range(12):
            for what, head in (("healthz", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
                               ("keyed", b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                                KEY.encode() + b"\r\nConnection: close\r\n\r\n")):
                with socket.create_connection(("127.0.0.1", child.port), timeout=10) as c:
                    c.sendall(head)
                    try:
                        codes[f"{what} {c.recv(100)[9:12].decode() or 'closed'}"] += 1
                    except OSError:
                        codes[f"{what} none"] += 1
        for s in socks:
            s.close()
        return {"how": "loopback", "codes": dict(codes)}


def flood(how: str, seconds: float = 3.0) -> dict:
    """One flood of the module's docstring on a fresh child."""
    if how in ("zmq", "zmq-nokeys"):
        return zmq_flood(seconds, keyed=how == "zmq")
    if how == "multipart":
        return multipart(seconds)
    if how == "heads":
        return heads()
    if how == "loopback":
        return loopback()
    raise ValueError(f"unknown flood {how!r}: one of {', '.join(HOWS)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.front_flood", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("how", choices=(*HOWS, "all"))
    p.add_argument("--seconds", type=float, default=3.0, help="zmq floods: how long (default %(default)s)")
    a = p.parse_args(argv)
    for how in HOWS if a.how == "all" else (a.how,):
        print(json.dumps(flood(how, a.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

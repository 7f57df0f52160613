"""Flooding the site's links (pipeline/serve/site_link.py): how much the process hosting the hub grows, and whether a
real group is still served after. `python -m bench.flood` prints the figures; the fuzz target `site_flood`
(bench/fuzz.py) floods one host many times and asserts the bound after each.

Owns the floods and their measure, nothing else: a child process (`Host`) hosts a real SiteHub and a real group
(NodeLink, its live start the group's second) and reads the links as the site actor does; the parent's peers flood
for a while, then the child checks that the group's event still crosses and its question still goes out. The
child's growth is its peak resident size (/proc/PID/status VmHWM) over its resident size before the first flood.
The floods:
    messages   keyless zmq peers (PUSH to the events link, DEALER to the asks link) sending messages of a link's
               six frames (a wrong MAC, an envelope, kind, group, stream, and `size` bytes) as fast as they can
               (each peer's own queue held at 2: the bench process stays small)
    multipart  keyless peers speaking ZMTP 3.0 by hand (no libzmq) that send one message that never ends: 60 KiB
               frames, each flagged MORE, reconnecting whenever they are cut off (a receive high-water mark counts
               whole messages, so it never stops this one)
    replay     peers past the handshake (holding the run's key, as a captured message's replayer with the transport
               keys would be) replaying MAC-valid messages the hub must refuse: an earlier start's hello and the
               live start's own old counters
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import secrets
import socket
import struct
import threading
import time

import zmq

from pipeline import messages
from pipeline.process import proc_status
from pipeline.messages import Cancel, decode
from pipeline.serve.site_link import UP, NodeLink, SiteHub, pack, seal, secured

MIB = 1 << 20
GROUP, LIVE, EARLIER = "g0", "g0-s2", "g0-s1"


def _host(key: bytes, commands, replies) -> None:
    """The child: a SiteHub and a real group, read as the site actor reads them, until told to stop."""
    hub = SiteHub("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", key)
    link = NodeLink({**hub.endpoints, "key": key, "group": GROUP, "start": LIVE})
    link.hello(LIVE, {"target": 1})                 # the group's second start
    while hub.recv(0.1) is None:
        pass
    replies.put(hub.endpoints)
    n = 0
    while True:
        hub.recv(0.02)
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command == "stop":
            break
        n += 1
        link.relay("tep", Cancel(id=f"up{n}"))      # the group still served: its event crosses ...
        deadline, up = time.monotonic() + 60, False
        while not up and time.monotonic() < deadline:
            got = hub.recv(0.05)
            up = got is not None and got.group == GROUP and got.kind == "event" and decode(got).id == f"up{n}"
        down = []
        while not down and time.monotonic() < deadline:   # ... and its question goes out
            try:
                messages.send(hub.asks(GROUP, "tep"), Cancel(id=f"down{n}"))
            except TimeoutError:
                time.sleep(0.05)
                continue
            while not down and time.monotonic() < deadline:
                down = link.take()
        replies.put({"dropped": dict(hub.dropped), "served": up and [decode(d).id for d in down] == [f"down{n}"]})
    link.close()
    hub.close()


def _zmq_peer(kind: int, endpoint: str, size: int, until: float, sent: list) -> None:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 2)
    sock.connect(endpoint)
    blob = [secrets.token_bytes(32), b"\x94\xa1s\x01\xa1d\x01", b"event", GROUP.encode(), b"tep",
            secrets.token_bytes(size)]
    while time.monotonic() < until:                   # the frames of a message, its MAC wrong
        try:
            sock.send_multipart(blob, flags=zmq.NOBLOCK)
            sent[0] += size
        except zmq.Again:
            time.sleep(0.001)
    sock.close()


def _zmtp_peer(socket_type: bytes, endpoint: str, until: float, sent: list) -> None:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    frame = b"\x03" + struct.pack(">Q", 60 << 10) + bytes(60 << 10)     # MORE | LONG, 60 KiB
    while time.monotonic() < until:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0) as c:
                c.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32))
                body = b"\x05READY\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
                c.sendall(b"\x04" + bytes([len(body)]) + body)
                while time.monotonic() < until:
                    c.sendall(frame)
                    sent[0] += len(frame)
        except OSError:
            time.sleep(0.01)


def _replay_peer(key: bytes, endpoint: str, until: float, sent: list) -> None:
    sock = secured(zmq.Context.instance().socket(zmq.PUSH), key, server=False)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 64)
    sock.connect(endpoint)
    n = 0
    while time.monotonic() < until:
        n += 1
        if n % 2:                                     # an earlier start's hello, as captured: it retires nothing
            frames = seal(key, UP, [EARLIER, 0, "d" * 32, n], pack("hello", GROUP, "", {}, {}, {"start": EARLIER}))
        else:                                         # the live start's first counter again: replayed
            frames = seal(key, UP, [LIVE, 1, "e" * 32, 1], pack("event", GROUP, "tep", {}, {}, None))
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
            sent[0] += sum(len(f) for f in frames)
        except zmq.Again:
            time.sleep(0.001)
    sock.close()


class Host:
    """A child process hosting a real SiteHub and a real group; `flood` floods it, then checks the group."""

    def __init__(self):
        ctx = mp.get_context("spawn")
        self.key = secrets.token_bytes(32)
        self._commands, self._replies = ctx.Queue(), ctx.Queue()
        self.child = ctx.Process(target=_host, args=(self.key, self._commands, self._replies), daemon=True)
        self.child.start()
        self.endpoints = self._replies.get(timeout=120)
        time.sleep(0.5)
        self.before = proc_status(self.child.pid)["vmrss_mb"]

    def flood(self, how: str, seconds: float, peers: int = 4, size: int = 4 * MIB) -> dict:
        """`peers` peers (half on each link; replay: all on the events link) flood for `seconds`: what they got
        onto the wire, the child's growth so far (peak over before the first flood) and RSS now, its drops, and
        whether the group was served after."""
        until, sent, threads = time.monotonic() + seconds, [0], []
        for n in range(peers):
            link = "events" if n % 2 == 0 or how == "replay" else "asks"
            if how == "messages":
                target, args = _zmq_peer, (zmq.PUSH if link == "events" else zmq.DEALER, self.endpoints[link],
                                           size, until, sent)
            elif how == "multipart":
                target, args = _zmtp_peer, (b"PUSH" if link == "events" else b"DEALER", self.endpoints[link],
                                            until, sent)
            elif how == "replay":
                target, args = _replay_peer, (self.key, self.endpoints["events"], until, sent)
            else:
                raise ValueError(f"unknown flood {how!r}")
            threads.append(threading.Thread(target=target, args=args, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._commands.put("check")
        out = self._replies.get(timeout=120)
        now = proc_status(self.child.pid)
        return {"how": how, "seconds": seconds, "peers": peers, "sent_mb": round(sent[0] / MIB, 1),
                "rss_before_mb": round(self.before, 1), "growth_mb": round(now["vmhwm_mb"] - self.before, 1),
                "rss_now_mb": round(now["vmrss_mb"], 1), **out}

    def close(self) -> None:
        self._commands.put("stop")
        self.child.join(timeout=10)
        if self.child.is_alive():
            self.child.kill()
            self.child.join()


def flood(how: str = "messages", seconds: float = 8.0, peers: int = 4, size: int = 4 * MIB) -> dict:
    """One flood on a fresh host (see the module's docstring)."""
    host = Host()
    try:
        return host.flood(how, seconds, peers, size)
    finally:
        host.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--how", choices=("messages", "multipart", "replay", "all"), default="all")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--size-mb", type=float, default=4.0, help="messages: the large frame's size")
    a = p.parse_args()
    for how in (("messages", "multipart", "replay") if a.how == "all" else (a.how,)):
        print(json.dumps(flood(how, a.seconds, a.peers, int(a.size_mb * MIB))), flush=True)


if __name__ == "__main__":
    main()

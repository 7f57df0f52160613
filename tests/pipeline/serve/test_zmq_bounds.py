"""The zmq face against many clients and slow questions, fast tier (issue 55, finding 4: 24 keyless peers grew the
process by 1.6 GB while its one thread answered a question inline): the real ZmqFront on an ipc socket in front of
a recording stand-in for `Front`. Each test fails with its fix taken out (the planted fault is named)."""
from __future__ import annotations

import threading
import time

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from pipeline.serve.auth import Keys
from pipeline.serve.zmq_api import RCV_HWM, REFUSED, ZmqFront, _Peers, ask, client, watched
from tests.pipeline.serve.test_http_bounds import StubFront

WAIT_S = 30.0                  # a reply that never comes fails the test after this; one that comes takes milliseconds
KEYS = Keys((("alice", b"alice-key-0001"),))


class SlowFront(StubFront):
    """The first question blocks in `ask` until `release` is set (an aggregate read inline); others answer at once."""

    def __init__(self, **serve):
        super().__init__(**serve)
        self.release, self.entered = threading.Event(), threading.Event()

    def ask(self, client, **question):
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(WAIT_S * 2), "the test never released the slow question"
        return super().ask(client, **question)


@pytest.fixture
def zmq_front(tmp_path):
    made, socks = [], []

    def start(front, keys: Keys = Keys()):
        endpoint = f"ipc://{tmp_path}/ask.sock"
        made.append(ZmqFront(front, endpoint, keys))
        return made[-1], endpoint

    def dealer(endpoint: str, key: str | None = "alice-key-0001") -> zmq.Socket:
        socks.append(client(endpoint, key))
        return socks[-1]

    yield start, dealer
    for sock in socks:
        sock.close()
    for face in made:
        if isinstance(face.front, SlowFront):
            face.front.release.set()
        face.close()


def reply(sock: zmq.Socket) -> dict:
    assert sock.poll(int(WAIT_S * 1000), zmq.POLLIN), "no reply: the zmq thread is not reading"
    return msgpack.unpackb(sock.recv(), raw=False)


def question(sock: zmq.Socket, text: str = "hi") -> dict:
    sock.send(msgpack.packb({"question": text}))
    return reply(sock)


def refused(endpoint: str, key: str | None) -> bool:
    """Does the server refuse the handshake of a client giving `key`? (It answers either way: the test never waits
    out a timeout unless the server is not reading.)"""
    sock, monitor = watched(endpoint, key, REFUSED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        assert monitor.poll(int(WAIT_S * 1000)), "no handshake verdict: the zmq thread is not reading"
        return recv_monitor_message(monitor)["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def test_the_fronts_queues_are_sized_to_the_protocol(zmq_front):
    """Planted: no RCVHWM/SNDHWM set -> zmq's 1,000 messages a client each way (1,000 x 64 KiB per keyless peer)."""
    start, _ = zmq_front
    face, _ = start(StubFront(max_body_bytes=4096, max_waiting=3, max_answer_tokens=10))
    sock = face.sock
    assert sock.getsockopt(zmq.RCVHWM) == RCV_HWM <= 8
    assert sock.getsockopt(zmq.SNDHWM) == 3 * (10 + 2)             # every answer in flight's deltas and end
    assert sock.getsockopt(zmq.MAXMSGSIZE) == 4096


def test_a_slow_question_leaves_the_socket_thread_answering_the_others(zmq_front):
    """While one question is held in `front.ask`, another is served and a keyless client refused: the socket thread
    only reads and hands on (planted: `front.ask` called on the socket thread -> no reply until released)."""
    start, dealer = zmq_front
    front = SlowFront(max_waiting=2)
    _, endpoint = start(front, KEYS)
    slow, other = dealer(endpoint), dealer(endpoint)
    slow.send(msgpack.packb({"question": "how many lines say connecting?"}))
    assert front.entered.wait(WAIT_S)
    assert question(other)["text"] == "ok"                          # served by the second worker
    assert refused(endpoint, None)                                   # its handshake vouched for on the socket thread
    assert not slow.poll(0)
    front.release.set()
    assert reply(slow)["text"] == "ok"


def test_past_max_waiting_workers_a_question_is_refused_at_once_with_server_busy(zmq_front):
    """All workers answering: the next question gets 503 server_busy at once, counted; a worker freed takes the next
    (planted: `front.ask` called on the socket thread -> no reply while the slow one is held)."""
    start, dealer = zmq_front
    front = SlowFront(max_waiting=1)
    _, endpoint = start(front, KEYS)
    slow, other = dealer(endpoint), dealer(endpoint)
    slow.send(msgpack.packb({"question": "how many lines say connecting?"}))
    assert front.entered.wait(WAIT_S)
    got = question(other)
    assert got["code"] == 503 and "serve.max_waiting" in got["error"] and front.counts["zmq_busy"] == 1
    front.release.set()
    assert reply(slow)["text"] == "ok"
    deadline = time.monotonic() + WAIT_S
    while (got := question(other)).get("code") == 503:              # the worker gives its place back after its reply
        assert time.monotonic() < deadline, "the worker never took another question"
    assert got["text"] == "ok"


def test_a_client_without_the_key_is_refused_at_the_handshake_before_any_frame_is_queued(zmq_front):
    """No key, a wrong one, or the key in the message instead of the handshake: refused by the ZAP handler, counted;
    nothing asked, no place in the peers' table taken (planted: no PLAIN server -> the keyless handshake succeeds,
    and a peer sending one endless message of MORE frames was queued without bound: +1.5 GB in 3 s)."""
    start, dealer = zmq_front
    front = StubFront(max_zmq_peers=1)
    face, endpoint = start(front, KEYS)
    assert refused(endpoint, None) and refused(endpoint, "wrong-key-0001")
    deadline = time.monotonic() + WAIT_S                              # the server's monitor counts them too
    while front.counts["zmq_handshakes_refused"] < 2:
        assert time.monotonic() < deadline, "refused handshakes not counted"
        time.sleep(0.01)
    assert front.asked == [] and len(face.peers) == 0
    assert not refused(endpoint, "alice-key-0001")
    assert question(dealer(endpoint))["text"] == "ok"                 # the one place was still free
    assert front.asked[0][0] == "alice"                               # the handshake's operator asks


def test_a_client_past_max_zmq_peers_is_refused_and_counted_until_one_leaves(zmq_front):
    """N clients in, the N+1th refused with 503 and counted; when one disconnects its place is free again (planted:
    no peers' table -> the extra client is served)."""
    start, dealer = zmq_front
    front = StubFront(max_zmq_peers=2)
    face, endpoint = start(front)
    first, second, third = (dealer(endpoint, key=None) for _ in range(3))
    assert question(first)["text"] == "ok" and question(second)["text"] == "ok"
    assert question(first)["text"] == "ok"                            # a client in asks again
    got = question(third)
    assert got["code"] == 503 and "serve.max_zmq_peers" in got["error"] and front.counts["zmq_peers_refused"] == 1
    assert len(front.asked) == 3
    first.close()
    deadline = time.monotonic() + WAIT_S                              # the monitor's word that it left
    while (got := question(third)).get("code") == 503:
        assert time.monotonic() < deadline, "a client that left still holds its place"
    assert got["text"] == "ok" and len(face.peers) == 2


def test_the_ask_client_gets_its_answer_and_a_refused_handshake_at_once(zmq_front, monkeypatch):
    monkeypatch.delenv("RINGSPEC_API_KEY", raising=False)
    start, _ = zmq_front
    _, endpoint = start(StubFront(), KEYS)
    assert ask(endpoint, "hi", key="alice-key-0001", timeout_s=WAIT_S)["text"] == "ok"
    with pytest.raises(RuntimeError, match="refused the handshake: wrong API key"):
        ask(endpoint, "hi", key="wrong-key-0001", timeout_s=WAIT_S)
    with pytest.raises(RuntimeError, match="refused the handshake: missing API key"):
        ask(endpoint, "hi", timeout_s=WAIT_S)


def test_a_key_given_to_a_server_without_keys_is_not_in_the_way(zmq_front):
    """RINGSPEC_API_KEY set for another server: the keyless one refuses the PLAIN handshake, asked again without."""
    start, _ = zmq_front
    _, endpoint = start(StubFront())
    assert ask(endpoint, "hi", key="alice-key-0001", timeout_s=WAIT_S)["text"] == "ok"


def test_a_message_read_after_its_connection_closed_holds_no_peers_place():
    """zmq delivers what a connection had queued after the monitor reported it closed: such a message must not
    enter the table, or its place is never given back (the fuzz target zmq_flood found the table full for good after
    a flood of key holders; planted: no `closed` fds -> the late message holds a place)."""
    peers = _Peers(cap=2)
    assert peers.admit(b"a", 15) and peers.admit(b"b", 16) and not peers.admit(b"c", 17)
    peers.gone(15)
    assert len(peers) == 1 and peers.admit(b"a2", 15) and len(peers) == 1     # a late message from fd 15's client
    peers.accepted(15)                                                          # a new connection on fd 15
    assert peers.admit(b"d", 15) and len(peers) == 2 and not peers.admit(b"e", 18)
    peers.gone(15)
    peers.gone(16)
    assert len(peers) == 0

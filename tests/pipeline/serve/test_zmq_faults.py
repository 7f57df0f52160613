"""The zmq face against requests that are malformed or that fail inside the front, fast tier: the real ZmqFront on an
ipc socket, in front of a real `Front` on stand-ins (test_operators.front_of: no model, no owner). Each test names a
finding of issue 48 and fails with its fix taken out."""
from __future__ import annotations

import http.client
import json
import sqlite3
import time

import msgpack
import pytest
import zmq

from pipeline.messages import Answer as AnswerEvent
from pipeline.serve.auth import Keys
from pipeline.serve.http_api import serve_http
from pipeline.serve.metrics import render
from pipeline.serve.zmq_api import ZmqFront, ask
from tests.pipeline.serve.test_operators import front_of

WAIT_S = 30.0                  # a reply that never comes fails the test after this; one that comes takes milliseconds


@pytest.fixture
def served(tmp_path):
    made = []

    def start(front) -> str:
        endpoint = f"ipc://{tmp_path}/ask.sock"
        made.append(ZmqFront(front, endpoint))
        return endpoint

    yield start
    for z in made:
        z.close()


@pytest.fixture
def dealer(served):
    socks = []

    def connect(endpoint: str) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    yield connect
    for sock in socks:
        sock.close()


def reply(sock: zmq.Socket) -> dict:
    assert sock.poll(int(WAIT_S * 1000), zmq.POLLIN), "no reply: the zmq thread is gone"
    return msgpack.unpackb(sock.recv(), raw=False)


def reached_owner(front):
    """The one request in flight, once the zmq thread has sent it to the owner."""
    deadline = time.monotonic() + WAIT_S
    while not front.answers:
        assert time.monotonic() < deadline, "the question never reached the owner"
        time.sleep(0.01)
    (answer,) = front.answers.values()
    return answer


def answered(front, sock: zmq.Socket, question: str) -> dict:
    """Ask over `sock`, answer as the owner would once the question reaches it, return the final reply."""
    sock.send(msgpack.packb({"question": question}))
    answer = reached_owner(front)
    front.on_event(AnswerEvent(id=answer.id, prompt_tokens=answer.prompt_tokens, finish="stop"))
    return reply(sock)


def test_an_unexpected_error_in_one_request_is_its_500_reply_and_the_next_question_is_answered(served, dealer):
    """Finding 8: sqlite3.OperationalError from retrieval killed the zmq thread."""
    front = front_of()
    failing = [sqlite3.OperationalError("database is locked")]

    def retrieve(question, view, budget):
        if failing:
            raise failing.pop()
        return []
    front.framing.retrieve = retrieve
    endpoint = served(front)
    with pytest.raises(RuntimeError, match=r"internal error: OperationalError: database is locked \(code 500\)"):
        ask(endpoint, "when did PIR108 go HH?", timeout_s=WAIT_S)
    assert front.counts["internal_errors"] == 1
    assert "\nringspec_internal_errors_total 1\n" in render(front)          # an operator sees it on /metrics
    assert answered(front, dealer(endpoint), "and now?")["done"] is True


def asked(served, dealer):
    """A front served over zmq, a client's socket, and the answer its question became at the (stand-in) owner."""
    front = front_of()
    sock = dealer(served(front))
    sock.send(msgpack.packb({"question": "when did PIR108 go HH?"}))
    return front, sock, reached_owner(front)


def test_an_answer_that_fails_while_relayed_ends_with_a_500_naming_its_request(served, dealer):
    """Finding 8, the relay thread: an answer whose end cannot be read left its asker waiting forever."""
    front, sock, answer = asked(served, dealer)
    answer.items.put(("done", {"error": None}))       # a broken end: no finish_reason, no usage
    got = reply(sock)
    assert got["id"] == answer.id and got["code"] == 500 and "KeyError" in got["error"]
    assert front.counts["internal_errors"] == 1


@pytest.mark.parametrize("payload, says", [
    (b"", "not a msgpack request"),
    (b"\xc1", "not a msgpack request"),                                       # a byte msgpack never uses
    (b"\x91" * 5000 + b"\xc0", "not a msgpack request"),                     # 5,000 nested arrays
    (b"\x81\xa8question\xa3\xed\xa0\x80", "not a msgpack request"),          # a lone surrogate as UTF-8
    (msgpack.packb({1: "question"}), "not a msgpack request"),               # a map key that is not a string
    (msgpack.packb(["question", "hi"]), "non-empty string \"question\""),
    (msgpack.packb({"question": msgpack.ExtType(5, b"x")}), "non-empty string \"question\""),
    (msgpack.packb({"question": "hi", "max_tokens": 2**64 - 1}), "max_tokens must be an integer"),
    (msgpack.packb({"question": "hi", "deadline_s": float("nan")}), "deadline_s must be a number"),
    (msgpack.packb({"question": "hi", "stream": ["a"]}), "no stream"),
], ids=["empty", "unused-byte", "nested-5000", "lone-surrogate", "int-map-key", "array", "ext-type", "max-tokens-2^64",
        "nan-deadline", "stream-array"])
def test_a_malformed_zmq_request_gets_a_precise_400_and_the_next_question_is_answered(served, dealer, payload, says):
    """Finding 7, the zmq face: what a client sends is a 4xx naming what is wrong, never a 500 or a dead thread."""
    front = front_of()
    endpoint = served(front)
    sock = dealer(endpoint)
    sock.send(payload)
    got = reply(sock)
    assert got["code"] == 400 and says in got["error"], got
    assert front.answers == {} and front.counts["internal_errors"] == 0
    assert answered(front, sock, "and now?")["done"] is True


def test_an_oversize_question_is_refused_on_both_faces_before_the_archive_is_searched(served):
    """Finding 10: retrieval ran before the prompt bound (a 64 KB question held the zmq thread for 1.9 s)."""
    front = front_of(max_prompt_tokens=16)
    endpoint = served(front)
    long = " ".join(f"w{i}" for i in range(5000))
    with pytest.raises(RuntimeError, match=r"serve\.max_prompt_tokens.*\(code 400\)"):
        ask(endpoint, long, timeout_s=WAIT_S)
    server = serve_http(front, "127.0.0.1", 0, Keys())
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=WAIT_S)
        conn.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": long}]}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 400
        assert json.loads(resp.read())["error"]["type"] == "context_length_exceeded"
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
    assert front.searched == []


def test_a_reply_that_cannot_be_packed_is_dropped_and_counted_and_the_thread_goes_on(served, dealer):
    """Finding 7, a counted drop: one reply msgpack cannot write costs that reply only."""
    front, sock, answer = asked(served, dealer)
    answer.items.put(("delta", object()))             # not msgpack: the reply is dropped
    answer.items.put(("delta", "fine"))
    assert reply(sock) == {"id": answer.id, "delta": "fine"}
    assert front.counts["zmq_replies_dropped"] == 1
    assert "\nringspec_zmq_replies_dropped_total 1\n" in render(front)


def test_metrics_tell_each_refusal_and_cut_by_its_bound():
    front = front_of()
    front.counts.update(connections_refused=5, connections_cut=4, heads_too_large=3, zmq_handshakes_refused=2,
                        zmq_peers_refused=1, zmq_busy=6)
    text = render(front)
    for line in ("ringspec_connections_refused_total 5", "ringspec_connections_cut_total 4",
                 "ringspec_heads_too_large_total 3", 'ringspec_zmq_refused_total{reason="handshake"} 2',
                 'ringspec_zmq_refused_total{reason="max_zmq_peers"} 1', 'ringspec_zmq_refused_total{reason="busy"} 6'):
        assert f"\n{line}\n" in text

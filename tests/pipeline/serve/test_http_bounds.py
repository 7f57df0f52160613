"""The HTTP and zmq faces against clients that are wrong, hostile or gone, fast tier: the real servers on real
sockets, in front of a recording stand-in for `Front` (no model). Each test names a finding of issue 19 and fails
with the fix taken out."""
from __future__ import annotations

import collections
import dataclasses
import hmac
import http.client
import json
import queue
import socket
import time

import msgpack
import pytest
import zmq

from pipeline import config
from pipeline.serve import auth
from pipeline.serve.auth import Keys, load_keys
from pipeline.serve.http_api import serve_http
from pipeline.serve.zmq_api import ZmqFront, ask

KEYS_FILE = "# operators of the north plant\nalice  alice-key-0001\nbob bob-key-0002\n"


class Endless:
    """An answer's items that never end: a token every 10 ms, as a long answer being generated sends them."""

    def get(self, timeout=None):
        time.sleep(0.01)
        return "delta", "x"


class StubFront:
    """Records who asked what; answers at once with a fixed text (endless: tokens that never end)."""

    def __init__(self, endless: bool = False, **serve):
        self.serve = dataclasses.replace(config.ServeSection(), **serve)
        self.counts: collections.Counter = collections.Counter()
        self.asked: list[tuple[str, dict]] = []
        self.views: dict = {}
        self.endless = endless

    def health(self):
        return {"status": "ok"}

    def ask(self, client, **question):
        self.asked.append((client, question))
        if self.endless:
            return type("Answer", (), {"id": "q1", "text": "", "items": Endless()})()
        answer = type("Answer", (), {"id": "q1", "text": "ok", "items": queue.Queue()})()
        answer.items.put(("done", {"error": None, "finish_reason": "stop", "prompt_tokens": 3,
                                   "completion_tokens": 1, "retrieved": [], "frame_ms": 0, "queued_ms": 0,
                                   "queued_blocks": 0, "ttft_ms": 1, "total_ms": 1, "stats": {}}))
        return answer

    def cancel(self, answer, why):
        self.counts[why] += 1


@pytest.fixture
def http_server(request):
    made = []

    def start(keys: Keys = Keys(), host: str = "127.0.0.1", **serve):
        front = StubFront(**serve)
        server = serve_http(front, host, 0, keys)
        made.append(server)
        return front, server.server_address[1]

    yield start
    for server in made:
        server.shutdown()
        server.server_close()


def raw(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send bytes, read one response (or what came before the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return reply_of(s)


def reply_of(s: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got or len(got) < _length(got):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _length(got: bytes) -> int:
    head, _, _ = got.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(got)


def status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def post(port: int, path: str, body: dict, key: str | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    hdrs = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}),
            **(headers or {})}
    conn.request("POST", path, json.dumps(body), hdrs)
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"{}")


def get(port: int, path: str, key: str | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})})
    resp = conn.getresponse()
    return resp.status, resp.read()


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


# ---- bodies ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length, code, words", [
    (b"-1", 400, b"one decimal number"), (b"+5", 400, b"one decimal number"), (b"1e3", 400, b"one decimal number"),
    (b"\xd9\xa3", 400, b"one decimal number"), (b"99999999", 413, b"exceeds 1024")])
def test_a_negative_or_malformed_length_is_refused_and_the_body_never_reaches_the_front(http_server, length, code,
                                                                                         words):
    front, port = http_server(max_body_bytes=1024)
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}]}).encode()
    reply = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + length +
                b"\r\n\r\n" + body)
    assert status(reply) == code and words in reply
    assert front.asked == []


def test_two_lengths_or_a_chunked_body_are_refused(http_server):
    front, port = http_server()
    two = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
                    b"Content-Length: 40\r\n\r\n{}")
    chunked = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"2\r\n{}\r\n0\r\n\r\n")
    assert (status(two), status(chunked)) == (400, 411) and front.asked == []


def test_a_body_cut_short_is_a_400_not_a_wait(http_server):
    front, port = http_server(request_timeout_s=60.0)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"pro")
        s.shutdown(socket.SHUT_WR)                      # the client has said all it will
        reply = reply_of(s)
    assert status(reply) == 400 and b"ended after 5 of its 100 bytes" in reply and front.asked == []


# ---- what is counted -----------------------------------------------------------------------------------------------

def test_unknown_paths_are_counted_under_one_label(http_server):
    front, port = http_server()
    for i in range(40):
        assert get(port, f"/probe/{i}?x={i}")[0] == 404
    assert post(port, "/v1/nope", {})[0] == 404
    labels = {k[1] for k in front.counts if isinstance(k, tuple)}
    assert labels == {"other"} and front.counts[("requests", "other", 404)] == 41


def test_a_404_message_quotes_at_most_80_characters_of_the_path(http_server):
    _, port = http_server()
    code, body = get(port, "/" + "a" * 5000)
    assert code == 404 and len(json.loads(body)["error"]["message"]) < 160


# ---- keys and identity ---------------------------------------------------------------------------------------------

def test_keys_are_matched_in_constant_time_against_every_key(monkeypatch):
    keys = load_keys("", "")
    assert not keys.required and keys.identify("anything") is None
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    keys = Keys((("alice", b"alice-key-0001"), ("bob", b"bob-key-0002")))
    assert keys.identify("alice-key-0001") == "alice"
    assert keys.identify("alice-key-000") is None and keys.identify("") is None
    assert len(calls) == 6                          # every key, every time, even after a match


def test_a_key_file_names_each_operator_and_its_name_is_the_fair_queues_identity(http_server, tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS_FILE)
    path.chmod(0o600)
    front, port = http_server(load_keys("", str(path)))
    assert post(port, "/v1/chat/completions", {**CHAT, "user": "bob"}, key="alice-key-0001")[0] == 200
    assert post(port, "/v1/chat/completions", CHAT, key="bob-key-0002")[0] == 200
    assert post(port, "/v1/chat/completions", CHAT, key="carol-key-0003")[0] == 401
    assert [who for who, _ in front.asked] == ["alice", "bob"]      # a "user" field names nobody


def test_without_keys_the_peer_is_the_identity_whatever_the_body_says(http_server):
    front, port = http_server()
    assert post(port, "/v1/chat/completions", {**CHAT, "user": "someone-else"})[0] == 200
    assert front.asked[0][0] == "peer:127.0.0.1"


@pytest.mark.parametrize("text, words", [
    ("alice short\n", "at least 8"), ("alice alice-key-0001\nalice other-key-0002\n", "named twice"),
    ("alice same-key-0001\nbob same-key-0001\n", "another operator's"), ("alice\n", "expected `NAME KEY`"),
    ("# nothing\n", "no `NAME KEY` line")])
def test_a_bad_key_file_is_refused_with_file_and_line(tmp_path, text, words):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(auth.KeysError, match=words):
        load_keys("", str(path))
    with pytest.raises(auth.KeysError, match="No such file"):
        load_keys("", str(tmp_path / "missing"))


def test_a_query_key_opens_the_event_stream_only(http_server):
    front, port = http_server(Keys((("operator", b"op-key-0001"),)))
    assert get(port, "/v1/models?key=op-key-0001")[0] == 401
    assert get(port, "/metrics?key=op-key-0001")[0] == 401
    assert get(port, "/v1/models", key="op-key-0001")[0] == 200
    assert get(port, "/")[0] == 200                  # the console's page holds no data; its fetches carry the key


def test_the_key_comes_from_the_environment_under_the_flag_and_over_the_profile(monkeypatch):
    import run
    parser = run.parser()
    monkeypatch.setenv(auth.ENV_KEY, "env-key-0001")
    assert run._env_key(parser.parse_args(["serve"])) == {"serve.api_key": "env-key-0001"}
    assert run._env_key(parser.parse_args(["serve", "--api-key", "flag-key-0001"])) == {}
    monkeypatch.delenv(auth.ENV_KEY)
    assert run._env_key(parser.parse_args(["serve"])) == {}


# ---- origins -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers, code", [
    ({"Host": "evil.example:8080"}, 403), ({"Host": "localhost:8080"}, 200),
    ({"Origin": "http://evil.example"}, 403), ({"Origin": "null"}, 403),
    ({"Origin": "http://127.0.0.1:8080"}, 200)])
def test_a_loopback_server_answers_its_own_names_only(http_server, headers, code):
    front, port = http_server()
    assert post(port, "/v1/chat/completions", CHAT, headers=headers)[0] == code
    assert len(front.asked) == (code == 200)


def test_allowed_hosts_defaults_and_settings():
    assert auth.allowed_hosts("", "127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert auth.allowed_hosts("", "0.0.0.0") is None                   # a wildcard bind, which needs a key
    assert auth.allowed_hosts("gw1.plant, 10.0.0.5", "0.0.0.0") == {"gw1.plant", "10.0.0.5"}
    assert auth.allowed_hosts("*", "127.0.0.1") is None
    assert [auth.host_of(h) for h in ("a:1", "[::1]:80", "::1", "B")] == ["a", "::1", "::1", "b"]


# ---- slow and many clients -----------------------------------------------------------------------------------------

def test_a_silent_client_is_cut_after_the_request_timeout(http_server):
    front, port = http_server(request_timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
        assert s.recv(65536) == b""                   # cut: the server closed without waiting for the rest
    assert front.asked == [] and front.counts["client_disconnects"] == 1


def test_past_max_connections_a_client_gets_503_and_the_server_carries_on(http_server):
    front, port = http_server(max_connections=2, request_timeout_s=60.0)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
    reply = raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status(reply) == 503 and b"serve.max_connections" in reply
    assert front.counts["connections_refused"] == 1
    for s in idle:
        s.close()
    deadline = time.monotonic() + 60
    while status(raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")) != 200:
        assert time.monotonic() < deadline, "the slots were not given back"


def test_a_client_that_hangs_up_while_its_whole_reply_is_generated_is_cancelled(http_server):
    """A whole reply writes nothing until its end, so the server must look for the hang-up while tokens flow, not
    only when none came for a while (the fault: a long answer ran to its end for a client long gone)."""
    front, port = http_server(endless=True)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 15\r\n\r\n"
                  b'{"prompt": "x"}')
    deadline = time.monotonic() + 60                   # the fix takes at most HANGUP_CHECK_S; the fault, forever
    while not front.counts["client_disconnects"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert front.counts["client_disconnects"] == 1 and len(front.asked) == 1


# ---- config --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("zmq", "tcp://0.0.0.0:7701"), ("pub", "tcp://10.1.2.3:7702")])
def test_zmq_off_loopback_is_refused_at_start_up(key, value):
    with pytest.raises(config.ConfigError, match="not a loopback address, and zmq carries no key"):
        config.parse({"serve": {key: value}})
    config.parse({"serve": {key: "ipc:///tmp/ringspec-test.sock"}})


def test_a_non_loopback_http_needs_a_key_from_any_source():
    with pytest.raises(config.ConfigError, match="RINGSPEC_API_KEY"):
        config.parse({"serve": {"http": "0.0.0.0:8080"}})
    config.parse({"serve": {"http": "0.0.0.0:8080", "api_keys_file": "/etc/ringspec/keys"}})


# ---- zmq -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def zmq_front(tmp_path):
    made = []

    def start(keys: Keys = Keys(), **serve):
        front = StubFront(**serve)
        endpoint = f"ipc://{tmp_path}/ask.sock"
        made.append(ZmqFront(front, endpoint, keys))
        return front, endpoint

    yield start
    for z in made:
        z.close()


def test_zmq_questions_need_the_key_and_are_asked_as_its_operator(zmq_front):
    front, endpoint = zmq_front(Keys((("alice", b"alice-key-0001"),)))
    assert ask(endpoint, "hi", key="alice-key-0001", timeout_s=30)["text"] == "ok"
    with pytest.raises(RuntimeError, match="wrong API key"):
        ask(endpoint, "hi", key="nobody-0001", timeout_s=30)
    assert [who for who, _ in front.asked] == ["alice"]


def test_zmq_drops_the_connection_of_an_oversized_message_and_serves_the_next(zmq_front):
    front, endpoint = zmq_front(max_body_bytes=1024)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(endpoint)
    try:
        sock.send(msgpack.packb({"question": "x" * 4096}))          # over MAXMSGSIZE
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(60_000))                # the drop, or (without the bound) the answer
        assert monitor in ready and sock not in ready
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()
    assert front.asked == []
    assert ask(endpoint, "hi", timeout_s=30)["text"] == "ok"           # the next client is served


def test_zmq_ignores_a_client_field(zmq_front):
    front, endpoint = zmq_front()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(msgpack.packb({"question": "hi", "client": "alice"}))
        assert sock.poll(60_000) and msgpack.unpackb(sock.recv())["text"] == "ok"
    finally:
        sock.close()
    assert front.asked[0][0].startswith("zmq:")

"""The site's wire (pipeline/serve/site_link.py) on real zmq sockets: events cross it as they left, a question reaches its
own stream's group and no other, a group that is not connected fails a question at once (503 at the front), a peer
without the key is cut off in the handshake (a flood of it counted, never queued), junk and hostile frames from a
key holder's socket (on both links) are counted drops, a stranger claiming a group's id gets nothing, a forged or
replayed hello ends nothing, an earlier start's messages are refused both ways (the group's after a site restart,
the site's after a newer site start), and requests to a group started again end with an error instead of waiting.
End to end (a served run on two Ray nodes, one front) is tests/pipeline/test_launch.py's."""
from __future__ import annotations

import secrets
import socket
import struct
import time

import numpy as np
import pytest
import zmq

from pipeline import messages
from pipeline.messages import AnswerDelta, Cancel, Line, Question, decode
from pipeline.serve.site_link import (
    ASKS_HWM,
    DOWN,
    EVENTS_HWM,
    MAX_FRAME_BYTES,
    STRANGERS_HWM,
    UP,
    NodeLink,
    SiteHub,
    curve_keys,
    pack,
    seal,
    secured,
)

PATIENCE_S = 120.0     # a loaded host may take long to connect; nothing here waits unless something is due


def until(get, what: str):
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        got = get()
        if got:
            return got
        time.sleep(0.01)
    pytest.fail(f"{what}: nothing within {PATIENCE_S:.0f} s")


@pytest.fixture
def site():
    key = secrets.token_bytes(32)
    hub = SiteHub("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", key)
    links = {g: NodeLink({**hub.endpoints, "key": key, "group": g, "start": f"{g}-s1"}) for g in ("group0", "group1")}
    for link in links.values():                   # the site routes to a group only once a verified message named it
        link.hello(link.start, {})
    heard: set = set()
    until(lambda: heard.add(getattr(hub.recv(0.1), "group", None)) or heard >= set(links), "both groups' hellos")
    yield hub, links, key
    for link in links.values():
        link.close()
    hub.close()


def raw(kind: int, endpoint: str, routing_id: bytes | None = None, key: bytes | None = None) -> zmq.Socket:
    """A plain socket, as a stranger on the machine would open one (`key`: the run's, for the links' handshake: a
    key holder's socket sending what no group would)."""
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if key is not None:
        secured(sock, key, server=False)
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(endpoint)
    return sock


def received(sock: zmq.Socket, wait_s: float = 0.3) -> list:
    """Every message `sock` got within `wait_s` (the real peer already got what was sent: this only waits for
    stragglers)."""
    out = []
    while sock.poll(int(wait_s * 1000), zmq.POLLIN):
        out.append(sock.recv_multipart())
    return out


def asked(hub: SiteHub, group: str, stream: str, msg) -> None:
    """Send once the group's link is connected (the ROUTER refuses a group it has not met yet)."""
    def sent():
        try:
            messages.send(hub.asks(group, stream), msg)
            return True
        except TimeoutError:
            return False
    until(sent, f"{group} connected")


def test_an_event_arrives_as_it_left_with_its_record_and_its_arrays(site):
    hub, links, _ = site
    line = Line(offset=3, time="", tags=["PIR108"], text="PIR108 HIGH HIGH", loop=0, n_tokens=5, seq=4, drops={},
                window_from_seq=1)
    links["group1"].relay("bgl", line, {"stream": "bgl", "kind": "line", "text": line.text})
    links["group1"].relay("bgl", AnswerDelta(id="q1", ids=np.array([5, 6, 7], np.int32)))
    got = [until(lambda: hub.recv(0.1), "the line"), until(lambda: hub.recv(0.1), "the delta")]
    assert [(g.kind, g.group, g.stream) for g in got] == [("event", "group1", "bgl")] * 2
    assert got[0].record == {"stream": "bgl", "kind": "line", "text": "PIR108 HIGH HIGH"} and got[1].record is None
    assert messages.as_dict(decode(got[0])) == messages.as_dict(line)
    delta = decode(got[1])
    assert isinstance(delta, AnswerDelta) and delta.id == "q1" and delta.ids.tolist() == [5, 6, 7]


def _relay_then_leave(endpoints: dict, key: bytes, n: int, closing) -> None:
    """A forked child, as a group's output actor: relay `n` lines (more than the site's queue and the sockets'
    buffers hold), say `closing`, close the link and return (multiprocessing's child then leaves through os._exit)."""
    link = NodeLink({**endpoints, "key": key, "group": "group0", "start": "group0-s1"})
    link.hello(link.start, {})
    for i in range(n):
        link.relay("bgl", Line(offset=i, time="", tags=[], text="x" * 4000, loop=0, n_tokens=1, seq=i, drops={},
                               window_from_seq=0))
    closing.set()
    link.close()


def test_a_groups_last_events_reach_the_site_after_its_output_actor_leaves():
    """The push's linger is kept by zmq's I/O thread, which os._exit ends: the queued events (the Eof among them)
    were lost unless `close` waits for them (its context's term)."""
    import multiprocessing

    key, n = secrets.token_bytes(32), 3000
    hub = SiteHub("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", key)
    try:
        fork = multiprocessing.get_context("fork")
        closing = fork.Event()
        child = fork.Process(target=_relay_then_leave, args=(hub.endpoints, key, n, closing))
        child.start()
        assert closing.wait(PATIENCE_S)             # read from the close on: what is still queued must wait for it
        got = []
        while len(got) < n + 1 and (msg := hub.recv(5.0)) is not None:
            got.append(msg)
        child.join(PATIENCE_S)
        assert child.exitcode == 0
        assert [g.kind for g in got] == ["hello"] + ["event"] * n
        assert [decode(g).seq for g in got[1:]] == list(range(n))
    finally:
        hub.close()


def test_a_question_reaches_its_streams_group_alone_and_a_cancel_follows(site):
    hub, links, _ = site
    question = Question(id="q7", client="op", max_tokens=9, deadline_s=5.0, ids=np.arange(12, dtype=np.int32))
    asked(hub, "group1", "bgl", question)
    got = until(links["group1"].take, "the question at group1")
    assert [(g.kind, g.stream) for g in got] == [("ask", "bgl")]
    back = decode(got[0])
    assert isinstance(back, Question) and back.ids.tolist() == list(range(12)) and back.max_tokens == 9
    messages.send(hub.asks("group1", "bgl"), Cancel(id="q7"))
    assert isinstance(decode(until(links["group1"].take, "the cancel")[0]), Cancel)
    assert links["group0"].take() == []


def test_a_group_not_connected_fails_a_question_at_once_naming_the_stream(site):
    hub, _, _ = site
    with pytest.raises(TimeoutError, match="stream tep's node \\(group9\\) is not connected"):
        messages.send(hub.asks("group9", "tep"), Cancel(id="q1"))
    hub.send_record("group9", "tep", {"kind": "answer"})          # an answer's record for a gone group: counted
    assert hub.dropped["record_group_gone"] == 1


def test_junk_on_both_links_is_counted_drops_and_the_links_go_on(site):
    """A key holder's sockets write junk to the PULL and to the ROUTER; each message is a counted drop, none reaches
    the front, and both directions still work after."""
    hub, links, key = site
    push = raw(zmq.PUSH, hub.endpoints["events"], key=key)
    dealer = raw(zmq.DEALER, hub.endpoints["asks"], b"group0", key=key)
    try:
        good = seal(key, UP, ["group0-s1", 0, "x", 99], pack("event", "group0", "tep", {}, {}, None))
        push.send_multipart([b"not a mac", *good[1:]])                                     # the old token's place
        push.send_multipart([secrets.token_bytes(32), b"event", b"group0", b"tep", b"\xc1", b"x"])
        push.send_multipart([b"hello"])                                                    # too few frames
        dealer.send_multipart([b"event", b"group0", b"tep", b"x"])                         # groups never write here
        dealer.send_multipart(good)                                                        # not even a MAC'd one
        until(lambda: sum(hub.dropped.values()) == 5 or hub.recv(0.1), "the junk counted")
        assert hub.dropped == {"bad_mac": 1, "malformed: envelope": 1, "frames": 1, "on_the_asks_link": 2}, \
            hub.dropped
        links["group0"].relay("tep", Cancel(id="after"))
        assert decode(until(lambda: hub.recv(0.1), "a good message after junk")).id == "after"
        asked(hub, "group0", "tep", Cancel(id="down"))
        assert decode(until(links["group0"].take, "a question after junk")[0]).id == "down"
        assert received(dealer) == []
    finally:
        push.close()
        dealer.close()


def test_hostile_frames_on_both_links_are_counted_drops_and_the_hub_goes_on(site):
    """Messages built to break the reader: a MAC'd message whose array has dtype 'zz' (a TypeError in numpy), an
    unreadable header, arrays whose bytes lie, 100 frames, an envelope of the wrong shape; a frame over the size
    limit on either link (zmq cuts that peer off). Each is a counted drop; the hub then takes and sends as before."""
    hub, links, key = site
    push = raw(zmq.PUSH, hub.endpoints["events"], key=key)
    try:
        for n, body in enumerate([
                [b"event", b"group0", b"tep", messages_header([["ids", "zz", [1]]]), b"\x00" * 4],
                [b"event", b"group0", b"tep", messages_header([["ids", "<i4", [4]]]), b"\x00" * 3],
                [b"event", b"group0", b"tep", b"\xc1"],
                [b"event", b"\xff", b"tep", messages_header([])],
                [b"event", b"group0", b"tep", messages_header([]), *[b"x"] * 100]]):
            push.send_multipart(seal(key, UP, ["group0-s1", 0, "y", n + 1], body))
        push.send_multipart(seal(key, UP, ["no", "list", "of", "four", "!"], [b"event", b"group0", b"tep",
                                                                          messages_header([])]))
        until(lambda: sum(hub.dropped.values()) == 6 or hub.recv(0.1), "the hostile messages counted")
        assert hub.dropped == {"malformed: TypeError": 1, "malformed: ValueError": 2, "malformed: envelope": 1,
                               "malformed: UnicodeDecodeError": 1, "frames": 1}, hub.dropped
        for endpoint, kind in ((hub.endpoints["events"], zmq.PUSH), (hub.endpoints["asks"], zmq.DEALER)):
            huge = raw(kind, endpoint, key=key)
            huge.send_multipart([b"\x00" * (MAX_FRAME_BYTES + 1)])
            huge.close()
        links["group0"].relay("tep", Cancel(id="after"))
        assert decode(until(lambda: hub.recv(0.1), "a good message after the hostile ones")).id == "after"
        asked(hub, "group0", "tep", Cancel(id="down"))
        assert decode(until(links["group0"].take, "a question after them")[0]).id == "down"
    finally:
        push.close()


def test_a_stranger_claiming_a_groups_id_gets_no_question_and_never_the_key(site):
    """Sockets through the handshake (a key holder's) on the ROUTER with the ids groups had before (`group0`) and
    with the real group's id itself (connected after it: no handover) receive nothing; the group gets all 20
    questions, and no frame it gets carries the key."""
    hub, _, key = site
    tap = raw(zmq.DEALER, hub.endpoints["asks"], b"f" * 32, key)  # the real group, read frame by frame
    push = raw(zmq.PUSH, hub.endpoints["events"], key=key)
    push.send_multipart(seal(key, UP, ["group0-s2", 1, "f" * 32, 1], pack("hello", "group0", "", {}, {}, {})))
    assert until(lambda: hub.recv(0.1), "the group's hello").kind == "hello"
    strangers = [raw(zmq.DEALER, hub.endpoints["asks"], name, key) for name in (b"group0", b"group1")]
    try:
        asked(hub, "group0", "tep", Cancel(id="first"))
        strangers.append(raw(zmq.DEALER, hub.endpoints["asks"], b"f" * 32, key))
        time.sleep(0.2)                                             # connected: it would now take the id over
        for n in range(20):
            messages.send(hub.asks("group0", "tep"), Question(id=f"q{n}", client="op", max_tokens=1, deadline_s=1.0,
                                                              ids=np.arange(3, dtype=np.int32)))
        got = []
        until(lambda: got.extend(received(tap, 0.05)) or len(got) == 21, "every question at the group")
        assert all(key not in b"".join(frames) for frames in got)
        assert [received(s) for s in strangers] == [[], [], []]
    finally:
        for sock in (tap, push, *strangers):
            sock.close()


def test_a_forged_or_replayed_hello_ends_nothing_in_flight(site, default_gguf):
    """A question is in flight to group0 (started again once: s1, then s2). A hello with a new start id and a wrong
    MAC, a real hello captured in another run (another key), group0's hello from its earlier start s1 and its own
    last hello replayed: each is a counted drop, and the question is still waiting. (The wire is tapped by a
    socket holding the key: what a group sends is only readable past the handshake.)"""
    from actors.site import _hello
    from models.tokenizer import Tokenizer
    from pipeline.config import Config
    from pipeline.serve.front import Front
    hub, _, key = site
    push = raw(zmq.PUSH, hub.endpoints["events"], key=key)
    others = []
    try:
        def captured(link_key: bytes, start: str, restarts: dict) -> tuple[NodeLink, list]:
            wire, link = tap(link_key), None
            others.append(wire)
            asks = hub.endpoints["asks"] if link_key == key else "tcp://127.0.0.1:9"   # another run's: elsewhere
            link = NodeLink({"events": wire.getsockopt_string(zmq.LAST_ENDPOINT), "asks": asks,
                             "key": link_key, "group": "group0", "start": start})
            others.append(link)
            link.hello(start, restarts)
            assert wire.poll(int(PATIENCE_S * 1000))
            return link, wire.recv_multipart()
        (_, old), (_, other_run) = captured(key, "group0-s1", {}), captured(secrets.token_bytes(32), "group0-s9", {})
        group0, own = captured(key, "group0-s2", {"target": 1})    # group0 started again: its hello goes through
        push.send_multipart(own)
        front = Front(Config(), Tokenizer.from_gguf(default_gguf), [("tep", hub.asks("group0", "tep"), None, "a")])
        starts = {"group0": "group0-s1"}

        def loop():
            got = hub.recv(0.05)
            if got is not None and got.kind == "hello":            # as the site actor does
                _hello(front, got.group, ["tep"], got.record or {}, starts)
            return got
        assert until(loop, "the new start's hello").record["start"] == "group0-s2"
        answer = until(lambda: _ask(front), "group0 connected")
        assert isinstance(decode(until(group0.take, "the question")[0]), Question)
        forged = seal(secrets.token_bytes(32), UP, ["group0-s3", 5, "z", 1],
                      pack("hello", "group0", "", {}, {}, {"start": "group0-s3"}))
        for frames in (forged, other_run, old, own):
            push.send_multipart(frames)
        until(lambda: loop() or sum(hub.dropped.values()) >= 4, "the forgeries counted")
        assert hub.dropped == {"bad_mac": 2, "stale_start": 1, "replayed": 1}, hub.dropped
        assert not answer.finished and list(front.answers) == [answer.id] and starts["group0"] == "group0-s2"
    finally:
        for link in others:
            link.close()
        push.close()


def tap(key: bytes) -> zmq.Socket:
    """A PULL in the site's place, holding `key`: what a group sends, frame by frame, as a tap on the wire reads
    it."""
    wire = secured(zmq.Context.instance().socket(zmq.PULL), key, server=True)
    wire.setsockopt(zmq.LINGER, 0)
    wire.bind_to_random_port("tcp://127.0.0.1")
    return wire


def test_a_group_takes_only_its_own_starts_verified_questions(site):
    """At a group: a question MAC'd under another key, one for another start of the group, one replayed, and one
    whose array has dtype 'zz' are counted drops; the real question among them is taken."""
    _, _, key = site
    fake = secured(zmq.Context.instance().socket(zmq.ROUTER), key, server=True)   # the site's place, keyed
    fake.setsockopt(zmq.LINGER, 0)
    fake.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    link = NodeLink({"events": "tcp://127.0.0.1:9", "asks": f"tcp://127.0.0.1:{port}", "key": key,
                     "group": "group0", "start": "group0-s5"})
    dealer = link.socket.getsockopt(zmq.ROUTING_ID)
    ask = pack("ask", "group0", "tep", {"kind": "cancel", "id": "c"}, {}, None)
    zz = [b"ask", b"group0", b"tep", messages_header([["a", "zz", [1]]]), b"x"]
    try:
        def sent(frames):
            try:
                fake.send_multipart([dealer, *frames])
                return True
            except zmq.ZMQError:                                    # not connected yet
                return False
        until(lambda: sent(seal(secrets.token_bytes(32), DOWN, ["group0-s5", 0, 1], ask)), "the group's DEALER")
        for envelope, body in ((["group0-s4", 0, 2], ask), (["group0-s5", 0, 3], ask),
                               (["group0-s5", 0, 3], ask), (["group0-s5", 0, 4], zz)):
            assert sent(seal(key, DOWN, envelope, body))
        got: list = []
        until(lambda: got.extend(link.take()) or sum(link.dropped.values()) >= 4, "the group's drops")
        assert [g.header["id"] for g in got] == ["c"]
        assert link.dropped == {"bad_mac": 1, "stale_start": 1, "replayed": 1, "malformed: TypeError": 1}
    finally:
        link.close()
        fake.close()


def messages_header(descr: list) -> bytes:
    import msgpack
    return msgpack.packb([{"kind": "answer_delta", "id": "q"}, descr, None])


def test_the_front_refuses_a_stream_whose_node_is_away_and_ends_requests_of_a_restarted_one(site, default_gguf):
    from models.tokenizer import Tokenizer
    from pipeline.config import Config
    from pipeline.serve.front import Front, RequestError
    from pipeline.serve.metrics import render
    hub, links, _ = site
    front = Front(Config(), Tokenizer.from_gguf(default_gguf),
                  [("tep", hub.asks("group0", "tep"), None, "a"), ("bgl", hub.asks("group9", "bgl"), None, "b")])
    with pytest.raises(RequestError, match="stream bgl's node \\(group9\\) is not connected") as refused:
        front.ask("op", [{"role": "user", "content": "what now?"}], stream="bgl")
    assert refused.value.status == 503 and not front.answers
    answer = until(lambda: _ask(front), "group0 connected")
    assert isinstance(decode(until(links["group0"].take, "the question")[0]), Question)
    assert front.lost({"tep"}, "streams tep were started again") == 1
    kind, info = answer.items.get(timeout=1.0)
    assert kind == "done" and info["error"] == "streams tep were started again" and answer.finished
    assert front.views["tep"].labels() == {"stream": "tep", "node": "a"}
    assert "\nringspec_answers_lost_total 1\n" in render(front)


def _ask(front):
    from pipeline.serve.front import RequestError
    try:
        return front.ask("op", [{"role": "user", "content": "what now?"}], stream="tep")
    except RequestError:
        return None


def test_a_groups_hello_tells_the_site_its_streams_start_records_and_the_node_it_runs_on(site, default_gguf):
    """The site actor died and started again after the groups' Start events: the group's hello carries them, so
    /healthz and /metrics show the target's exactness verdict again (they read it from the stream's Start). A group
    started again on another node (its own died) says so, and its streams' series are labelled with that node."""
    from actors.site import _hello
    from models.tokenizer import Tokenizer
    from pipeline.config import Config
    from pipeline.serve.front import Front
    from pipeline.serve.metrics import render
    hub, links, _ = site
    front = Front(Config(), Tokenizer.from_gguf(default_gguf),
                  [("tep", hub.asks("group0", "tep"), None, "a"), ("bgl", hub.asks("group0", "bgl"), None, "a")])
    assert front.health()["batch_invariant"] is None                     # started after the Start events went by
    record = {"kind": "start", "stream": "tep", "exactness": {"invariant": True}, "platform": {}}
    links["group0"].hello("s1", {"target": 0}, {"tep": record, "zookeeper": {"kind": "start"}})
    got = until(lambda: hub.recv(0.05), "the hello")
    starts: dict = {}
    _hello(front, got.group, ["tep", "bgl"], got.record, starts)
    assert front.views["tep"].start == record and not front.views["bgl"].start     # a stream of the group's only
    assert front.health()["batch_invariant"] is True
    assert '\nringspec_batch_invariant 1\n' in render(front)
    assert front.views["tep"].labels() == {"stream": "tep", "node": "a"}                 # as configured ...
    links["group0"].hello("s2", {"target": 1}, {}, "b")                                 # ... until it runs elsewhere
    _hello(front, "group0", ["tep", "bgl"], until(lambda: hub.recv(0.05), "the hello").record, starts)
    assert front.views["tep"].labels() == front.views["bgl"].labels() | {"stream": "tep"} == {"stream": "tep",
                                                                                              "node": "b"}


def test_the_links_sockets_carry_their_queue_and_frame_caps_and_the_runs_curve_keys(site):
    """Read back from the sockets themselves: every socket of both ends caps a frame at MAX_FRAME_BYTES and runs
    CURVE (the site's the server; the keys, which zmq does not give back, are the run's: the other tests' links
    work, another run's key fails the handshake), and the queues are sized as documented."""
    hub, links, key = site
    for sock in (hub._pull, hub._router):
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_FRAME_BYTES
        assert (sock.getsockopt(zmq.MECHANISM), sock.getsockopt(zmq.CURVE_SERVER)) == (zmq.CURVE, 1)
    assert hub._pull.getsockopt(zmq.RCVHWM) == EVENTS_HWM
    assert (hub._router.getsockopt(zmq.RCVHWM), hub._router.getsockopt(zmq.SNDHWM)) == (STRANGERS_HWM, ASKS_HWM)
    link = links["group0"]
    for sock in (link._push, link._dealer):
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_FRAME_BYTES
        assert (sock.getsockopt(zmq.MECHANISM), sock.getsockopt(zmq.CURVE_SERVER)) == (zmq.CURVE, 0)
    assert link._dealer.getsockopt(zmq.RCVHWM) == ASKS_HWM
    keys = curve_keys(key)
    assert keys == curve_keys(key) and keys != curve_keys(secrets.token_bytes(32))     # the run's, and only its


def zmtp_flood(endpoint: str, socket_type: bytes, most: int) -> tuple[int, bool]:
    """A peer speaking ZMTP 3.0 by hand (NULL mechanism: no key) that sends one message that never ends, 60 KiB
    frames flagged MORE, up to `most` bytes: (the bytes it got onto the connection, whether it was cut off)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    frame = b"\x03" + struct.pack(">Q", 60 << 10) + bytes(60 << 10)
    written = 0
    with socket.create_connection((host, int(port)), timeout=PATIENCE_S) as c:
        try:
            c.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32))
            body = b"\x05READY\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
            c.sendall(b"\x04" + bytes([len(body)]) + body)
            while written < most:
                c.sendall(frame)
                written += len(frame)
        except OSError:
            return written, True
    return written, False


def test_a_keyless_flood_is_cut_off_in_the_handshake_counted_and_the_group_still_served(site):
    """Peers without the key flood both links: one message of endless 60 KiB MORE frames each (a receive
    high-water mark counts whole messages, so without the handshake's refusal the hub's zmq would queue all 64 MB of
    each), and plain zmq sockets sending 1 MiB messages. Each peer is cut off before 16 MB got onto its connection
    (the kernel's buffers, never the hub's queues), each refusal is counted, nothing reaches the front, and the
    group's event and question still cross."""
    hub, links, _ = site
    most = 64 << 20
    cut = [zmtp_flood(hub.endpoints["events"], b"PUSH", most), zmtp_flood(hub.endpoints["asks"], b"DEALER", most)]
    assert all(was_cut and written < 16 << 20 for written, was_cut in cut), cut
    push, dealer = raw(zmq.PUSH, hub.endpoints["events"]), raw(zmq.DEALER, hub.endpoints["asks"])
    try:
        for sock in (push, dealer):
            sock.setsockopt(zmq.SNDHWM, 4)
            for _ in range(8):
                try:
                    sock.send_multipart([bytes(32), bytes(1 << 20)], flags=zmq.NOBLOCK)
                except zmq.Again:                            # never connected: its own queue is full
                    break
        until(lambda: hub.recv(0.05) or hub.dropped["refused: handshake"] >= 4, "the refusals counted")
        assert set(hub.dropped) == {"refused: handshake"}, hub.dropped
        links["group0"].relay("tep", Cancel(id="after"))
        assert decode(until(lambda: hub.recv(0.1), "the group's event after the flood")).id == "after"
        asked(hub, "group0", "tep", Cancel(id="down"))
        assert decode(until(links["group0"].take, "the group's question after the flood")[0]).id == "down"
    finally:
        push.close()
        dealer.close()


def test_an_earlier_group_starts_hello_replayed_after_a_site_restart_retires_nothing():
    """group0's hello from its first start (s1) was captured on the wire. The site is started again (its start 1),
    group0's live start s2 (its second: one restart) says hello, then the captured hello is replayed: it is a
    counted stale start, and group0's questions still reach s2. (Before, the site took any start other than the
    live one as the group's newest: the replay retired s2, whose every message was then stale.)"""
    key = secrets.token_bytes(32)
    wire = tap(key)
    first = NodeLink({"events": wire.getsockopt_string(zmq.LAST_ENDPOINT), "asks": "tcp://127.0.0.1:9", "key": key,
                      "group": "group0", "start": "group0-s1"})
    first.hello("group0-s1", {})
    assert wire.poll(int(PATIENCE_S * 1000))
    captured = wire.recv_multipart()
    hub = SiteHub("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", key, start=1)          # the site, started again
    live = NodeLink({**hub.endpoints, "key": key, "group": "group0", "start": "group0-s2"})
    push = raw(zmq.PUSH, hub.endpoints["events"], key=key)
    try:
        live.hello("group0-s2", {"target": 1})
        assert until(lambda: hub.recv(0.1), "the live start's hello").start == "group0-s2"
        push.send_multipart(captured)
        assert until(lambda: hub.recv(0.1) or hub.dropped["stale_start"], "the replay dropped") == 1, hub.dropped
        asked(hub, "group0", "tep", Cancel(id="still"))
        assert decode(until(live.take, "the question at the live start")[0]).id == "still"
        assert hub.dropped == {"stale_start": 1}, hub.dropped
    finally:
        for end in (first, live, push, wire, hub):
            end.close()


def test_a_group_takes_no_earlier_site_starts_message_once_it_has_seen_a_newer_ones():
    """Messages of two site starts (0 and 1), each MAC'd under the run's key, alternate at a group: once it has
    taken one of start 1, start 0's are counted stale however their counters run. (Before, a group took any
    message whose site id differed from the last one's: alternating the two replayed without end.)"""
    key = secrets.token_bytes(32)
    fake = secured(zmq.Context.instance().socket(zmq.ROUTER), key, server=True)
    fake.setsockopt(zmq.LINGER, 0)
    fake.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    link = NodeLink({"events": "tcp://127.0.0.1:9", "asks": f"tcp://127.0.0.1:{port}", "key": key,
                     "group": "group0", "start": "group0-s1"})
    dealer = link.socket.getsockopt(zmq.ROUTING_ID)

    def cancel(site_start: int, count: int, name: str) -> list:
        return [dealer, *seal(key, DOWN, ["group0-s1", site_start, count],
                              pack("ask", "group0", "tep", {"kind": "cancel", "id": name}, {}, None))]

    def sent(frames):
        try:
            fake.send_multipart(frames)
            return True
        except zmq.ZMQError:                                        # not connected yet
            return False
    try:
        until(lambda: sent(cancel(0, 1, "a")), "the group's DEALER")
        for frames in (cancel(1, 1, "b"), cancel(0, 2, "x"), cancel(1, 2, "c"), cancel(0, 3, "y")):
            assert sent(frames)
        got: list = []
        until(lambda: got.extend(link.take()) or len(got) + sum(link.dropped.values()) >= 5, "all five")
        assert [g.header["id"] for g in got] == ["a", "b", "c"]
        assert link.dropped == {"stale_site": 2}, link.dropped
    finally:
        link.close()
        fake.close()

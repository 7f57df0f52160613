"""The site's wire (pipeline/serve/site.py) on real zmq sockets: events cross it as they left, a question reaches its
own stream's group and no other, a group that is not connected fails a question at once (503 at the front), junk,
hostile frames and strangers (on both links) are counted drops, a stranger claiming a group's id gets nothing, a
forged or replayed hello ends nothing, and requests to a group started again end with an error instead of waiting.
End to end (a served run on two Ray nodes, one front) is tests/pipeline/test_launch.py's."""
from __future__ import annotations

import secrets
import time

import numpy as np
import pytest
import zmq

from pipeline import messages
from pipeline.messages import AnswerDelta, Cancel, Line, Question, decode
from pipeline.serve.site import (
    DOWN,
    MAX_MESSAGE_BYTES,
    UP,
    NodeLink,
    SiteHub,
    pack,
    seal,
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


def raw(kind: int, endpoint: str, routing_id: bytes | None = None) -> zmq.Socket:
    """A plain socket, as a stranger on the machine would open one."""
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
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


def test_strangers_and_junk_on_both_links_are_counted_drops_and_the_links_go_on(site):
    """Strangers (no key) write to the PULL and to the ROUTER; each message is a counted drop, none reaches the
    front, and both directions still work after."""
    hub, links, key = site
    push, dealer = raw(zmq.PUSH, hub.endpoints["events"]), raw(zmq.DEALER, hub.endpoints["asks"], b"group0")
    try:
        good = seal(key, UP, ["group0-s1", "x", 99], pack("event", "group0", "tep", {}, {}, None))
        push.send_multipart([b"not a mac", *good[1:]])                                     # the old token's place
        push.send_multipart([secrets.token_bytes(32), b"event", b"group0", b"tep", b"\xc1", b"x"])
        push.send_multipart([b"hello"])                                                    # too few frames
        dealer.send_multipart([b"event", b"group0", b"tep", b"x"])                         # groups never write here
        dealer.send_multipart(good)                                                        # not even a MAC'd one
        until(lambda: sum(hub.dropped.values()) == 5 or hub.recv(0.1), "the junk counted")
        assert hub.dropped == {"bad_mac": 2, "frames": 1, "on_the_asks_link": 2}, hub.dropped
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
    push = raw(zmq.PUSH, hub.endpoints["events"])
    try:
        for n, body in enumerate([
                [b"event", b"group0", b"tep", messages_header([["ids", "zz", [1]]]), b"\x00" * 4],
                [b"event", b"group0", b"tep", messages_header([["ids", "<i4", [4]]]), b"\x00" * 3],
                [b"event", b"group0", b"tep", b"\xc1"],
                [b"event", b"\xff", b"tep", messages_header([])],
                [b"event", b"group0", b"tep", messages_header([]), *[b"x"] * 100]]):
            push.send_multipart(seal(key, UP, ["group0-s1", "y", n + 1], body))
        push.send_multipart(seal(key, UP, ["no", "list", "of", "three"], [b"event", b"group0", b"tep",
                                                                          messages_header([])]))
        until(lambda: sum(hub.dropped.values()) == 6 or hub.recv(0.1), "the hostile messages counted")
        assert hub.dropped == {"malformed: TypeError": 1, "malformed: ValueError": 2, "malformed: envelope": 1,
                               "malformed: UnicodeDecodeError": 1, "frames": 1}, hub.dropped
        for endpoint, kind in ((hub.endpoints["events"], zmq.PUSH), (hub.endpoints["asks"], zmq.DEALER)):
            huge = raw(kind, endpoint)
            huge.send_multipart([b"\x00" * (MAX_MESSAGE_BYTES + 1)])
            huge.close()
        links["group0"].relay("tep", Cancel(id="after"))
        assert decode(until(lambda: hub.recv(0.1), "a good message after the hostile ones")).id == "after"
        asked(hub, "group0", "tep", Cancel(id="down"))
        assert decode(until(links["group0"].take, "a question after them")[0]).id == "down"
    finally:
        push.close()


def test_a_stranger_claiming_a_groups_id_gets_no_question_and_never_the_key(site):
    """Strangers on the ROUTER with the ids groups had before (`group0`) and with the real group's id itself
    (connected after it: no handover) receive nothing; the group gets all 20 questions, and no frame it gets
    carries the key."""
    hub, _, key = site
    tap = raw(zmq.DEALER, hub.endpoints["asks"], b"f" * 32)      # the real group, read frame by frame
    push = raw(zmq.PUSH, hub.endpoints["events"])
    push.send_multipart(seal(key, UP, ["group0-s2", "f" * 32, 1], pack("hello", "group0", "", {}, {}, {})))
    assert until(lambda: hub.recv(0.1), "the group's hello").kind == "hello"
    strangers = [raw(zmq.DEALER, hub.endpoints["asks"], name) for name in (b"group0", b"group1")]
    try:
        asked(hub, "group0", "tep", Cancel(id="first"))
        strangers.append(raw(zmq.DEALER, hub.endpoints["asks"], b"f" * 32))
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
    last hello replayed: each is a counted drop, and the question is still waiting."""
    from actors.site import _hello
    from models.tokenizer import Tokenizer
    from pipeline.config import Config
    from pipeline.serve.front import Front
    hub, _, key = site
    wire = zmq.Context.instance().socket(zmq.PULL)                  # a tap on the wire: what a group sent, raw
    wire.setsockopt(zmq.LINGER, 0)
    tapped = wire.bind_to_random_port("tcp://127.0.0.1")
    push = raw(zmq.PUSH, hub.endpoints["events"])
    others = []
    try:
        def captured(link_key: bytes, start: str) -> tuple[NodeLink, list]:
            link = NodeLink({"events": f"tcp://127.0.0.1:{tapped}", "asks": hub.endpoints["asks"], "key": link_key,
                             "group": "group0", "start": start})
            others.append(link)
            link.hello(start, {})
            assert wire.poll(int(PATIENCE_S * 1000))
            return link, wire.recv_multipart()
        (_, old), (_, other_run) = captured(key, "group0-s1"), captured(secrets.token_bytes(32), "group0-s9")
        group0, own = captured(key, "group0-s2")                   # group0 started again: its hello goes through
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
        forged = seal(secrets.token_bytes(32), UP, ["group0-s3", "z", 1],
                      pack("hello", "group0", "", {}, {}, {"start": "group0-s3"}))
        for frames in (forged, other_run, old, own):
            push.send_multipart(frames)
        until(lambda: loop() or sum(hub.dropped.values()) >= 4, "the forgeries counted")
        assert hub.dropped == {"bad_mac": 2, "stale_start": 1, "replayed": 1}, hub.dropped
        assert not answer.finished and list(front.answers) == [answer.id] and starts["group0"] == "group0-s2"
    finally:
        for link in others:
            link.close()
        wire.close()
        push.close()


def test_a_group_takes_only_its_own_starts_verified_questions(site):
    """At a group: a question MAC'd under another key, one for another start of the group, one replayed, and one
    whose array has dtype 'zz' are counted drops; the real question among them is taken."""
    _, _, key = site
    fake = zmq.Context.instance().socket(zmq.ROUTER)               # the site's place, as a stranger could bind it
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
        until(lambda: sent(seal(secrets.token_bytes(32), DOWN, ["group0-s5", "site", 1], ask)), "the group's DEALER")
        for envelope, body in ((["group0-s4", "site", 2], ask), (["group0-s5", "site", 3], ask),
                               (["group0-s5", "site", 3], ask), (["group0-s5", "site", 4], zz)):
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

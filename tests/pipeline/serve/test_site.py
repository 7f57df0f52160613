"""The site's wire (pipeline/serve/site.py) on real zmq sockets: events cross it as they left, a question reaches its
own stream's group and no other, a group that is not connected fails a question at once (503 at the front), junk
and strangers are counted drops, and requests to a group started again end with an error instead of waiting.
End to end (a served run on two Ray nodes, one front) is tests/pipeline/test_launch.py's."""
from __future__ import annotations

import secrets
import time

import numpy as np
import pytest
import zmq

from pipeline import messages
from pipeline.messages import AnswerDelta, Cancel, Line, Question, decode
from pipeline.serve.site import NodeLink, SiteHub

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
    token = secrets.token_bytes(16)
    hub = SiteHub("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", token)
    links = {g: NodeLink({**hub.endpoints, "token": token, "group": g}) for g in ("group0", "group1")}
    yield hub, links, token
    for link in links.values():
        link.close()
    hub.close()


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


def test_strangers_and_junk_are_counted_drops_and_the_link_goes_on(site):
    hub, links, token = site
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(hub.endpoints["events"])
    try:
        raw.send_multipart([b"not the token", b"event", b"group0", b"tep", b"x"])
        raw.send_multipart([token, b"event", b"group0", b"tep", b"\xc1"])                  # not msgpack
        raw.send_multipart([token, b"event", b"group0", b"tep",                           # an array's bytes lie
                            messages_header([["ids", "<i4", [4]]]), b"\x00" * 3])
        raw.send_multipart([token, b"hello"])                                              # too few frames
        until(lambda: sum(hub.dropped.values()) == 4 or hub.recv(0.1), "the junk counted")
        assert hub.dropped["bad_token"] == 1 and sum(hub.dropped.values()) == 4, hub.dropped
        links["group0"].relay("tep", Cancel(id="after"))
        assert decode(until(lambda: hub.recv(0.1), "a good message after junk")).id == "after"
    finally:
        raw.close()


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

"""pipeline.messages: every kind crosses a real channel field for field (arrays bit for bit, as views into the slot),
and what is not exactly one known message is refused with an error naming the kind and the field."""
from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pytest

from pipeline.channel import Channel, ChannelSpec
from pipeline.messages import (
    KINDS,
    Answer,
    AnswerDelta,
    Assessment,
    Cancel,
    Capacity,
    Checkpoint,
    Close,
    Constrain,
    Closed,
    Commit,
    Eof,
    Halt,
    Line,
    MessageError,
    Observe,
    Picked,
    Prefill,
    Proposal,
    Question,
    Ready,
    Recovery,
    Restart,
    Restarted,
    Rollback,
    Scored,
    Start,
    Status,
    StreamEnd,
    Verdict,
    Verify,
    as_dict,
    copied,
    decode,
    send,
)

RNG = np.random.default_rng(16)
FIGURES = {"actor": "target", "pid": 4242, "wall_s": 1.5, "busy_share": 0.25, "cpus": [0, 1]}
COUNTS = dict(sent=30, tokens=824, dropped_full=0, invalid_utf8=1, nul_bytes=0, oversized=2, lines=31, stopped=False)


def _ids(n: int, dtype) -> np.ndarray:
    return RNG.integers(0, 49152, n).astype(dtype)


def _mask(rows: int, cols: int) -> np.ndarray:
    mask = np.where(RNG.random((rows, cols)) < 0.5, np.float32(-np.inf), np.float32(0.0))
    mask[0, 0] = np.float32("nan")                   # any bit pattern crosses unchanged
    return mask


def _q(rows: int, vocab: int = 64) -> np.ndarray:
    q = RNG.random((rows, vocab))
    return q / q.sum(axis=1, keepdims=True)


# One instance per kind (and per shape a kind takes: with and without its optional fields), as the actors send them.
SAMPLES = {
    "prefill": Prefill(pick=True, score=False, ring_from=600, ids=_ids(5, np.int64),
                       pos=np.arange(100, 105, dtype=np.int64),
                       mask=_mask(5, 40), recent=np.zeros(0, np.int64), slots=np.arange(4, 9, dtype=np.int64)),
    "verify": Verify(epoch=3, block=1, ring_from=17, ids=_ids(4, np.int64), pos=np.array([7, 8, 9, 10], np.int64),
                     mask=_mask(4, 24), parent=np.array([-1, 0, 1], np.int64), recent=np.array([5, 6], np.int64),
                     slots=np.array([11, 12, 13, 14], np.int64), q=_q(3)),
    "verify a tree": Verify(epoch=3, block=2, ring_from=0, ids=_ids(4, np.int64), pos=np.array([7, 8, 8, 9], np.int64),
                            mask=_mask(4, 23), parent=np.array([-1, -1, 0], np.int64), recent=np.zeros(0, np.int64),
                            slots=np.array([11, 12, 13], np.int64), q=None,
                            path=np.array([[0, 0, 0], [0, 1, 1], [0, 2, 2], [0, 1, 3]], np.int64)),
    "verify without q": Verify(epoch=3, block=0, ring_from=0, ids=_ids(1, np.int64), pos=np.array([7], np.int64),
                               mask=_mask(1, 9), parent=np.zeros(0, np.int64), recent=np.zeros(0, np.int64),
                               slots=np.array([11], np.int64), rule_state="FIR1"),
    "constrain": Constrain(rule={"kind": "identifiers", "allowed": ["FIR123"]}),
    "constrain nothing": Constrain(rule=None),
    "close": Close(),
    "ready": Ready(exactness={"invariant": True, "passes": 11, "max_abs_logit": 0.0, "where": ""},
                   platform={"cpu": "AMD EPYC", "simd": "AVX2", "isa": ["AVX", "AVX2"]}),
    "scored": Scored(nll=np.array([np.nan, 2.5, 0.125], np.float32)),
    "picked": Picked(next=504),
    "verdict": Verdict(epoch=3, block=1, rows=[0, 1, 2], next=966, t0=10.5, t1=10.75, forward_s=0.2),
    "closed": Closed(figures=FIGURES),
    "observe": Observe(ids=_ids(26, np.int64)),
    "rollback": Rollback(position=1 << 33, forget=True),
    "redraft": Restart(epoch=4, n=120, pending=253, budget=60, length=-1, ids=_ids(3, np.int64)),
    "commit": Commit(epoch=4, length=3, ids=np.arange(10, dtype=np.int64)[::3]),          # strided: sent as its values
    "halt": Halt(),
    "proposal": Proposal(epoch=4, block=2, n=124, pending=28, t0=1.0, t1=1.5, tokens=_ids(3, np.int64),
                         parent=np.array([-1, 0, 1], np.int64), q=_q(3)),
    "proposal without a guess": Proposal(epoch=4, block=2, n=-1, pending=-1, t0=1.0, t1=1.0,
                                         tokens=np.zeros(0, np.int64), parent=np.zeros(0, np.int64)),
    "line": Line(offset=32, time="2024-05-01 01:32:20", tags=["AIR003_3"], text="01:32:20 AIR003_3 H PURGE C CONC",
                 loop=0, n_tokens=6, seq=1, drops={"queue_full": 0, "invalid_utf8": 0}, ids=_ids(6, np.int32)),
    "line as prefilled": Line(offset=32, time="", tags=[], text="ä <|im_start|>", loop=2, n_tokens=6, seq=7,
                              drops={}, nll_sum=12.5, nll_n=5, window_from_seq=1, backlog=0),
    "eof": Eof(**COUNTS, figures=[FIGURES, {**FIGURES, "actor": "ingest"}]),
    "question": Question(id="q17-1", client="peer:127.0.0.1", max_tokens=64, deadline_s=30.0, ids=_ids(40, np.int32)),
    "cancel": Cancel(id="q17-1"),
    "start": Start(exactness={"invariant": False}, platform={"cpu": "x"}, model="default", draft="suffix", sink=4,
                   window=512, ring=576),
    "assessment": Assessment(trigger="every", offsets=[32, 643], lines=10, window_lines=10,
                             window_tags=["AIR001_1", "FIR123"], latency_ms=7243.5, stats={"generated": 60},
                             checkpoint={"offset": 643, "offsets": [611, 643], "due": None}, ids=_ids(60, np.int32)),
    "checkpoint": Checkpoint(source="/var/log/dcs.csv", offset=643, loop=0, seq=10, offsets=[611, 643], position=400,
                             window_offset=32, window_loop=0, window_seq=1, lines=10, since=0, due="pattern"),
    "recovery": Recovery(lines=31, offsets=[32, 643], position=812),
    "restart": Restarted(actor="target", cause="actor target (pid 7) died: signal 9 (SIGKILL)",
                         restarts={"target": 1}, recovery_s=6.25, resumed_after=643),
    "answer_delta": AnswerDelta(id="q17-1", ids=_ids(2, np.int32)),
    "answer": Answer(id="q17-1", prompt_tokens=40, finish="stop", stats={"tokens_per_s": 21.5}, queued_ms=3.5,
                     completion_tokens=12),
    "answer refused": Answer(id="q17-2", error="deadline of 30 s passed while queued", prompt_tokens=40),
    "status": Status(queue=1, backlog=2, lines_inbox=3, kv_pool_bytes=54_788_096, position=4000, lines=120,
                     stream_tokens=3480, packed_feeds=7, stream_share=0.62, capacity_lines_per_s=4.7, answers=3,
                     expired=0, cancelled=1, preempted=2, analysing=True, backlog_max_depth=5, tokens_per_s=21.0,
                     generated=180, accepted_per_verify=2.81, acceptance_rate=0.57, verify_calls=64),
    "stream_end": StreamEnd(**COUNTS),
    "capacity": Capacity(line_rate=20.0, lines_per_s=4.7, tokens_per_s=131.0, stream_share=0.5),
}


@pytest.fixture
def link():
    """A real channel, both ends in this process: (producer, consumer)."""
    spec = ChannelSpec(f"test_msg_{uuid.uuid4().hex[:8]}", slots=4, payload_bytes=1 << 16, header_bytes=4096)
    with Channel.create(spec) as producer, Channel.attach(spec.name) as consumer:
        yield producer, consumer


def _fields(msg) -> dict:
    return {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}


def _assert_same(got, sent) -> None:
    assert type(got) is type(sent)
    for name, value in _fields(sent).items():
        other = getattr(got, name)
        if isinstance(value, np.ndarray):
            assert isinstance(other, np.ndarray), name
            assert (other.dtype, other.shape) == (value.dtype, value.shape), name
            assert other.tobytes() == value.tobytes(), name          # bit for bit (NaN and -inf included)
        else:
            assert type(other) is type(value) and other == value, name


# ---- round trips ---------------------------------------------------------------------------------------------------

def test_every_kind_has_a_sample():
    assert {msg.kind for msg in SAMPLES.values()} == set(KINDS)


@pytest.mark.parametrize("name", SAMPLES)
def test_each_message_round_trips_through_a_channel_field_for_field(link, name):
    producer, consumer = link
    sent = SAMPLES[name]
    send(producer, sent, timeout=5)
    with consumer.recv(timeout=5) as received:
        assert received.header["kind"] == sent.kind
        _assert_same(decode(received), sent)


def test_decoded_arrays_are_views_into_the_slot_until_copied(link):
    """No copy on the way in: the arrays are the slot's (as `Message.arrays` are); `copied` takes them out."""
    producer, consumer = link
    send(producer, SAMPLES["verify"], timeout=5)
    with consumer.recv(timeout=5) as received:
        msg = decode(received)
        arrays = [msg.ids, msg.pos, msg.mask, msg.parent, msg.recent, msg.slots, msg.q]
        assert all(np.shares_memory(a, consumer.buffer) for a in arrays)
        kept = copied(msg)
    assert not any(np.shares_memory(getattr(kept, n), consumer.buffer) for n in ("ids", "mask", "q"))
    _assert_same(kept, SAMPLES["verify"])


def test_an_unset_optional_array_is_not_sent(link):
    producer, consumer = link
    send(producer, SAMPLES["line as prefilled"], timeout=5)
    with consumer.recv(timeout=5) as received:
        assert "ids" not in received.arrays and decode(received).ids is None


def test_as_dict_is_the_header_with_unset_annotations_left_out():
    """The journal and PUB record of a line: the kind first, the fields in order, no tokens; a line not scored has no
    nll fields at all (not nulls), as before the messages were typed."""
    line = dataclasses.replace(SAMPLES["line"], ids=None, window_from_seq=1, backlog=0)
    assert list(as_dict(line)) == ["kind", "offset", "time", "tags", "text", "loop", "n_tokens", "seq", "drops",
                                   "window_from_seq", "backlog", "recovery"]
    scored = as_dict(dataclasses.replace(line, nll_sum=3.5, nll_n=2))
    assert list(scored)[9:11] == ["nll_sum", "nll_n"] and scored["kind"] == "line"


# ---- refusals --------------------------------------------------------------------------------------------------------

def _decode_raw(link, header: dict, arrays: dict | None = None):
    producer, consumer = link
    producer.send(header, arrays, timeout=5)
    with consumer.recv(timeout=5) as received:
        return decode(received)


def test_an_unknown_kind_is_refused(link):
    with pytest.raises(MessageError, match="unknown message kind 'gossip'"):
        _decode_raw(link, {"kind": "gossip"})
    with pytest.raises(MessageError, match="unknown message kind None"):
        _decode_raw(link, {"epoch": 3})


def test_a_missing_field_is_refused_by_name(link):
    with pytest.raises(MessageError, match="'verdict' lacks field 'rows'"):
        _decode_raw(link, {"kind": "verdict", "epoch": 3, "block": 1, "next": 5, "t0": 1.0,
                           "t1": 2.0, "forward_s": 0.5})
    with pytest.raises(MessageError, match="'observe' lacks field 'ids'"):
        _decode_raw(link, {"kind": "observe"})


def test_an_array_of_the_wrong_dtype_or_rank_is_refused(link):
    with pytest.raises(MessageError, match="'observe' field 'ids': expected a int64 array of rank 1, got int32"):
        _decode_raw(link, {"kind": "observe"}, {"ids": np.arange(4, dtype=np.int32)})
    with pytest.raises(MessageError, match="'commit' field 'ids': .* got int64 of rank 2"):
        _decode_raw(link, {"kind": "commit", "epoch": 1, "length": 3}, {"ids": np.zeros((2, 2), np.int64)})


def test_a_plain_field_of_the_wrong_type_is_refused(link):
    with pytest.raises(MessageError, match="'picked' field 'next': expected int, got str"):
        _decode_raw(link, {"kind": "picked", "next": "504"})
    with pytest.raises(MessageError, match="'picked' field 'next': expected int, got bool"):
        _decode_raw(link, {"kind": "picked", "next": True})
    with pytest.raises(MessageError, match="'rollback' field 'forget': expected bool, got int"):
        _decode_raw(link, {"kind": "rollback", "position": 3, "forget": 1})
    assert _decode_raw(link, {"kind": "picked", "next": 504}).next == 504
    line = Line(offset=0, time="", tags=[], text="x", loop=0, n_tokens=1, seq=0, drops={}, nll_n=1)
    header = {"kind": "line", **{f.name: getattr(line, f.name) for f in dataclasses.fields(line) if f.name != "ids"}}
    assert _decode_raw(link, {**header, "nll_sum": 0}).nll_sum == 0                      # an int is a fine float


def test_an_unknown_field_is_refused(link):
    with pytest.raises(MessageError, match="'halt' has unknown field 'epoch'"):
        _decode_raw(link, {"kind": "halt", "epoch": 3})
    with pytest.raises(MessageError, match="'cancel' has unknown field 'ids'"):
        _decode_raw(link, {"kind": "cancel", "id": "q1"}, {"ids": np.zeros(1, np.int32)})

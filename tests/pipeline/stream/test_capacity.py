"""The stream's share of the target and its measured capacity (pipeline/stream/capacity.py), at stated times."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.stream.capacity import MIN_STREAM_S, TAU_S, StreamClock


def test_the_share_is_the_streams_part_of_the_recent_time_and_the_past_fades():
    clock = StreamClock()
    assert clock.share == 1.0                             # nothing ran: the stream is owed nothing
    clock.stream(3.0, 90, 3, now=3.0)
    clock.other(1.0, now=4.0)
    assert clock.share == pytest.approx(3.0 * 0.9672 / (3.0 * 0.9672 + 1.0), rel=1e-3)   # e^(-1/30) on the 3 s
    clock.other(9.0, now=4.0 + 5 * TAU_S)                 # long after: the old stream seconds are nearly gone
    assert clock.share < 0.01


def test_capacity_is_what_the_stream_carried_per_second_of_target_time_once_measured():
    clock = StreamClock()
    clock.stream(MIN_STREAM_S / 2, 400, 14, now=MIN_STREAM_S / 2)
    assert clock.capacity() is None                       # too little measured to say
    for i in range(2, 40):
        clock.stream(0.5, 65, 2, now=MIN_STREAM_S / 2 + 0.5 * i)
        clock.other(0.5, now=MIN_STREAM_S / 2 + 0.5 * i)  # questions in between do not lower the capacity
    tokens_per_s, lines_per_s = clock.capacity()
    assert 125 <= tokens_per_s <= 135 and 3.9 <= lines_per_s <= 4.2


def test_waiting_lines_go_first_once_the_stream_had_less_than_its_share():
    """The cache owner's schedule (pipeline/stream/schedule.py) puts the stream before a question or an analysis
    while lines wait and the clock's share is below serve.stream_share."""
    from pipeline.stream.schedule import Turn, owed

    clock = StreamClock()
    clock.stream(1.0, 30, 1, now=1.0)
    clock.other(3.0, now=4.0)                             # questions took three quarters of the target
    turn = Turn(serving=True, question_waits=True, lines_wait=True, backlog=True, stream_share=clock.share,
                share_min=0.5, due="", target_busy=False, ended=False, drain=False)
    assert owed(turn)
    assert not owed(replace(turn, lines_wait=False, backlog=False))      # nothing waits: questions first
    assert not owed(replace(turn, share_min=0.0))                        # 0: questions always first
    assert not owed(replace(turn, serving=False))
    clock.stream(4.0, 120, 4, now=8.0)
    assert clock.share > 0.5 and not owed(replace(turn, stream_share=clock.share))


def test_the_owner_warns_once_when_the_stream_goes_in_slower_than_the_profiles_line_rate():
    """`replay.line_rate` is a claim: once the measured capacity is below it, one Capacity event goes to output."""
    from types import SimpleNamespace

    from actors.cache_owner import Owner

    sent = []
    out = SimpleNamespace(send=lambda header, arrays, timeout=None: sent.append(header) or len(sent))
    owner = SimpleNamespace(clock=StreamClock(), cfg=SimpleNamespace(replay=SimpleNamespace(line_rate=5.0)), out=out,
                            engine=SimpleNamespace(to_target=SimpleNamespace(in_flight=lambda: False)))
    t = 0.0
    for _ in range(40):                                   # 40 feeds of 2 lines taking 1 s each: 2 lines/s
        owner.clock.sent(60, 2, now=t)
        t += 1.0
        Owner.stream_ran(owner, now=t)
    assert [h["kind"] for h in sent] == ["capacity"]      # once, not at every feed
    assert sent[0]["line_rate"] == 5.0 and 1.9 < sent[0]["lines_per_s"] < 2.1
    owner.cfg.replay.line_rate, owner.clock.warned, sent[:] = 1.0, False, []
    owner.clock.sent(60, 2, now=t)
    Owner.stream_ran(owner, now=t + 1.0)
    assert sent == []                                     # 2 lines/s sustains a claim of 1

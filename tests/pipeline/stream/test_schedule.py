"""The cache owner's schedule (pipeline/stream/schedule.py), driven directly: a turn's state in, the work out."""
from __future__ import annotations

from dataclasses import replace

from pipeline.stream.schedule import Turn, Work, next_work

IDLE = Turn(serving=True, question_waits=False, lines_wait=False, backlog=False, stream_share=1.0, share_min=0.5,
            due="", target_busy=False, ended=False, drain=False)


def test_a_waiting_question_goes_before_an_analysis_and_the_stream():
    assert next_work(replace(IDLE, question_waits=True, due="every", lines_wait=True, backlog=True)) is Work.ANSWER


def test_an_owed_stream_goes_before_a_question_and_an_analysis():
    owed = replace(IDLE, question_waits=True, due="pattern", lines_wait=True, backlog=True, stream_share=0.2)
    assert next_work(owed) is Work.BACKLOG
    assert next_work(replace(owed, backlog=False)) is Work.LISTEN          # the line is in the channel: take it
    assert next_work(replace(owed, share_min=0.0)) is Work.ANSWER          # 0: questions always first


def test_serving_a_periodic_analysis_waits_for_waiting_lines_but_a_matching_alarms_does_not():
    waiting = replace(IDLE, due="every", lines_wait=True, backlog=True)
    assert next_work(waiting) is Work.BACKLOG
    assert next_work(replace(waiting, due="pattern")) is Work.ASSESS
    assert next_work(replace(waiting, serving=False)) is Work.ASSESS      # replay: analyses every N lines, as due
    assert next_work(replace(waiting, lines_wait=False, backlog=False)) is Work.ASSESS


def test_serving_nothing_is_sent_while_the_target_runs_a_line_pass():
    busy = replace(IDLE, target_busy=True, backlog=True, lines_wait=True)
    assert next_work(busy) is Work.WAIT_TARGET
    assert next_work(replace(busy, question_waits=True)) is Work.ANSWER   # a question is asked between passes
    assert next_work(replace(busy, serving=False)) is Work.BACKLOG        # replay pipelines its line passes


def test_the_backlog_goes_in_before_new_lines_and_the_end_closes_only_once_drained():
    assert next_work(replace(IDLE, backlog=True, lines_wait=True, ended=True)) is Work.BACKLOG
    assert next_work(replace(IDLE, ended=True)) is Work.WAIT_DRAIN
    assert next_work(replace(IDLE, ended=True, drain=True)) is Work.CLOSE
    assert next_work(IDLE) is Work.LISTEN

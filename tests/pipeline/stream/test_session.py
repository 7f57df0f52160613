"""A stream's session (pipeline/stream/session.py), the one owner of what happens to a line, for every launcher.

Its bookkeeping against positions stated by hand, on an engine reduced to what the session reads (positions, a feed,
the window): which lines are in view, what a checkpoint names, what a restart takes back, and that feeding lines
together or one by one changes none of it (the cache owner packs them, the serial replay does not). Its assessments
on the real model are the serial replay's, whose journal equals the pipeline's (tests/pipeline/test_launch.py
`test_pipelined_assessments_equal_the_serial_engine`).
"""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.config import ReplaySection
from pipeline.messages import Line
from pipeline.stream.forms import Stated
from pipeline.stream.session import StreamSession
from tests.paths import ROOT


class Ring:
    """What a session reads of its engine: the committed position, a pending token, the window, a feed."""

    def __init__(self, window: int):
        self.index, self.pending, self.spec = SimpleNamespace(n=0), None, SimpleNamespace(window=window)

    def feed(self, ids, score: bool = False):
        self.index.n += len(ids)
        return np.zeros(len(ids)) if score else None


def line(offset: int, n_tokens: int, text: str = "x", tags=("T1",)) -> Line:
    return Line(offset=offset, time="", tags=list(tags), text=text, loop=0, n_tokens=n_tokens, seq=offset + 1,
                drops={}, ids=np.arange(n_tokens, dtype=np.int32))


def session(window: int = 10, **replay) -> StreamSession:
    return StreamSession(Ring(window), SimpleNamespace(), ReplaySection(**replay), "log.csv")


def test_a_line_stays_in_view_while_a_query_at_the_rings_end_sees_its_last_token():
    s = session(window=10)
    s.feed([line(0, 4)])                                  # positions 0..3
    s.feed([line(1, 4)])                                  # 4..7
    s.feed([line(2, 5)])                                  # 8..12: a query at 12 sees 3..12
    assert [ln.offset for ln in s.window] == [0, 1, 2] and [(ln.first, ln.end) for ln in s.window][0] == (0, 3)
    s.feed([line(3, 1)])                                  # 13: sees 4..13; line 0 ended at 3
    assert [ln.offset for ln in s.window] == [1, 2, 3]


def test_a_checkpoint_names_the_lines_committed_since_the_last_one_and_the_oldest_in_view():
    s = session(window=10)
    for i in range(4):
        s.feed([line(i * 100, 4)])                        # 16 tokens; the oldest in view ends at >= 6: the second
    point = s.checkpoint()
    assert (point.source, point.offset, point.seq, point.position) == ("log.csv", 300, 301, 16)
    assert point.offsets == [0, 100, 200, 300] and point.lines == 4
    assert (point.window_offset, point.window_seq) == (100, 101)
    s.feed([line(400, 2)])
    assert s.checkpoint().offsets == [400] and s.checkpoint().offsets == []


def test_lines_fed_together_or_one_by_one_leave_the_same_window_counts_and_triggers():
    lines = [line(i, 3 + i % 4, text="HH" if i == 7 else "x") for i in range(12)]
    apart, together = session(window=20, every_lines=5, trigger_pattern=r"\bHH\b"), session(window=20, every_lines=5,
                                                                                           trigger_pattern=r"\bHH\b")
    fired_apart, fired_together = [], []
    for ln in lines:
        apart.feed([ln])
        if apart.due:
            fired_apart.append((apart.lines, apart.assessed()))
    for group in (lines[0:5], lines[5:8], lines[8:10], lines[10:12]):       # each ends where a trigger fires, or not
        together.feed(group)
        if together.due:
            fired_together.append((together.lines, together.assessed()))
    assert fired_apart == fired_together == [(5, "every"), (8, "pattern")]
    assert list(apart.window) == list(together.window) and apart.stream_tokens == together.stream_tokens
    assert vars(apart.checkpoint()) == vars(together.checkpoint())


def test_a_restart_takes_back_the_counts_and_asks_the_interrupted_assessment_once_the_window_is_refilled():
    before = session(window=50, every_lines=4)
    for i in range(6):
        before.feed([line(i, 2)])                         # fires at 4; 2 since
    before.assessed()
    before.due = "pattern"                                # due when the process died
    point = before.checkpoint()
    after = session(window=50, every_lines=4)
    after.restore(point)
    for i in range(2, 6):
        after.recover(line(i, 2))                         # the window, read again: neither counted nor committed
    assert after.lines == 6 and after.since_checkpoint == [] and after.recovered == [2, 3, 4, 5]
    assert [ln.offset for ln in after.window] == [2, 3, 4, 5] and after.due is None
    assert after.take_interrupted() and after.due == "pattern" and not after.take_interrupted()
    after.assessed()
    after.feed([line(6, 2)])
    after.feed([line(7, 2)])                              # the count goes on from the checkpoint's: 2 + 2 = 4
    assert after.due == "every" and after.lines == 8 and after.resumed_after == 5


@pytest.mark.parametrize("flags,says", [(["--pub", "ipc:///tmp/x"], "--pub"), (["--follow"], "--follow"),
                                        (["--resume", "--journal", "j.jsonl"], "--resume")])
def test_the_serial_launcher_refuses_what_one_process_cannot_do_with_a_clear_message(flags, says):
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "replay", "--launcher", "serial", *flags],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and says in proc.stderr and "serial launcher" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_assessment_states_what_the_lines_since_the_last_one_state_and_the_latest_line_when_none_came():
    """The tags newest first and the highest severity of the lines since the last assessment that every row can see
    (pipeline/stream/forms.py stated_by); with no new line, those of the latest line in view."""
    s = StreamSession(Ring(40), SimpleNamespace(writer=SimpleNamespace(scratch=lambda: 0),
                                                spec=SimpleNamespace(window=40)), ReplaySection(), "log.csv")
    ask = np.zeros(4, np.int32)
    s.feed([line(0, 4, "01:00:00 V160 H VLV POS HIGH ALM", ("V160",))])
    s.assessed()
    s.feed([line(1, 4, "07:33:00 PIR108 HH PRES REACT HIGH HIGH ALM", ("PIR108",)),
            line(2, 4, "07:34:00 FIR123 L NR FLW RECOVERED", ("FIR123",))])
    assert s.stated(ask) == Stated(("FIR123", "PIR108"), "high")
    s.assessed()
    assert s.stated(ask) == Stated(("FIR123",), "low")
    s.feed([line(3, 4, "Jun 14 15:16:01 combo sshd(pam_unix)[19939]: authentication failure", ())])
    assert s.stated(ask) == Stated((), "")
    for i in range(4, 12):
        s.feed([line(i, 4, "07:40:00 PIR108 HH NR RECOVERED", ("PIR108",))])    # recoveries, and one line stating none
    assert s.stated(ask) == Stated(("PIR108",), "low")

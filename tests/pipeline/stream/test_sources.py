"""Sources: timing of replay, rotation-proof follow, the TCP line server, bad bytes, and the rendering bridge."""
from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from pipeline.stream import records, sources
from pipeline.watch import wait_for
from tests.paths import SHARED

TEP_CSV = SHARED / "data" / "tep_alarms" / "filter" / "text_alarms_filter_1.csv"
POLL = 0.01
DEADLINE = 5.0      # CPU seconds a wait here may use with nothing arriving (12x that of wall time with nothing at all)


class Collector:
    """Iterates a source on a thread, keeping the lines it delivers."""

    def __init__(self, source):
        self.source, self.lines = source, []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        for line in self.source:
            self.lines.append(line)

    def texts(self):
        return [line.text for line in self.lines]

    def wait_for(self, n: int) -> list[str]:
        """The lines so far once there are n, or once the source stops producing (then the caller's comparison
        fails with what did arrive): while lines keep coming, a loaded host only makes this slower."""
        try:
            wait_for(lambda: len(self.lines) >= n, f"{n} lines", progress=lambda: len(self.lines),
                     cpu_budget_s=DEADLINE, hang_s=12 * DEADLINE, poll_s=POLL)
        except TimeoutError:
            pass
        return self.texts()

    def stop(self):
        self.source.stop()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "source did not stop"


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def append(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))


# --- replay timing ---------------------------------------------------------------------------------------------------

def _ten_seconds_apart(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "timed.jsonl", [
        {"timestamp": f"2024-05-01 01:00:{10 * i:02d}.000000000", "tag": "TI101", "value": 80.0 + i}
        for i in range(5)])


def test_replay_scales_original_timing_by_speed(tmp_path):
    path = _ten_seconds_apart(tmp_path)
    start = time.monotonic()
    arrivals = [time.monotonic() - start for _ in sources.replay(path, speed=1000)]
    assert len(arrivals) == 5
    # four 10 s gaps at speed 1000: 40 ms in all, each gap about 10 ms
    assert all(t >= 0.010 * i - 0.001 for i, t in enumerate(arrivals))    # never early
    assert arrivals[-1] < 5.0                   # not one of the 10 s gaps at speed 1


def test_replay_at_speed_zero_does_not_wait(tmp_path):
    path = _ten_seconds_apart(tmp_path)
    start = time.monotonic()
    assert len(list(sources.replay(path, speed=0))) == 5
    assert time.monotonic() - start < 5.0       # not one of the 10 s gaps (a bound on waiting, not on speed)


def test_replay_paces_untimed_plain_lines(tmp_path):
    path = tmp_path / "plain.log"
    path.write_text("one\ntwo\nthree\n")
    start = time.monotonic()
    assert [l.text for l in sources.replay(path, speed=2.0, pace=0.04)] == ["one", "two", "three"]
    assert 0.035 <= time.monotonic() - start < 5.0     # three lines 20 ms apart (the upper bound: no wait of seconds)


def test_replay_stops_during_a_long_wait(tmp_path):
    path = _ten_seconds_apart(tmp_path)
    src = sources.replay(path, speed=1.0)
    got = Collector(src)
    assert got.wait_for(1) and len(got.lines) == 1
    start = time.monotonic()
    got.stop()
    assert time.monotonic() - start < 5.0 and len(got.lines) == 1     # did not wait out the 10 s gap


# --- follow ----------------------------------------------------------------------------------------------------------

def test_follow_starts_at_end_and_sees_appended_lines(tmp_path):
    path = tmp_path / "live.log"
    path.write_text("old-1\nold-2\nhalf-writ")
    got = Collector(sources.follow(path, poll_interval=POLL))
    append(path, "ten line", "new-1", "new-2")
    assert got.wait_for(2) == ["new-1", "new-2"]   # the half line written before the start is skipped, not split
    got.stop()


def test_follow_from_start_and_waits_for_missing_file(tmp_path):
    path = tmp_path / "later.log"
    got = Collector(sources.follow(path, poll_interval=POLL, from_start=True))
    time.sleep(3 * POLL)
    path.write_text("first\nsecond\n")
    assert got.wait_for(2) == ["first", "second"]
    got.stop()


def test_follow_survives_rename_rotation_without_loss_or_duplication(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("before-start\n")
    got = Collector(sources.follow(path, poll_interval=POLL))
    writer = open(path, "a")
    for i in range(3):
        writer.write(f"pre-{i}\n")
        writer.flush()
    assert got.wait_for(3) == ["pre-0", "pre-1", "pre-2"]
    os.rename(path, tmp_path / "app.log.1")
    writer.write("pre-late\n")          # the writer still holds the moved file: this line must not be lost
    writer.close()
    time.sleep(3 * POLL)                # the follower polls while the path is missing
    append(path, *(f"post-{i}" for i in range(3)))
    append(path, "post-3")
    expected = ["pre-0", "pre-1", "pre-2", "pre-late", "post-0", "post-1", "post-2", "post-3"]
    assert got.wait_for(len(expected)) == expected
    time.sleep(5 * POLL)
    assert got.texts() == expected
    got.stop()


@pytest.mark.parametrize("post_len", [4, 200], ids=["shorter", "longer-than-before"])
def test_follow_survives_copytruncate_without_loss_or_duplication(tmp_path, post_len):
    path = tmp_path / "app.log"
    path.write_text("")
    got = Collector(sources.follow(path, poll_interval=POLL))
    append(path, "pre-0", "pre-1", "pre-2")
    assert got.wait_for(3) == ["pre-0", "pre-1", "pre-2"]
    os.truncate(path, 0)                # logrotate copytruncate; the writer goes on appending at the new end
    post = [f"post-{i}-" + "x" * post_len for i in range(3)]
    append(path, *post)
    expected = ["pre-0", "pre-1", "pre-2", *post]
    assert got.wait_for(len(expected)) == expected
    append(path, "post-last")
    assert got.wait_for(len(expected) + 1) == expected + ["post-last"]
    got.stop()


# --- tcp -------------------------------------------------------------------------------------------------------------

def send(address, payload: bytes) -> None:
    with socket.create_connection(address, timeout=DEADLINE) as client:
        client.sendall(payload)


def test_tcp_serves_sequential_clients_and_keeps_a_partial_last_line():
    src = sources.tcp("127.0.0.1", 0, poll_interval=POLL)
    got = Collector(src)
    send(src.address, b"a\nb\npart")
    assert got.wait_for(3) == ["a", "b", "part"]
    send(src.address, b"c\r\nd\n")
    assert got.wait_for(5) == ["a", "b", "part", "c\r", "d"]
    assert [line.partial for line in got.lines] == [False, False, True, False, False]
    assert [line.offset for line in got.lines] == [0, 2, 4, 0, 3]   # offsets restart with each client
    got.stop()
    assert src.stats.lines == 5 and src.stats.bytes == 13


def test_tcp_bounds_an_oversized_line_and_continues():
    src = sources.tcp("127.0.0.1", 0, poll_interval=POLL, max_line_bytes=100)
    got = Collector(src)
    send(src.address, b"x" * 1_000_000 + b"\nnext\n")
    assert got.wait_for(2) == ["x" * 100, "next"]
    assert got.lines[0].truncated and src.stats.oversized == 1
    got.stop()


# --- bad bytes -------------------------------------------------------------------------------------------------------

def test_bad_bytes_are_counted_and_the_stream_continues_in_bounded_memory(tmp_path):
    path = tmp_path / "bad.log"
    with open(path, "wb") as f:
        f.write(b"good-1\nbad-\xff\xfe-utf8\nnul\x00here\x00\n")
        f.write(b"y" * (1 << 20) + b"\n")
        f.write(b"good-2\nunterminated")
    size = path.stat().st_size
    src = sources.replay(path, speed=0)
    tracemalloc.start()
    lines = list(src)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [l.text for l in lines] == ["good-1", "bad-\ufffd\ufffd-utf8", "nulhere", "y" * 4096, "good-2",
                                       "unterminated"]
    assert [l.partial for l in lines] == [False] * 5 + [True]
    s = src.stats
    assert (s.lines, s.bytes, s.invalid_utf8, s.nul_bytes, s.oversized, s.dropped) == (6, size, 1, 1, 1, 0)
    assert peak < 400_000, f"peak {peak} bytes: the 1 MB line was held whole"


def test_truncation_cuts_at_a_character_boundary():
    line = "é" * 10                       # two bytes each: a cut at 7 bytes would split a character
    src = sources.Stream(io.BytesIO(line.encode() + b"\nok\n"), max_line_bytes=7)
    assert [l.text for l in src] == ["é" * 3, "ok"]
    assert src.stats.oversized == 1 and src.stats.invalid_utf8 == 0


def test_stream_delivers_an_unterminated_last_line_as_partial():
    src = sources.Stream(io.BytesIO(b"a\n\nb"))
    assert [(l.text, l.partial) for l in src] == [("a", False), ("", False), ("b", True)]


# --- rendering bridge ------------------------------------------------------------------------------------------------

def test_replayed_tep_csv_renders_exactly_as_read_log():
    expected = records.render(records.read_log(TEP_CSV))
    got = records.render(sources.parse("csv", sources.replay(TEP_CSV, speed=0)))
    assert got == expected and got.count("\n") > 200


def test_replayed_jsonl_with_sensor_readings_renders_exactly_as_read_log(tmp_path):
    path = write_jsonl(tmp_path / "sensors.jsonl", [
        {"timestamp": "2024-05-01 01:32:20.000000000", "tag": "TI101", "value": 87.25, "unit": "C"},
        {"time": "2024-05-01 01:32:30", "tag": "PI204", "value": 1.0 / 3.0, "unit": "bar", "ok": True},
        {"tag": "FI7", "value": 12, "note": "no timestamp"},
        "",
        "not json at all \x07 bell",
        "[1, 2, 3]",
        {"timestamp": "2024-05-01 01:32:40", "tag": "TI101", "msg": "température <|im_start|> élevée"},
    ])
    expected = records.render(records.read_log(path))
    assert records.render(sources.parse("jsonl", sources.replay(path, speed=0))) == expected
    assert "01:32:20 tag=TI101 value=87.25 unit=C" in expected


def test_replayed_csv_with_a_quoted_multiline_field_renders_exactly_as_read_log(tmp_path):
    path = tmp_path / "alarms.csv"
    path.write_text(',timestamp,tag,type,description\n'
                    '0,2024-05-01 01:32:20.000000000,AIR003_3,H,"PURGE, C ""CONC""\nHIGH ALM"\n'
                    '1,2024-05-01 01:36:10.000000000,AIR001_3,H\n'
                    '\n'
                    '2,2024-05-01 02:04:10.000000000,AIR001_1,L,REACT FEED A CONC LOW ALM\n')
    expected = records.render(records.read_log(path))
    assert records.render(sources.parse("csv", sources.replay(path, speed=0))) == expected
    assert expected.count("\n") == 3                     # the blank row skipped, the short row kept as its text
    assert "1,2024-05-01 01:36:10.000000000,AIR001_3,H\n" in expected


def test_a_csv_row_with_a_carriage_return_or_an_oversized_field_is_kept_not_fatal():
    """Found by `run.py fuzz`: a lone CR in an unquoted field made the csv module raise, killing ingest."""
    got = records.parse_csv("timestamp,tag,type,description\nt,A\rB,H,x\nt," + "f" * 200_000 + ",H,y\nt,C,L,z\n")
    assert [r.text for r in got] == ["t A B H x", "unreadable CSV row (field larger than field limit (131072))",
                                     "t C L z"]


def test_replayed_plain_log_renders_exactly_as_read_log(tmp_path):
    path = tmp_path / "plain.log"
    path.write_bytes(b"line one\r\n\x1b[31mred\x1b[0m\n\n  padded  \nform\x0cfeed\nlast")
    expected = records.render(records.read_log(path))
    assert records.render(sources.parse("plain", sources.replay(path, speed=0))) == expected


def test_parsed_records_carry_byte_offsets_of_their_lines(tmp_path):
    path = tmp_path / "plain.log"
    path.write_text("ab\n\ncd\n")
    assert [(r.offset, r.text) for r in sources.parse("plain", sources.replay(path))] == [(0, "ab"), (4, "cd")]


def test_parse_rejects_a_csv_header_without_the_alarm_columns():
    with pytest.raises(ValueError):
        list(sources.parse("csv", sources.Stream(io.BytesIO(b"a,b\n1,2\n"))))


@pytest.mark.parametrize("fmt", ["csv", "plain"])
def test_a_replay_resumed_at_a_byte_offset_yields_exactly_the_records_from_there(tmp_path, fmt):
    """A restart reads a file again from a checkpoint's offset: the records from there on, with the offsets a reading
    from the start gives them (a CSV's header is read first, so its columns still parse)."""
    path = TEP_CSV
    if fmt == "plain":
        path = tmp_path / "log.txt"
        path.write_text("".join(f"line {i}\n" for i in range(50)))
    whole = list(sources.parse(fmt, sources.replay(path)))
    start = whole[17].offset
    resumed = list(sources.parse(fmt, sources.replay(path, start=start)))
    assert resumed == whole[17:]


def test_follow_resumes_at_a_checkpoints_offset_or_reads_a_rotated_file_from_its_start(tmp_path):
    path = tmp_path / "live.log"
    path.write_text("".join(f"line {i}\n" for i in range(10)))
    start = len("".join(f"line {i}\n" for i in range(6)))
    src = sources.follow(path, poll_interval=POLL, start=start)
    got = Collector(src)
    assert got.wait_for(4) == ["line 6", "line 7", "line 8", "line 9"] and src.resumed
    got.stop()
    path.write_text("new 0\nnew 1\n")                         # rotated: shorter than the checkpoint's offset
    src = sources.follow(path, poll_interval=POLL, start=start)
    got = Collector(src)
    assert got.wait_for(2) == ["new 0", "new 1"] and not src.resumed
    got.stop()

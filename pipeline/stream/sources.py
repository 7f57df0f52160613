"""Where stream lines come from: a replayed capture, a followed file, a TCP line server, stdin.

Owns reading bytes, cutting them into lines (bounded: a line longer than `max_line_bytes` is truncated and the rest
skipped, never buffered whole), sanitising them (NULs removed, invalid UTF-8 replaced) and counting all of it in
`SourceStats`; `parse` turns lines into `records.Record`s through the parsers of `records.py`, so the rendered text is
exactly `records.render(records.read_log(path))`. Never tokenizes and never touches a model; never fatal on bad bytes.

Every source is an iterable of `RawLine`s with a `stats` and a `stop()` (or a shared `threading.Event`). `RawLine.offset` is
the byte offset of the line in its file or connection (it restarts at 0 after a rotation and for each TCP client).
`SourceSpec` describes one for the ingest actor (`source_of` makes it from a command line's FILE / tcp://HOST:PORT
/ -); the ingest actor opens it.
"""
from __future__ import annotations

import csv
import json
import os
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import numpy as np

from pipeline import messages
from pipeline.messages import Checkpoint
from pipeline.stream import records
from pipeline.stream.identifiers import carried

CHUNK = 64 * 1024
_TAIL = 64          # bytes before the read position a follower re-checks to notice copytruncate


@dataclass
class SourceStats:
    lines: int = 0          # lines delivered (truncated and partial ones included)
    bytes: int = 0          # raw bytes read, skipped ones included
    invalid_utf8: int = 0   # lines that held invalid UTF-8 (delivered with U+FFFD replacements)
    nul_bytes: int = 0      # lines that held NUL bytes (delivered with the NULs removed)
    oversized: int = 0      # lines longer than max_line_bytes (delivered truncated, the rest skipped)
    dropped: int = 0        # unterminated lines discarded because the source was stopped mid-line


@dataclass(frozen=True, slots=True)
class RawLine:
    offset: int             # byte offset of the line's first byte in its file or connection
    data: bytes             # the line without its b"\n", NULs removed, at most max_line_bytes
    text: str               # data decoded as UTF-8 with replacement
    partial: bool = False   # ended by EOF, disconnect or rotation instead of a newline
    truncated: bool = False


class _Splitter:
    """Cuts a byte stream into `RawLine`s holding at most `limit + 1` bytes of the current line."""

    def __init__(self, stats: SourceStats, limit: int):
        self.stats, self.limit = stats, limit
        self.reset(0)

    def reset(self, offset: int, skipping: bool = False) -> None:
        self.buf = bytearray()
        self.pos = self.line_start = offset
        self.skipping = skipping    # inside an oversized (or half-seen) line: discard up to the next newline

    def feed(self, chunk: bytes) -> Iterator[RawLine]:
        self.stats.bytes += len(chunk)
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            if not self.skipping:
                self.buf += chunk[start:min(end, start + self.limit + 1 - len(self.buf))]
                if len(self.buf) > self.limit:
                    yield self._line(self._cut(bytes(self.buf)), partial=False, truncated=True)
                    self.buf.clear()
                    self.skipping = True
            if nl < 0:
                break
            if self.skipping:
                self.skipping = False
            else:
                yield self._line(bytes(self.buf), partial=False, truncated=False)
                self.buf.clear()
            start = nl + 1
            self.line_start = self.pos + start
        self.pos += len(chunk)

    def finish(self) -> Iterator[RawLine]:
        """End of this stream: an unterminated last line is delivered, flagged partial."""
        if self.buf:
            yield self._line(bytes(self.buf), partial=True, truncated=False)
        self.reset(self.pos)

    def discard(self) -> None:
        if self.buf:
            self.stats.dropped += 1
        self.reset(self.pos)

    def _cut(self, data: bytes) -> bytes:
        # cut at a character boundary so truncation alone never makes a line invalid UTF-8
        cut = self.limit
        while cut > max(0, self.limit - 3) and data[cut] & 0xC0 == 0x80:
            cut -= 1
        return data[:cut] if data[cut] & 0xC0 == 0xC0 else data[:self.limit]

    def _line(self, data: bytes, partial: bool, truncated: bool) -> RawLine:
        s = self.stats
        s.lines += 1
        s.oversized += truncated
        if b"\0" in data:
            s.nul_bytes += 1
            data = data.replace(b"\0", b"")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            s.invalid_utf8 += 1
            text = data.decode("utf-8", errors="replace")
        return RawLine(self.line_start, data, text, partial, truncated)


class Source:
    """An iterable of `RawLine`s; iterate once."""

    def __init__(self, max_line_bytes: int = 4096, stop: threading.Event | None = None):
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.stats = SourceStats()
        self.stop_event = stop or threading.Event()
        self._split = _Splitter(self.stats, max_line_bytes)

    def stop(self) -> None:
        self.stop_event.set()

    def __iter__(self) -> Iterator[RawLine]:
        return self._lines()

    def _lines(self) -> Iterator[RawLine]:
        raise NotImplementedError


class Replay(Source):
    """A captured file with its original timing divided by `speed` (0: as fast as possible), or at a fixed `rate` of
    lines per second.

    Timed lines (CSV `timestamp` column, JSON `timestamp`/`time` field) are due at first + (t - t_first) / speed on the
    monotonic clock, so waits never accumulate drift; untimed lines follow the previous one after `pace / speed` s.
    """

    def __init__(self, path: str | Path, speed: float = 0.0, fmt: str | None = None, pace: float = 0.0,
                 rate: float = 0.0, start: int = 0, **kw):
        super().__init__(**kw)
        if speed < 0 or rate < 0 or start < 0:
            raise ValueError("speed, rate and start must be >= 0")
        self.path, self.speed, self.pace, self.rate, self.start = Path(path), speed, pace, rate, start
        self.fmt = fmt or records.format_of(self.path)

    def _lines(self) -> Iterator[RawLine]:
        stop, clock = self.stop_event, _Clock(self.fmt)
        origin = None               # (wall, stream seconds) of the first timed line
        last = start = time.monotonic()
        count = 0
        with open(self.path, "rb", buffering=0) as f:
            if self.start:          # resuming: a CSV's header first (the parser needs it), then the byte offset
                if self.fmt == "csv":
                    head = f.readline(self._split.limit + 1)
                    yield from self._split.feed(head if head.endswith(b"\n") else head + b"\n")
                f.seek(self.start)
                self._split.reset(self.start)
            while True:
                chunk = f.read(CHUNK)
                for line in self._split.feed(chunk) if chunk else self._split.finish():
                    due = None
                    if self.rate > 0:                   # a fixed line rate instead of the file's timing
                        due, count = start + count / self.rate, count + 1
                    elif self.speed > 0:
                        t = clock.seconds(line)
                        if t is not None:
                            origin = origin or (time.monotonic(), t)
                            due = origin[0] + (t - origin[1]) / self.speed
                        elif self.pace > 0:
                            due = last + self.pace / self.speed
                    if due is not None:
                        stop.wait(max(0.0, due - time.monotonic()))
                    if stop.is_set():
                        return
                    last = time.monotonic()
                    yield line
                if not chunk:
                    return


class Follow(Source):
    """`tail -f` of a path that survives rename rotation (reopen the new file from its start) and copytruncate
    (the file shrank, or the bytes just before our position changed: seek to its start).

    On a rename the old file is drained to EOF before the new one is opened; a line the writer puts into the moved
    file after that is lost (there is no grace period watching moved files, as in `tail -F`).

    start: resume at this byte offset (a restart's checkpoint) when the file is at least that long; `resumed` says
    whether it was (a shorter file was rotated or truncated since: it is read from its start).
    """

    def __init__(self, path: str | Path, poll_interval: float = 0.1, from_start: bool = False,
                 start: int | None = None, **kw):
        super().__init__(**kw)
        self.path, self.poll, self.resumed = Path(path), poll_interval, False
        # opened now, so "the end of the current file" is where it ends when follow() returns
        self._first = self._try_open(at_end=not from_start, start=start)

    def close(self) -> None:
        if self._first is not None:
            self._first[0].close()

    def _try_open(self, at_end: bool, start: int | None = None):
        try:
            f = open(self.path, "rb", buffering=0)
        except FileNotFoundError:
            return None
        pos = f.seek(0, os.SEEK_END) if at_end or start is not None else 0
        if start is not None:
            self.resumed = start <= pos
            pos = f.seek(start if self.resumed else 0)
        return f, pos, os.pread(f.fileno(), min(pos, _TAIL), pos - min(pos, _TAIL))

    def _open(self):
        """The file at the path (waiting for it to appear), read from its start; or the one opened at construction."""
        opened, self._first = self._first, None
        while opened is None and not self.stop_event.is_set():
            opened = self._try_open(at_end=False)
            if opened is None:
                self.stop_event.wait(self.poll)
        if opened is None:
            return None, 0, b""
        f, pos, tail = opened
        # starting mid-line at the end of a live file: skip the half line rather than deliver a fragment
        self._split.reset(pos, skipping=bool(tail) and not tail.endswith(b"\n"))
        return opened

    def _lines(self) -> Iterator[RawLine]:
        split, stop = self._split, self.stop_event
        f, pos, tail = self._open()
        try:
            while f is not None and not stop.is_set():
                fd = f.fileno()
                if tail and os.pread(fd, len(tail), pos - len(tail)) != tail:     # copytruncate
                    yield from split.finish()
                    pos, tail = f.seek(0), b""
                    split.reset(0)
                chunk = f.read(CHUNK)
                if chunk:
                    pos += len(chunk)
                    tail = (tail + chunk)[-_TAIL:]
                    yield from split.feed(chunk)
                    continue
                if self._replaced(fd):                                            # rename rotation
                    while chunk := f.read(CHUNK):   # what the writer appended before it switched files
                        yield from split.feed(chunk)
                    yield from split.finish()
                    f.close()
                    f, pos, tail = self._open()
                    continue
                stop.wait(self.poll)
            split.discard()
        finally:
            if f is not None:
                f.close()

    def _replaced(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False            # moved away, successor not created yet: keep draining the old file
        own = os.fstat(fd)
        return (st.st_ino, st.st_dev) != (own.st_ino, own.st_dev)


class Tcp(Source):
    """A line server: clients connect one after another and send newline-terminated lines. A client that disconnects
    mid-line has its unterminated last line delivered, flagged partial. The socket is bound on construction
    (`address` holds the real port when `port` is 0); the reader blocks the sender by TCP flow control, never by
    buffering more than one line."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, poll_interval: float = 0.1, backlog: int = 8, **kw):
        super().__init__(**kw)
        self.poll = poll_interval
        self._server = socket.create_server((host, port), backlog=backlog)
        self._server.settimeout(poll_interval)
        self.address: tuple[str, int] = self._server.getsockname()[:2]

    def close(self) -> None:
        self._server.close()

    def _lines(self) -> Iterator[RawLine]:
        stop = self.stop_event
        try:
            while not stop.is_set():
                try:
                    conn, _ = self._server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(self.poll)
                    self._split.reset(0)
                    yield from self._client(conn)
        finally:
            self.close()

    def _client(self, conn: socket.socket) -> Iterator[RawLine]:
        while not self.stop_event.is_set():
            try:
                data = conn.recv(CHUNK)
            except TimeoutError:
                continue
            except OSError:         # reset by the peer: what was received still counts
                data = b""
            if not data:
                yield from self._split.finish()
                return
            yield from self._split.feed(data)
        self._split.discard()


class Stream(Source):
    """Lines from a binary file object read to EOF (stdin); `stop` is seen within `poll_interval` s."""

    def __init__(self, fileobj: BinaryIO, poll_interval: float = 0.1, **kw):
        super().__init__(**kw)
        self._read = getattr(fileobj, "read1", fileobj.read)
        self.poll = poll_interval
        try:
            self._fd = fileobj.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None         # no descriptor (an in-memory stream): plain blocking reads

    def _lines(self) -> Iterator[RawLine]:
        while not self.stop_event.is_set():
            if self._fd is not None and not select.select([self._fd], [], [], self.poll)[0]:
                continue            # nothing to read yet: look at `stop` again
            chunk = self._read(CHUNK)
            if not chunk:
                yield from self._split.finish()
                return
            yield from self._split.feed(chunk)
        self._split.discard()


def replay(path: str | Path, speed: float = 0.0, **kw) -> Replay:
    return Replay(path, speed, **kw)


def follow(path: str | Path, poll_interval: float = 0.1, **kw) -> Follow:
    return Follow(path, poll_interval, **kw)


def tcp(host: str = "127.0.0.1", port: int = 0, **kw) -> Tcp:
    return Tcp(host, port, **kw)


def stdin(path: str | None = None, **kw) -> Stream:
    """This process's stdin, or `path` (a launcher hands its own stdin to an actor as /proc/PID/fd/0)."""
    return Stream(open(path, "rb", buffering=0) if path else sys.stdin.buffer, **kw)


@dataclass(frozen=True)
class SourceSpec:
    """What the ingest actor reads (actors/ingest.py opens it): plain data, so it pickles into the actor's process.
    The launcher adds the archive when serving and the checkpoint to resume after (`dataclasses.replace`)."""
    kind: str                           # replay, loop (replayed over and over), follow (tail -f), tcp, stdin
    format: str = "plain"               # plain, csv, jsonl (pipeline/stream/records.py)
    path: str = ""                      # the file (replay, loop, follow: absolute), or stdin as /proc/PID/fd/0
    host: str = "127.0.0.1"             # tcp: the line server's address
    port: int = 0                       # tcp: 0 = any free port
    speed: float = 0.0                  # replay: times the capture's own pace (0: as fast as the pipeline takes it)
    rate: float = 0.0                   # replay, loop: lines per second instead (0: off)
    max_lines: int = 0                  # stop after this many lines, counted over restarts (0: no limit)
    max_tokens: int = 0                 # stop after this many tokens (0: no limit; the soak)
    archive: str = ""                   # serving: the SQLite FTS5 archive every line also goes to ("": none)
    archive_max_lines: int = 0          # ... the lines it keeps
    archive_max_values: int = 0         # ... the values of a line it keeps
    archive_max_templates: int = 0      # ... the templates its miner holds
    resume: Checkpoint | None = None    # the last durable checkpoint: start after it (pipeline/stream/journal.py)

    @property
    def file(self) -> bool:
        """A file: back-pressured (never dropped), and read again from a checkpoint's window after a restart."""
        return self.kind in ("replay", "loop", "follow")


def source_of(log: str, fmt: str | None, max_lines: int, speed: float, follow: bool) -> SourceSpec:
    """What the ingest actor reads, from the command line's FILE / tcp://HOST:PORT / - and flags."""
    if log.startswith("tcp://"):
        host, _, port = log[len("tcp://"):].rpartition(":")
        if not port.isdigit():
            raise ValueError(f"{log}: expected tcp://HOST:PORT")
        return SourceSpec("tcp", fmt or "plain", host=host or "127.0.0.1", port=int(port), max_lines=max_lines)
    if log == "-":
        return SourceSpec("stdin", fmt or "plain", path=f"/proc/{os.getpid()}/fd/0", max_lines=max_lines)
    if not follow and not Path(log).is_file():
        raise FileNotFoundError(f"log file {log} does not exist")
    return SourceSpec("follow" if follow else "replay", fmt or records.format_of(log), path=str(Path(log).resolve()),
                      speed=speed, max_lines=max_lines)


def line_of(rec: records.Record, tok, seq: int, stats: SourceStats | None = None, queue_full: int = 0, loop: int = 0,
            recovery: bool = False) -> messages.Line:
    """A parsed record as the cache owner takes it (pipeline/messages.py `Line`, not this module's `RawLine`): its identifiers, its tokens (the rendered line and its newline),
    its seq, and what was dropped or repaired so far (`stats`, the source's; `queue_full`, ingest's own drops). The
    ingest actor and the serial replay both make their lines here."""
    ids = tok.encode(rec.text + "\n").astype(np.int32)
    drops = {} if stats is None else {"queue_full": queue_full, "invalid_utf8": stats.invalid_utf8,
                                      "nul_bytes": stats.nul_bytes, "oversized": stats.oversized}
    return messages.Line(offset=rec.offset, time=rec.time, tags=carried(rec.text, rec.tags), text=rec.text,
                         loop=loop, n_tokens=len(ids), seq=seq, recovery=recovery, drops=drops, ids=ids)


def parse(fmt: str, source: Iterable[RawLine], max_record_bytes: int = 64 * 1024) -> Iterator[records.Record]:
    """Lines -> Records through `records.PARSERS`, so the text equals `records.read_log`'s. `Record.offset` is the
    byte offset of the record's first line. CSV: the first line is the header; a quoted field spanning lines is
    joined up to `max_record_bytes`."""
    if fmt not in records.PARSERS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(records.PARSERS)}")
    if fmt != "csv":
        for line in source:
            for rec in records.PARSERS[fmt](line.text):
                yield records.Record(line.offset, rec.time, rec.text, rec.tags)
        return
    header, pending, start = None, "", 0
    for line in source:
        if header is None:
            header = line.text
            records.parse_csv(header)           # raises on a header without the needed columns
            continue
        if not pending:
            start = line.offset
        pending += line.text + "\n"
        if pending.count('"') % 2 and len(pending) < max_record_bytes:
            continue                            # inside a quoted field that continues on the next line
        for rec in records.parse_csv(header + "\n" + pending):
            yield records.Record(start, rec.time, rec.text, rec.tags)
        pending = ""
    if pending:
        for rec in records.parse_csv(header + "\n" + pending):
            yield records.Record(start, rec.time, rec.text, rec.tags)


class _Clock:
    """Stream time of a line in seconds, or None: CSV `timestamp` column (after the header), JSON timestamp/time."""

    def __init__(self, fmt: str):
        self.fmt, self.column = fmt, None

    def seconds(self, line: RawLine) -> float | None:
        if self.fmt == "csv":
            row = next(csv.reader([line.text]), [])
            if self.column is None:
                names = [h.strip().lower() for h in row]
                self.column = names.index("timestamp") if "timestamp" in names else -1
                return None
            return _seconds(row[self.column]) if 0 <= self.column < len(row) else None
        if self.fmt == "jsonl":
            try:
                obj = json.loads(line.text)
            except ValueError:
                return None
            return _seconds(obj.get("timestamp", obj.get("time"))) if isinstance(obj, dict) else None
        return None


def _seconds(value) -> float | None:
    """Epoch seconds, ISO 8601 date-time (naive taken as UTC) or HH:MM:SS[.f] -> seconds; None if unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        try:
            h, m, s = text.split(":")
            return int(h) * 3600 + int(m) * 60 + float(s)
        except ValueError:
            return None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp()

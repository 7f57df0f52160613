"""Ingest actor: owns the source, the parser, the renderer and the tokenizer.

Receives nothing; emits one `Line` per record to the cache owner (offset, time, tags, text, seq, the drop counts so
far, and its token ids), then an `Eof` carrying its counts and figures (pipeline/messages.py). When serving, every
record also goes into the archive (pipeline/stream/archive.py; `seq` is its row there), committed there before the
line is sent on. A file source (replay, loop, follow) is back-pressured: it waits while the owner's channel is full
and never drops. A live source (tcp, stdin) cannot be paused for ever: when the owner's backlog and channel stay full
for `drop_after_s`, the record is dropped, counted and logged, never buffered without limit. Never touches a model or
the cache.

Sources (`source.kind`, of the `SourceSpec` in its arguments: pipeline/stream/sources.py): replay (a captured file at
`speed` times its original pace, or at `rate` lines per second), follow (`tail -f`, across rotations), tcp (a line
server on host:port), stdin (the launcher's stdin, reopened through /proc), loop (a file replayed over and over, at
full speed or at `rate` lines per second: the soak, a demo server).

Resuming (`source.resume`, from the journal's last checkpoint: pipeline/stream/journal.py): a file source is read
again from the oldest line that was in the window; lines up to the checkpoint's are sent flagged `recovery` (the owner
refills the ring with them), the rest as new lines, with the seqs they had. A live source cannot be read again: it
continues with the next seq, and what the previous ingest held is a gap the owner journals.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path


from actors.args import IngestArgs
from pipeline.messages import Eof, Line, send
from pipeline.process import Figures, StopFlag, attach_when_ready, chaos, figures_on_request, pin
from pipeline.stream import sources
from pipeline.stream.archive import Archive
from pipeline.stream.sources import SourceSpec


def open_source(source: SourceSpec, stop_event: threading.Event):
    kind, resume = source.kind, source.resume
    if kind == "replay":
        return sources.replay(source.path, source.speed, fmt=source.format, stop=stop_event, rate=source.rate,
                              start=resume.window_offset if resume else 0)
    if kind == "loop":
        return _Loop(source, stop_event)
    if kind == "follow":
        return sources.follow(source.path, stop=stop_event, start=resume.window_offset if resume else None)
    if kind == "tcp":
        src = sources.tcp(source.host, source.port, stop=stop_event)
        print(f"ringspec: listening for log lines on tcp://{src.address[0]}:{src.address[1]}", file=sys.stderr,
              flush=True)
        return src
    if kind == "stdin":
        return sources.stdin(source.path or None, stop=stop_event)
    raise ValueError(f"unknown source kind {kind!r} (replay, follow, tcp, stdin)")


class _Loop:
    """A captured file replayed over and over (the soak): records carry their pass in `loop`."""

    def __init__(self, source: SourceSpec, stop_event: threading.Event):
        resume = source.resume
        self.source, self.stop_event = source, stop_event
        self.loop, self.start = (resume.window_loop, resume.window_offset) if resume else (0, 0)
        self.stats = sources.SourceStats()
        self._sources = sources

    def records(self, fmt: str):
        while not self.stop_event.is_set():
            src = self._sources.replay(self.source.path, 0.0, fmt=fmt, stop=self.stop_event, rate=self.source.rate,
                                       start=self.start)
            self.start = 0
            yield from self._sources.parse(fmt, src)
            for key, value in vars(src.stats).items():
                setattr(self.stats, key, getattr(self.stats, key) + value)
            self.loop += 1


def run(args: IngestArgs) -> None:
    """Read the source to its end (or until the pipeline's stop, or the operator's drain: then an eof still goes
    out), a `Line` per record to the cache owner."""
    source, stop, drop_after_s = args.source, args.stop, args.drop_after_s
    pin(args.cpus)
    figures = Figures("ingest")
    figures_on_request(figures)
    tok = args.model.tokenizer
    stop_event = threading.Event()              # the sources wait on an Event; the pipeline's flag sets it
    reading = StopFlag(*stop.paths, *args.drain.paths)    # the source stops on either
    watcher = threading.Thread(target=_watch, args=(reading, stop_event), daemon=True)
    watcher.start()
    src = open_source(source, stop_event)
    waits = source.file                         # a file waits for the pipeline: back-pressured, never dropped
    fmt = source.format
    dropped = sent = tokens = 0
    resume = source.resume
    # a file re-read from the window's oldest line: recovery first (unless a followed file was rotated meanwhile)
    recovering = waits and resume is not None and getattr(src, "resumed", True)
    upto = (resume.loop, resume.offset) if resume else (0, -1)
    next_seq = (resume.window_seq if waits else resume.seq + 1) if resume else 1
    limit, token_limit = source.max_lines, source.max_tokens
    before = resume.lines if resume else 0      # lines committed before this start count against max_lines
    records = src.records(fmt) if isinstance(src, _Loop) else sources.parse(fmt, src)
    archive = _open_archive(source, next_seq if resume else None)
    with attach_when_ready(args.out_name, stop) as out:
        for rec in records:
            if reading.is_set():
                break
            loop = getattr(src, "loop", 0)
            recovery = recovering = recovering and (loop, rec.offset) <= upto
            if not recovery and limit and before + sent + dropped >= limit:
                break                                # resumed at or past max_lines: nothing new to send
            with figures.busy():
                if archive:                          # durable before it is sent on: every line sent is searchable
                    seq = archive.add(rec.offset, rec.time, rec.text)
                    archive.flush()
                else:
                    seq, next_seq = next_seq, next_seq + 1
                line = sources.line_of(rec, tok, seq, src.stats, dropped, loop, recovery)
            chaos("ingest.recovery" if recovery else "ingest.read")
            t0 = time.perf_counter()                 # waiting on a full queue is back-pressure, not work
            if _deliver(out, line, None if waits else drop_after_s, stop):
                if recovery:
                    continue
                sent += 1
                tokens += line.n_tokens
            elif not stop.is_set():
                dropped += 1
                if dropped == 1 or dropped % 100 == 0:
                    print(f"ringspec: ingest: dropped line {rec.offset} (the cache owner's queue stayed full for "
                          f"{drop_after_s:.0f} s; {dropped} dropped so far)", file=sys.stderr, flush=True)
            figures.extra["blocked_s"] = figures.extra.get("blocked_s", 0.0) + time.perf_counter() - t0
            if (limit and before + sent + dropped >= limit) or (token_limit and tokens >= token_limit):
                break
        if archive:
            archive.close()
        st = src.stats
        send(out, Eof(sent=sent, tokens=tokens, dropped_full=dropped, invalid_utf8=st.invalid_utf8,
                      nul_bytes=st.nul_bytes, oversized=st.oversized, lines=st.lines, stopped=reading.is_set(),
                      figures=[figures.snapshot()]), timeout=60.0)
    stop_event.set()


def _deliver(out, line: Line, timeout: float | None, stop) -> bool:
    """Send one line; True when sent. timeout None: wait as long as the owner's channel stays full (a file), only
    giving up on a hard stop (a drain still delivers what was read); else give up after `timeout` s (a live
    source: the owner's backlog and the channel are both full, and the line is dropped)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = 0.5 if deadline is None else min(0.5, max(deadline - time.monotonic(), 0.0))
        try:
            send(out, line, timeout=wait)
            return True
        except TimeoutError:
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                return False


def _open_archive(source: SourceSpec, rewind: int | None):
    """The archive every line also goes to (serving): None when not asked for. rewind: resuming, the seq the next
    line read has (the lines from there on are archived again as they are read again)."""
    if not source.archive:
        return None
    Path(source.archive).parent.mkdir(parents=True, exist_ok=True)
    archive = Archive(source.archive, max_lines=source.archive_max_lines, flush_every=64,
                      max_values=source.archive_max_values, max_templates=source.archive_max_templates)
    if rewind is not None:
        archive.rewind(rewind)
    return archive


def _watch(stop, stop_event: threading.Event) -> None:
    while not stop_event.is_set():
        if stop.is_set():
            stop_event.set()
            return
        stop_event.wait(0.1)

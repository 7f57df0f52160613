"""A stream's session: the one owner of what happens to a stream line once it reaches the engine, for every launcher.

Owns, for one stream over one engine (the serial `Engine` or the pipeline's `DeferredEngine`: both a `Decoder`): the
triggers (built once from the profile), the line surprisal, the window's lines (one typed record each), the counts,
the last committed line and the lines committed since the last checkpoint. `feed(lines)` prefills lines and returns
their events; `assess()` writes the assessment that is due in a scratch span that is rolled back, so the ring holds
only the stream; `checkpoint()` names what is committed; `restore(point)` takes a restart's checkpoint back.

Never schedules (when to feed, assess or answer is the caller's: the serial loop in pipeline/stream/replay.py, the
cache owner's schedule in actors/cache_owner.py), never reads a clock to decide, never sends or prints.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, replace

import numpy as np

from pipeline.config import ReplaySection
from pipeline.messages import Assessment, Checkpoint, Line
from pipeline.stream.forms import Stated, in_view, stated_by, view_start
from pipeline.stream.frame import Frame
from pipeline.stream.severity import severity_of
from pipeline.stream.surprise import Surprise, line_fields
from pipeline.stream.triggers import Triggers


@dataclass(frozen=True)
class InRing:
    """A stream line whose tokens are in the ring."""
    first: int                  # the position of its first token
    end: int                    # ... of its last
    offset: int                 # where it is in its source (pipeline/messages.py Line)
    loop: int
    seq: int
    tags: tuple[str, ...]       # the identifiers it carries (pipeline/stream/identifiers.py)
    severity: str = ""          # the severity it states (pipeline/stream/severity.py; "" = none)


class StreamSession:
    def __init__(self, engine, frame: Frame, replay: ReplaySection, source_id: str, settle=None):
        """engine: primed with `frame.head` in its sinks; source_id: what checkpoints name as the source; settle:
        waits until every pass sent to the target has run (the pipeline's), so the fed lines' tokens are in its
        ring when a checkpoint names them."""
        self.engine, self.frame, self.source_id, self.settle = engine, frame, source_id, settle or (lambda: None)
        self.triggers = Triggers.of(replay)
        self.surprise = Surprise(replay.surprise_above) if replay.scored else None
        self.window: deque[InRing] = deque()    # the lines some query at the ring's end may see, oldest first
        self.lines = self.stream_tokens = 0     # stream lines committed (over every restart) and their tokens
        self.committed: tuple[int, int, int] | None = None    # the last committed line's (offset, loop, seq)
        self.since_checkpoint: list[int] = []   # offsets of the lines committed since the last checkpoint
        self.fresh_from = 0                     # the first position of the lines since the last assessment
        self.latest = ""                        # the last line's text (the structured form's question quotes it)
        self.due: str | None = None             # the trigger of an assessment due, not yet written
        self.interrupted: str | None = None     # restored: the assessment a crash interrupted, asked once refilled
        self.recovered: list[int] = []          # restored: offsets of the lines prefilled again, not committed
        self.resumed_after: int | None = None   # restored: the offset of the checkpoint's last committed line

    @property
    def scored(self) -> bool:
        return self.surprise is not None

    def next_position(self) -> int:
        """Where the next stream line's first token goes (after a pending token the engine has not fed yet)."""
        return self.engine.index.n + (self.engine.pending is not None)

    def would_fire(self, text: str, ahead: int = 0) -> bool:
        return self.triggers.would_fire(text, ahead)

    def feed(self, lines: list[Line]) -> list[Line]:
        """Prefill stream lines in one feed (how text is cut into feeds leaves its K/V unchanged); the lines as sent
        on (no tokens; the window's oldest seq, the surprisal when scored). An assessment may fall due (`due`): only
        the last line may fire one (the caller ends a group at a line that would)."""
        first = self.next_position()
        lengths = [len(line.ids) for line in lines]
        ids = np.concatenate([line.ids for line in lines]) if len(lines) > 1 else lines[0].ids
        nll = self.engine.feed(ids, score=self.scored)
        events = []
        for line, cut in zip(lines, np.cumsum(lengths)):
            scored = None if self.surprise is None else self.surprise.line(line.text, nll[cut - len(line.ids):cut])
            self._in_ring(line, first + int(cut) - len(line.ids))
            self.lines += 1
            self.stream_tokens += len(line.ids)
            self.since_checkpoint.append(line.offset)
            self.committed = (line.offset, line.loop, line.seq)
            reason = self.triggers.after_line(line.text, scored and scored.surprise)
            events.append(replace(line, ids=None, window_from_seq=self.window[0].seq, **line_fields(scored)))
        self.due = self.due or reason           # one due at a time: a later trigger waits for it
        return events

    def recover(self, line: Line) -> None:
        """A line committed before a restart, read again: it refills the window only (not counted, not sent)."""
        first = self.next_position()
        self.engine.feed(line.ids)
        self._in_ring(line, first)
        self.recovered.append(line.offset)

    def quiet(self, quiet_s: float) -> None:
        """No line for `quiet_s` seconds: an assessment may fall due (`idle`)."""
        self.due = self.due or self.triggers.on_quiet(quiet_s)

    def assess(self, keep_going=None) -> Assessment | None:
        """The assessment that is due, written in a scratch span that is rolled back; None when `keep_going` cut it
        (it stays due, to be asked again)."""
        t0, f, mark = time.perf_counter(), self.frame, self.engine.mark()
        ask = f.writer.ask(self.latest)
        allowed = self.in_view(ask)
        written = f.writer.write(self.engine, ask, allowed, f.params, keep_going, self.stated(ask))
        self.engine.rollback(mark)
        if written.cut:
            return None
        reason, w = self.assessed(), self.window
        return Assessment(trigger=reason, offsets=[w[0].offset, w[-1].offset] if w else [], lines=self.lines,
                          window_lines=len(w), window_tags=allowed, latency_ms=(time.perf_counter() - t0) * 1e3,
                          stats=written.stats.as_dict(), checkpoint=asdict(self.checkpoint()), fields=written.fields,
                          ids=np.asarray(written.ids, np.int32))

    def in_view(self, ask: np.ndarray) -> list[str]:
        """The identifiers every row of an assessment asked with `ask` after the ring's end can see (the only ones
        its rule lets it write: pipeline/stream/forms.py)."""
        return in_view([(ln.first, ln.tags) for ln in self.window], self.engine.index.n, len(ask),
                       self.frame.writer.scratch(), self.frame.spec.window)

    def stated(self, ask: np.ndarray) -> Stated:
        """What the lines an assessment asked with `ask` assesses state (their latest tags, their severity): the lines
        since the last assessment that every row of it can see, or, when none is, the latest line in view."""
        oldest = view_start(self.engine.index.n, len(ask), self.frame.writer.scratch(), self.frame.spec.window)
        seen = [ln for ln in self.window if ln.first >= oldest]
        assessed = [ln for ln in seen if ln.first >= self.fresh_from] or seen[-1:]
        return stated_by([(ln.tags, ln.severity) for ln in assessed])

    def assessed(self) -> str:
        """The due assessment is written: its trigger; the next one's fresh lines start here."""
        reason, self.due, self.fresh_from = self.due or "", None, self.next_position()
        return reason

    def checkpoint(self) -> Checkpoint:
        """What is committed: the lines fed so far, once the target has run every pass sent to it; the lines since
        the last checkpoint are its `offsets`."""
        self.settle()
        offset, loop, seq = self.committed or (-1, 0, 0)
        oldest = self.window[0] if self.window else InRing(0, 0, offset, loop, seq, ())
        point = Checkpoint(source=self.source_id, offset=offset, loop=loop, seq=seq, offsets=self.since_checkpoint,
                           position=int(self.engine.index.n), window_offset=oldest.offset, window_loop=oldest.loop,
                           window_seq=oldest.seq, lines=self.lines, since=self.triggers.since, due=self.due)
        self.since_checkpoint = []
        return point

    def restore(self, point: Checkpoint) -> None:
        """Started again after `point` (the last durable checkpoint): its counts, and the assessment it left due."""
        self.lines, self.triggers.since = point.lines, point.since
        self.committed = (point.offset, point.loop, point.seq)
        self.interrupted, self.resumed_after = point.due, point.offset

    def take_interrupted(self) -> bool:
        """The assessment a crash interrupted is due now (the window is refilled: a new line or the stream's end
        came); True when there was one."""
        if self.interrupted is None:
            return False
        self.due, self.interrupted = self.interrupted, None
        return True

    def _in_ring(self, line: Line, first: int) -> None:
        """Note the line whose first token is at `first`; forget the lines no query at its end can see."""
        end = first + len(line.ids) - 1
        self.window.append(InRing(first, end, line.offset, line.loop, line.seq, tuple(line.tags),
                                  severity_of(line.text)))
        self.latest = line.text
        while self.window[0].end < end + 1 - self.engine.spec.window:
            self.window.popleft()

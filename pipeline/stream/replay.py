"""The serial replay (`replay --launcher serial`): a captured log streamed through one `StreamSession` over the
single-process engine, the reference the actor pipeline must equal record for record.

Owns the serial loop only: read a line (the ingest actor's reader and renderer: pipeline/stream/sources.py), feed
it, write the assessment that falls due, and hand every event's record (pipeline/stream/events.py) to the caller's
`emit`; with a journal, the same records the output actor writes. What happens to a line is the session's
(pipeline/stream/session.py); this loop never decides when to assess, and never prints (`printer` does).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path


from models.platform import facts
from pipeline.config import Config
from pipeline.decode.assemble import make_engine
from pipeline.messages import Eof, Start
from pipeline.report import Report
from pipeline.stream import sources
from pipeline.stream.events import journaled, record_of, show
from pipeline.stream.frame import replay_frame
from pipeline.stream.journal import Journal
from pipeline.stream.session import StreamSession
from pipeline.stream.surprise import unscored_tokens


def make_session(cfg: Config, source_id: str = "") -> StreamSession:
    """A stream's session over the serial engine: target and draft in this process, the frame's head in the
    sinks."""
    frame = replay_frame(cfg)
    engine = make_engine(cfg, frame.spec)
    if cfg.replay.scored:
        engine.verifier.unscored = unscored_tokens(frame.tok, cfg.replay.score_every_token)
    engine.feed(frame.head)
    return StreamSession(engine, frame, cfg.replay, source_id)


def read(path: str, fmt: str | None, tok, max_lines: int = 0, speed: float = 0.0, rate: float = 0.0):
    """(the file's lines as the ingest actor sends them, with their tokens; a function giving its Eof counts)."""
    src = sources.replay(path, speed, fmt=fmt, stop=threading.Event(), rate=rate)
    counted = {"sent": 0, "tokens": 0}

    def lines():
        for seq, rec in enumerate(sources.parse(src.fmt, src), start=1):      # ingest numbers a file's lines from 1
            line = sources.line_of(rec, tok, seq, src.stats)
            yield line
            counted["sent"], counted["tokens"] = counted["sent"] + 1, counted["tokens"] + line.n_tokens
            if max_lines and counted["sent"] >= max_lines:
                return

    def eof() -> Eof:
        st = src.stats
        return Eof(sent=counted["sent"], tokens=counted["tokens"], dropped_full=0, invalid_utf8=st.invalid_utf8,
                   nul_bytes=st.nul_bytes, oversized=st.oversized, lines=st.lines, stopped=False, figures=[])

    return lines(), eof


def replay(log: str, fmt: str | None, cfg: Config, emit, max_lines: int = 0, session: StreamSession | None = None,
           speed: float = 0.0, rate: float = 0.0) -> dict:
    """Stream a captured log through the serial engine, writing an assessment whenever one falls due.
    emit(kind, record) receives every event's journal record ("start", "line", "assessment", "eof"). session: one
    made by `make_session(cfg)` (a measurement that watches its engine), else a new one. Returns the totals."""
    path = str(Path(log).resolve())
    session = session or make_session(cfg, path)
    session.source_id = session.source_id or path
    engine, frame = session.engine, session.frame
    stops, spec = set(frame.tok.stop_ids), frame.spec
    exactness = engine.exactness.as_dict() if engine.exactness is not None else {}

    def out(event) -> None:
        record = record_of(event, frame.tok, stops)
        emit(record["kind"], record)

    out(Start(exactness=exactness, platform=facts(), model=cfg.model.gguf, draft=cfg.draft.kind, sink=spec.sink,
              window=spec.window, ring=spec.ring))
    t0 = time.perf_counter()
    totals = {"lines": 0, "stream_tokens": 0, "assessments": 0, "generated": 0, "decode_s": 0.0}
    lines, eof = read(log, fmt, frame.tok, max_lines, speed, rate)
    for line in lines:
        for event in session.feed([line]):
            out(event)
        totals["lines"] += 1
        totals["stream_tokens"] += line.n_tokens
        if session.due is None:
            continue
        assessment = session.assess()
        totals["assessments"] += 1
        totals["generated"] += assessment.stats["generated"]
        totals["decode_s"] += assessment.stats["decode_s"]
        out(assessment)
    out(eof())
    totals["wall_s"] = time.perf_counter() - t0
    totals["tokens_per_s"] = totals["generated"] / totals["decode_s"] if totals["decode_s"] else 0.0
    return totals


def printer(quiet_lines: bool = False, journal: str | None = None, supervise=None):
    """An `emit` for `replay`: every record shown as the pipeline's output actor shows it (stdout and stderr) and,
    with `journal`, appended to it durably as that actor appends it (rotated as `supervise`, a profile's
    [supervise], says). `emit.close()` closes the journal."""
    log = None if not journal else Journal.of(journal, supervise) if supervise else Journal(journal)

    def emit(kind: str, record: dict) -> None:
        if log is not None and journaled(record):
            log.append(record)
        show(record, quiet_lines)

    emit.close = log.close if log is not None else (lambda: None)
    return emit


@dataclass
class ReplayReport(Report):
    """The serial replay's totals (what `replay` returns)."""

    def text(self) -> str:
        t = self.data
        return (f"replayed {t['lines']} lines ({t['stream_tokens']} tokens), {t['assessments']} assessments, "
                f"{t['tokens_per_s']:.0f} tok/s decode, {t['wall_s']:.1f} s")

"""The replay's frame and its single-process analyst: the ring a replay's engines are built with, the primed engine
that answers between lines (with the identifiers of the lines in view, which its answers' rule allows), and a captured
log streamed through it (`replay --launcher serial`).

Owns the replay frame (sinks sized to the system prompt, slack for the scratch span and the uncommitted rows), and how
the serial replay reads on a terminal (`printer` for its events, `ReplayReport` for its totals). `replay` never
prints: events go to the caller's `emit`.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.registry import resolve_gguf
from models.tokenizer import Tokenizer
from pipeline.config import Config, ring_spec
from pipeline.decode.assemble import make_engine
from pipeline.report import Report
from pipeline.stream.forms import Writer, Written, fields_of, in_view, text_of
from pipeline.stream.identifiers import carried
from pipeline.stream.prompts import stream_head
from pipeline.stream.records import read_log
from pipeline.stream.surprise import Surprise, record_of, unscored_tokens, unusual_mark
from pipeline.stream.triggers import Triggers


@dataclass(frozen=True)
class Frame:
    """What the replay's engines (serial, or target and draft actors) are built from: one source for the ring."""
    tok: Tokenizer
    head: np.ndarray
    params: SamplingParams
    spec: RingSpec
    writer: Writer


@dataclass
class Analyst:
    """The replay's engine, primed: system prompt and the open user turn in the sinks; `assess` asks the question
    in a scratch span that is rolled back, so the ring holds only the stream."""
    engine: object
    frame: Frame
    lines: deque = field(default_factory=deque)     # (first position, identifiers) of the lines that may be in view
    fresh: set = field(default_factory=set)         # identifiers of the lines since the last assessment

    def saw(self, first: int, identifiers) -> None:
        """A stream line whose first token is at `first` is in the ring; lines a window behind are forgotten."""
        self.lines.append((first, tuple(identifiers)))
        self.fresh.update(identifiers)
        while self.lines[0][0] < first - self.frame.spec.window:
            self.lines.popleft()

    def assess(self, latest: str = "", keep_going=None) -> tuple[Written, list[str]]:
        """(the assessment after the `latest` line, the identifiers it could see); a cut one (keep_going) is to be
        asked again."""
        f, mark = self.frame, self.engine.mark()
        ask = f.writer.ask(latest)
        allowed = in_view(self.lines, self.engine.index.n, len(ask), f.writer.scratch(), f.spec.window)
        written = f.writer.write(self.engine, ask, allowed, f.params, keep_going, self.fresh)
        self.engine.rollback(mark)
        if not written.cut:
            self.fresh = set()
        return written, allowed


def replay_frame(cfg: Config) -> Frame:
    """The system prompt and the open user turn (kept in the sinks), the question, and the ring sized for them: the
    scratch span holds the question and its answer, or an operator's question span and its answer when serving."""
    params = cfg.sampling.params()
    tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
    r = cfg.replay
    writer = Writer(tok, r.form, r.max_new_tokens, r.system_prompt, r.question, r.form_question)
    scratch = writer.span()
    if cfg.serve.enabled:                    # an operator's question span and its answer
        scratch = max(scratch, cfg.serve.max_prompt_tokens + cfg.serve.max_answer_tokens)
    head = stream_head(tok, r.system_prompt)
    return Frame(tok, head, params, ring_spec(cfg, head=len(head), scratch=scratch), writer)


def make_analyst(cfg: Config) -> Analyst:
    """The single-process analyst: target and draft in this process (`replay --launcher serial`)."""
    frame = replay_frame(cfg)
    engine = make_engine(cfg, frame.spec)
    engine.feed(frame.head)
    return Analyst(engine, frame)


def replay(log: str, fmt: str, cfg, emit, max_lines: int = 0, analyst: Analyst | None = None) -> dict:
    """Stream a captured log through the single-process engine, asking for assessments when the triggers say.
    emit(kind, payload) receives "line" and "assessment" events. analyst: one made by `make_analyst(cfg)` (a
    measurement that watches its engine), else a new one."""
    records = read_log(log, fmt)[: max_lines or None]
    analyst = analyst or make_analyst(cfg)
    engine, tok = analyst.engine, analyst.frame.tok
    t0 = time.perf_counter()
    totals = {"lines": 0, "stream_tokens": 0, "assessments": 0, "generated": 0, "decode_s": 0.0}
    triggers = Triggers(cfg.replay.every_lines, cfg.replay.trigger_pattern, surprise_above=cfg.replay.surprise_above)
    surprise = Surprise(cfg.replay.surprise_above) if cfg.replay.scored else None
    if surprise is not None:
        engine.verifier.unscored = unscored_tokens(tok, cfg.replay.score_every_token)
    for rec in records:
        analyst.saw(engine.index.n, carried(rec.text, rec.tags))
        ids = tok.encode(rec.text + "\n")
        nll = engine.feed(ids, score=surprise is not None)
        scored = None if surprise is None else surprise.line(rec.text, nll)
        totals["stream_tokens"] += len(ids)
        totals["lines"] += 1
        emit("line", {"offset": rec.offset, "text": rec.text, **record_of(scored)})
        reason = triggers.after_line(rec.text, scored and scored.surprise)
        if reason is None:
            continue
        written, allowed = analyst.assess(rec.text)
        st = written.stats.as_dict()
        totals["assessments"] += 1
        totals["generated"] += st["generated"]
        totals["decode_s"] += st["decode_s"]
        emit("assessment", {"offset": rec.offset, "lines": totals["lines"], "trigger": reason,
                            "text": text_of(tok, written.ids), "stats": st, "window_tags": allowed,
                            **({"fields": fields_of(tok, written.fields)} if written.fields is not None else {})})
    totals["wall_s"] = time.perf_counter() - t0
    totals["tokens_per_s"] = totals["generated"] / totals["decode_s"] if totals["decode_s"] else 0.0
    return totals


def printer(quiet_lines: bool = False):
    """An `emit` for `replay` that prints every line (unless quiet_lines) and every assessment as it happens."""

    def emit(kind, payload):
        if kind == "line" and not quiet_lines:
            print(unusual_mark(payload) or f"  {payload['text']}")
        elif kind == "assessment":
            st = payload["stats"]
            text = payload["text"].replace("\n", "\n   ")
            print(f"\n>> [after line {payload['lines']}, {payload['trigger']}] {text}\n"
                  f"   ({st['generated']} tokens, {st['tokens_per_s']:.0f} tok/s, ttft {st['ttft_ms']:.0f} ms, "
                  f"{st['accepted_per_verify']:.2f} tokens/verify)\n", flush=True)
    return emit


@dataclass
class ReplayReport(Report):
    """The serial replay's totals (what `replay` returns)."""

    def text(self) -> str:
        t = self.data
        return (f"replayed {t['lines']} lines ({t['stream_tokens']} tokens), {t['assessments']} assessments, "
                f"{t['tokens_per_s']:.0f} tok/s decode, {t['wall_s']:.1f} s")

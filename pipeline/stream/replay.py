"""The replay's frame and its single-process analyst: the ring a replay's engines are built with, the primed engine
that answers between lines, and a captured log streamed through it (`replay --launcher serial`).

Owns the replay frame (sinks sized to the system prompt, slack for the scratch span and the uncommitted rows), and how
the serial replay reads on a terminal (`printer` for its events, `ReplayReport` for its totals). `replay` never
prints: events go to the caller's `emit`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.registry import resolve_gguf
from models.tokenizer import Tokenizer
from pipeline.config import Config, ring_spec
from pipeline.decode.assemble import make_engine
from pipeline.report import Report
from pipeline.stream.prompts import chat_frame
from pipeline.stream.records import read_log
from pipeline.stream.triggers import Triggers


@dataclass
class Analyst:
    """The replay's engine, primed: system prompt and the open user turn in the sinks; `assess` asks the question
    in a scratch span that is rolled back, so the ring holds only the stream."""
    engine: object
    tok: Tokenizer
    ask: np.ndarray
    params: SamplingParams
    max_new_tokens: int

    def assess(self):
        mark = self.engine.mark()
        res = self.engine.generate(self.ask, self.max_new_tokens, self.params, stop_ids=self.tok.stop_ids)
        self.engine.rollback(mark)
        return res


@dataclass(frozen=True)
class Frame:
    """What the replay's engines (serial, or target and draft actors) are built from: one source for the ring."""
    tok: Tokenizer
    head: np.ndarray
    ask: np.ndarray
    params: SamplingParams
    spec: RingSpec


def replay_frame(cfg: Config) -> Frame:
    """The system prompt and the open user turn (kept in the sinks), the question, and the ring sized for them: the
    scratch span holds the question and its answer, or an operator's question span and its answer when serving."""
    params = cfg.sampling.params()
    tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
    head, ask = chat_frame(tok, cfg.replay.system_prompt, cfg.replay.question)
    scratch = len(ask) + cfg.replay.max_new_tokens
    if cfg.serve.enabled:                    # an operator's question span and its answer
        scratch = max(scratch, cfg.serve.max_prompt_tokens + cfg.serve.max_answer_tokens)
    return Frame(tok, head, ask, params, ring_spec(cfg, head=len(head), scratch=scratch))


def make_analyst(cfg: Config) -> Analyst:
    """The single-process analyst: target and draft in this process (`replay --launcher serial`)."""
    frame = replay_frame(cfg)
    engine = make_engine(cfg, frame.spec)
    engine.feed(frame.head)
    return Analyst(engine, frame.tok, frame.ask, frame.params, cfg.replay.max_new_tokens)


def replay(log: str, fmt: str, cfg, emit, max_lines: int = 0, analyst: Analyst | None = None) -> dict:
    """Stream a captured log through the single-process engine, asking for assessments when the triggers say.
    emit(kind, payload) receives "line" and "assessment" events. analyst: one made by `make_analyst(cfg)` (a
    measurement that watches its engine), else a new one."""
    records = read_log(log, fmt)[: max_lines or None]
    analyst = analyst or make_analyst(cfg)
    engine, tok = analyst.engine, analyst.tok
    t0 = time.perf_counter()
    totals = {"lines": 0, "stream_tokens": 0, "assessments": 0, "generated": 0, "decode_s": 0.0}
    triggers = Triggers(cfg.replay.every_lines, cfg.replay.trigger_pattern)
    for rec in records:
        totals["stream_tokens"] += engine.append(rec.text + "\n")
        totals["lines"] += 1
        emit("line", rec)
        reason = triggers.after_line(rec.text)
        if reason is None:
            continue
        res = analyst.assess()
        st = res.stats.as_dict()
        totals["assessments"] += 1
        totals["generated"] += st["generated"]
        totals["decode_s"] += st["decode_s"]
        text = tok.decode([t for t in res.token_ids if t not in tok.stop_ids]).strip()
        emit("assessment", {"offset": rec.offset, "lines": totals["lines"], "trigger": reason, "text": text,
                            "stats": st})
    totals["wall_s"] = time.perf_counter() - t0
    totals["tokens_per_s"] = totals["generated"] / totals["decode_s"] if totals["decode_s"] else 0.0
    return totals


def printer(quiet_lines: bool = False):
    """An `emit` for `replay` that prints every line (unless quiet_lines) and every assessment as it happens."""

    def emit(kind, payload):
        if kind == "line" and not quiet_lines:
            print(f"  {payload.text}")
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

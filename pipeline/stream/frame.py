"""The replay's frame: what a stream's engines (the serial one, or the target and draft actors) are built from, so
every launcher builds the same ring.

Owns the frame (the system prompt and the open user turn kept in the sinks; the ring sized for them, with slack for
the scratch span where an assessment or an operator's question is asked and the uncommitted rows). Never runs a
model: the engine is built from the frame elsewhere (pipeline/decode/assemble.py, the actors).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.registry import resolve_gguf
from models.tokenizer import Tokenizer
from pipeline.config import Config, ring_spec
from pipeline.stream.forms import Writer
from pipeline.stream.prompts import stream_head


@dataclass(frozen=True)
class Frame:
    """What the replay's engines are built from: one source for the ring."""
    tok: Tokenizer
    head: np.ndarray          # [h] the system prompt and the open user turn: the sinks
    params: SamplingParams
    spec: RingSpec
    writer: Writer


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

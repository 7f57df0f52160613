"""The replay's frame: what a stream's engines (the serial one, or the target and draft actors) are built from, so
every launcher builds the same ring.

Owns the frame (the stream's own system prompt and open log turn kept in the sinks; the ring sized for them, with
slack for the scratch span where an assessment or an operator's question is asked and the uncommitted rows). Streams
that share a target share the ring's shape, not its contents: each stream's sinks hold its own head, and the ring is
sized once for all of them (the longest head, the largest span). Never runs a model: the engine is built from the
frame elsewhere (pipeline/decode/assemble.py, the actors).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.tokenizer import Tokenizer
from pipeline.config import Config, ring_spec, streams_of
from pipeline.stream.forms import Writer
from pipeline.stream.prompts import Prompt, stream_head


@dataclass(frozen=True)
class Frame:
    """What the replay's engines are built from: one source for the ring."""
    tok: Tokenizer
    head: np.ndarray          # [h] the stream's system prompt and its open log turn: the sinks
    params: SamplingParams
    spec: RingSpec
    writer: Writer


def replay_frame(cfg: Config) -> Frame:
    """The frame of `cfg`'s [replay] stream: its system prompt and open log turn (kept in the sinks), its question,
    and the ring, sized for every stream of `cfg` (their pools share one shape): the sinks hold the longest head, the
    scratch span the largest question and its answer, or an operator's question span and its answer when serving."""
    tok = cfg.target.tokenizer
    writer = Writer.of(tok, cfg.replay)
    head = stream_head(tok, Prompt.of(cfg.replay))
    replays = [scfg.replay for _, scfg in streams_of(cfg)]          # [replay] alone, or each stream's
    heads = [len(stream_head(tok, Prompt.of(r))) for r in replays]
    scratch = max(Writer.of(tok, r).span() for r in replays)
    if cfg.serve.enabled:                    # an operator's question span and its answer
        scratch = max(scratch, cfg.serve.max_prompt_tokens + cfg.serve.max_answer_tokens)
    return Frame(tok, head, cfg.sampling.params(), ring_spec(cfg, head=max(heads), scratch=scratch), writer)

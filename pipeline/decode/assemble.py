"""Turn a validated Config (or CLI options) into a ready single-process Engine: model, tokenizer, pools, draft.

Owns start-up order and start-up errors. Never runs a step.
"""
from __future__ import annotations

import sys

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.registry import converted_dir, resolve_gguf
from models.runner import Runner, RunnerOptions
from models.tokenizer import Tokenizer
from pipeline.decode.blocklen import LengthControl, line_end_ids
from pipeline.decode.drafts import (
    HybridDraft,
    ModelDraft,
    NoDraft,
    SuffixDraft,
    TreeDraft,
    speaks,
)
from pipeline.decode.engine import Engine
from pipeline.decode.exactness import check


def make_draft(kind: str, spec: RingSpec, params: SamplingParams, draft_gguf: str = "", max_rows: int = 32,
               threads: int = 1, target_vocab: int | None = None, min_confidence: float = 0.0, siblings: int = 0):
    """The proposer `kind` names; with siblings > 0 (suffix or hybrid) its chains become token trees."""
    draft = _chain_draft(kind, spec, params, draft_gguf, max_rows, threads, target_vocab, min_confidence)
    if not siblings:
        return draft
    if kind not in ("suffix", "hybrid"):
        raise ValueError(f"token trees (siblings = {siblings}) branch from the stream: draft kind suffix or hybrid, "
                         f"not {kind!r}")
    return TreeDraft(draft, draft if kind == "suffix" else draft.stream, siblings)


def _chain_draft(kind: str, spec: RingSpec, params: SamplingParams, draft_gguf: str, max_rows: int, threads: int,
                 target_vocab: int | None, min_confidence: float):
    if kind == "none":
        return NoDraft()
    if kind == "suffix":
        return SuffixDraft()
    if kind in ("model", "hybrid"):
        if not draft_gguf:
            raise ValueError(f"--draft {kind} needs --draft-model PATH.gguf")
        # batch_invariant off: a draft's rows only change what is proposed, never what is output, and its passes
        # are mostly one row, where the padding row would cost it a second row each time
        runner = Runner(converted_dir(resolve_gguf(draft_gguf)), spec,
                        RunnerOptions(threads=threads, max_rows=max_rows, batch_invariant=False))
        if target_vocab is not None and speaks(runner.card) != target_vocab:
            raise ValueError(f"draft vocabulary {speaks(runner.card)} != target vocabulary {target_vocab}: a draft "
                             f"must share the target's tokenizer")
        model = ModelDraft(runner, params, seed=params.seed, min_confidence=min_confidence)
        return model if kind == "model" else HybridDraft(SuffixDraft(), model)
    raise ValueError(f"unknown draft kind {kind!r} (none, suffix, model, hybrid)")


def make_engine(gguf: str = "default", sink: int = 4, window: int = 1024, slack: int = 0, max_rows: int = 32,
                threads: int = 2, draft: str = "none", draft_gguf: str = "", draft_len: int = 6,
                params: SamplingParams = SamplingParams(), draft_threads: int = 1,
                rope_angles: str = "float64", min_confidence: float = 0.0, siblings: int = 0,
                adaptive: bool = False, end_at_line: bool = False, batch_invariant: bool = True,
                check_rows: bool = True) -> Engine:
    """Everything `generate`, `score` and the replay need; the GGUF is converted on first use. adaptive: the number
    of proposals is chosen per pass (at most draft_len); end_at_line: a block ends after a newline-carrying token.
    check_rows: probe the target's batch invariance first (`engine.exactness`; a line on stderr when rows are not
    invariant); teacher-forced scoring, which claims no identity, may skip it."""
    path = resolve_gguf(gguf)
    spec = RingSpec(sink, window, window + max(slack, max_rows))
    runner = Runner(converted_dir(path), spec, RunnerOptions(threads=threads, max_rows=max_rows,
                                                             rope_angles=rope_angles, trees=siblings > 0,
                                                             batch_invariant=batch_invariant))
    exactness = check(runner) if check_rows else None
    if exactness is not None and not exactness.invariant:
        print(f"ringspec: warning: {exactness.line()}", file=sys.stderr, flush=True)
    tok = Tokenizer.from_gguf(path)
    proposer = make_draft(draft, spec, params, draft_gguf, max_rows, draft_threads, runner.vocab, min_confidence,
                          siblings)
    control = LengthControl(min(draft_len, max_rows - 1)) if adaptive else None
    ends = line_end_ids(tok, runner.vocab) if end_at_line else None
    engine = Engine(runner, tok, proposer, draft_len=draft_len, seed=params.seed, length_control=control,
                    line_ends=ends)
    engine.exactness = exactness
    return engine

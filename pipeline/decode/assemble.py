"""Turn a validated Config into a ready single-process Engine: model, tokenizer, pools, draft.

Owns start-up order and start-up errors. Never runs a step.
"""
from __future__ import annotations

import sys

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.handle import Model
from models.npu_runner import StaticRunner
from models.runner import Runner, RunnerOptions
from models.tokenizer import Tokenizer
from pipeline.config import Config, ring_spec
from pipeline.decode.blocklen import LengthControl, line_end_ids
from pipeline.decode.drafts import HybridDraft, ModelDraft, NoDraft, SuffixDraft, TreeDraft, speaks
from pipeline.decode.engine import Engine
from pipeline.decode.exactness import check
from pipeline.decode.step import Policy


def policy(cfg: Config, vocab: int, tokenizer: Tokenizer | None = None) -> Policy:
    """The block-length policy [draft] names, for a target of `vocab` ids: the length (capped by one pass's rows),
    adaptive length, line-end blocks (their token mask from `tokenizer`, default the target's)."""
    d, rows = cfg.draft, cfg.model.max_rows
    length = min(d.length, rows - 1)
    ends = None
    if d.end_at_line:
        ends = line_end_ids(tokenizer or cfg.target.tokenizer, vocab)
    control = LengthControl(length, measured=d.adaptive_costs == "measured") if d.adaptive else None
    return Policy(length, rows, control, ends, cfg.model.prefill_rows)


def make_draft(cfg: Config, spec: RingSpec, target_vocab: int | None = None, shared: list | None = None):
    """The proposer [draft] names, its model's pool sized by `spec`; with siblings > 0 (suffix or hybrid) its chains
    become token trees. shared: one list for the drafts of one process's streams (actors/draft.py): the first draft
    model's runner is kept in it, and the others run on its session (the weights, or the NPU's graphs, opened once),
    each with pools of its own."""
    d = cfg.draft
    model = cfg.draft_model if d.uses_model and d.model else None
    draft = _chain_draft(d.kind, spec, cfg.sampling.params(), model, cfg.model.max_rows, d.threads, target_vocab,
                         d.min_confidence, d.backend, [] if shared is None else shared, cfg.model.kernel,
                         d.npu_dtype)
    if not d.siblings:
        return draft
    if d.kind not in ("suffix", "hybrid"):
        raise ValueError(f"token trees (siblings = {d.siblings}) branch from the stream: draft kind suffix or hybrid, "
                         f"not {d.kind!r}")
    return TreeDraft(draft, draft if d.kind == "suffix" else draft.stream, d.siblings)


def _chain_draft(kind: str, spec: RingSpec, params: SamplingParams, draft: Model | None, max_rows: int, threads: int,
                 target_vocab: int | None, min_confidence: float, backend: str, shared: list, kernel: str,
                 npu_dtype: str = "float16"):
    if kind == "none":
        return NoDraft()
    if kind == "suffix":
        return SuffixDraft()
    if kind in ("model", "hybrid"):
        if not draft:
            raise ValueError(f"--draft {kind} needs --draft-model PATH.gguf")
        # batch_invariant off: a draft's rows only change what is proposed, never what is output, and its passes
        # are mostly one row, where the padding row would cost it a second row each time
        opts = RunnerOptions(threads=threads, max_rows=max_rows, batch_invariant=False, kernel=kernel)
        model_dir = draft.dir
        shares = shared[0] if shared else None
        if backend == "rknn":                      # the NPU (the draft only proposes: output stays exact)
            runner = StaticRunner(model_dir, spec, opts, backend="rknn", shares=shares, dtype=npu_dtype)
        else:
            runner = Runner(model_dir, spec, opts, shares=shares)
            if shares is None:
                runner.reserve()                   # its arena at the high-water mark before the first proposal
        if shares is None:
            shared.append(runner)
        if target_vocab is not None and speaks(runner.card) != target_vocab:
            raise ValueError(f"draft vocabulary {speaks(runner.card)} != target vocabulary {target_vocab}: a draft "
                             f"must share the target's tokenizer")
        model = ModelDraft(runner, params, seed=params.seed, min_confidence=min_confidence)
        return model if kind == "model" else HybridDraft(SuffixDraft(), model)
    raise ValueError(f"unknown draft kind {kind!r} (none, suffix, model, hybrid)")


def make_engine(cfg: Config, spec: RingSpec | None = None, *, check_rows: bool = True,
                rope_angles: str = "float64", profile: str = "") -> Engine:
    """The single-process engine of a validated config: target, pool (`spec`, default `ring_spec(cfg)`), draft,
    block-length policy. The GGUF is converted on first use. check_rows: probe the target's batch invariance first
    (`engine.exactness`; a line on stderr when rows are not invariant); teacher-forced scoring, which claims no
    identity, may skip it. profile: a file prefix for ONNX Runtime's profiler (bench/opprofile.py)."""
    m, d = cfg.model, cfg.draft
    spec = spec or ring_spec(cfg)
    params = cfg.sampling.params()
    runner = Runner(cfg.target.dir, spec, m.runner_options(rope_angles=rope_angles, trees=d.siblings > 0,
                                                                profile=profile))
    exactness = check(runner) if check_rows else None
    if exactness is not None and not exactness.invariant:
        print(f"ringspec: warning: {exactness.line()}", file=sys.stderr, flush=True)
    tok = cfg.target.tokenizer
    p = policy(cfg, runner.vocab, tok)
    engine = Engine(runner, tok, make_draft(cfg, spec, runner.vocab), draft_len=d.length, seed=params.seed,
                    length_control=p.control, line_ends=p.line_ends, rows=p.max_rows, prefill_rows=p.prefill_rows)
    engine.exactness = exactness
    return engine

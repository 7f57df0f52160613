"""The work behind the CLI verbs: score text, generate, replay a log with running assessments.

Each function takes plain arguments and returns plain data; printing is the CLI's job. Never parses argv.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.convert import load_card
from models.registry import converted_dir
from models.tokenizer import Tokenizer
from pipeline.assemble import make_engine, resolve_gguf
from pipeline.prompts import chat_frame  # noqa: F401 -- the replay's frame; bench imports it from here
from pipeline.records import read_log
from pipeline.triggers import Triggers


class ContextTooLong(ValueError):
    pass


def _full_cache(path, need: int, what: str) -> int:
    """Window of a plain full cache holding `need` tokens; an error past the model's context length."""
    ctx = load_card(converted_dir(path))["config"]["context_length"]
    if need > ctx:
        raise ContextTooLong(f"{what} exceed the model's context length {ctx}; pass --window W (and --sink S) "
                             f"to use the ring policy")
    return need


def score(text: str, sink: int | None = None, window: int | None = None, gguf: str = "default",
          chunk: int = 64, threads: int = 2) -> dict:
    """Teacher-forced mean NLL of `text` (the first token is not scored).

    window None: a plain full cache sized to the text (an error past the model's context length). Otherwise the
    ring policy with `sink` sinks and a `window`, computed in chunks with per-row masks.
    """
    path = resolve_gguf(gguf)
    ids = Tokenizer.from_gguf(path).encode(text)
    n = len(ids)
    if n < 2:
        raise ValueError(f"the text has {n} token(s); scoring needs at least 2")
    if window is None:
        sink, window = 0, _full_cache(path, n, f"the text's {n} tokens")
    engine = make_engine(gguf, sink=sink or 0, window=window, max_rows=chunk, threads=threads, check_rows=False)
    nll = np.zeros(n - 1, np.float64)

    def collect(start: int, logits: np.ndarray) -> None:
        rows = logits.astype(np.float64)
        rows -= rows.max(axis=-1, keepdims=True)
        logz = np.log(np.exp(rows).sum(axis=-1))
        for j in range(len(rows)):
            t = start + j + 1                      # row j predicts token start + j + 1
            if t < n:
                nll[t - 1] = logz[j] - rows[j, ids[t]]

    engine.feed(ids, all_logits=True, on_logits=collect)
    return {"n_tokens": int(n), "nll_mean": float(nll.mean()), "token_ids": [int(t) for t in ids]}


def generate(prompt: str, chat: bool = False, max_tokens: int = 64, params: SamplingParams = SamplingParams(),
             draft: str = "none", draft_gguf: str = "", draft_len: int = 6, sink: int | None = None,
             window: int | None = None, gguf: str = "default", threads: int = 2, max_rows: int = 32,
             siblings: int = 0) -> dict:
    """Generate from a raw (or chat-templated) prompt; greedy when temperature is 0.

    window None: a plain full cache, sized to prompt + max_tokens (an error past the model's context length).
    """
    path = resolve_gguf(gguf)
    tok = Tokenizer.from_gguf(path)
    ids = tok.render_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    if len(ids) == 0:
        raise ValueError("the prompt is empty")
    if window is None:
        sink, window = 0, _full_cache(path, len(ids) + max_tokens,
                                      f"the prompt ({len(ids)} tokens) + max tokens ({max_tokens})")
    engine = make_engine(gguf, sink=sink or 0, window=window, max_rows=max_rows, threads=threads, draft=draft,
                         draft_gguf=draft_gguf, draft_len=draft_len, params=params, siblings=siblings)
    result = engine.generate(ids, max_tokens, params, stop_ids=tok.stop_ids if chat else ())
    return {"token_ids": result.token_ids, "text": tok.decode(result.token_ids), "stats": result.stats.as_dict()}


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


def replay_frame(cfg) -> Frame:
    """The sinks grow to hold the system prompt; the slack holds the scratch span (question and answer) plus the
    uncommitted rows beyond it: a target block, or two draft blocks when the draft runs a block ahead."""
    c = cfg
    params = SamplingParams(c.sampling.temperature, c.sampling.top_k, c.sampling.top_p, c.sampling.seed)
    tok = Tokenizer.from_gguf(resolve_gguf(c.model.gguf))
    head, ask = chat_frame(tok, c.replay.system_prompt, c.replay.question)
    scratch = len(ask) + c.replay.max_new_tokens
    if c.serve.enabled:                    # an operator's question span and its answer
        scratch = max(scratch, c.serve.max_prompt_tokens + c.serve.max_answer_tokens)
    slack = max(c.cache.slack, scratch + max(c.model.max_rows, 2 * (c.draft.length + 1)))
    return Frame(tok, head, ask, params, RingSpec(max(c.cache.sink, len(head)), c.cache.window,
                                                  c.cache.window + slack))


def make_analyst(cfg) -> Analyst:
    """The single-process analyst: target and draft in this process (`replay --launcher serial`)."""
    c, f = cfg, replay_frame(cfg)
    engine = make_engine(c.model.gguf, sink=f.spec.sink, window=f.spec.window, slack=f.spec.slack,
                         max_rows=c.model.max_rows, threads=c.model.threads, draft=c.draft.kind,
                         draft_gguf=c.draft.model, draft_len=c.draft.length, params=f.params,
                         draft_threads=c.draft.threads, min_confidence=c.draft.min_confidence,
                         adaptive=c.draft.adaptive, end_at_line=c.draft.end_at_line, siblings=c.draft.siblings,
                         batch_invariant=c.model.batch_invariant)
    engine.feed(f.head)
    return Analyst(engine, f.tok, f.ask, f.params, c.replay.max_new_tokens)


def replay(log: str, fmt: str, cfg, emit, max_lines: int = 0) -> dict:
    """Stream a captured log through the single-process engine, asking for assessments when the triggers say.
    emit(kind, payload) receives "line" and "assessment" events."""
    records = read_log(log, fmt)[: max_lines or None]
    analyst = make_analyst(cfg)
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

"""Score a text and generate from a prompt with the single-process engine (the `score` and `generate` verbs).

Owns the full-cache default (a plain cache sized to the text, refused past the model's context length), the check that
a text file is UTF-8, and how both results read (`GenerateReport`, `ScoreReport`). Never parses argv and never
prints: it returns reports.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.config import Config, DraftSection, override
from pipeline.decode.assemble import make_engine
from pipeline.report import Report


class ContextTooLong(ValueError):
    pass


@dataclass
class ScoreReport(Report):
    """{"n_tokens", "nll_mean", "token_ids"}."""

    def text(self) -> str:
        return f"{self.data['n_tokens']} tokens, mean NLL {self.data['nll_mean']:.4f}"


@dataclass
class GenerateReport(Report):
    """{"token_ids", "text", "stats"}: the text on stdout, the figures on stderr."""

    def text(self) -> str:
        return self.data["text"]

    def notes(self) -> str:
        st = self.data["stats"]
        return (f"\n[{st['generated']} tokens, {st['tokens_per_s']:.1f} tok/s, ttft {st['ttft_ms']:.0f} ms, "
                f"{st['accepted_per_verify']:.2f} tokens/verify]")


def read_text(path: str) -> str:
    """A text file's contents; a precise error (where, and how to convert) when it is not UTF-8."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
                         f"convert it first, e.g. iconv -f latin1 -t utf-8") from None


def _full_cache(cfg: Config, need: int, what: str) -> Config:
    """`cfg` with a plain full cache holding `need` tokens (no sinks, nothing wraps); an error past the model's
    context length."""
    ctx = cfg.target.config["context_length"]
    if need > ctx:
        raise ContextTooLong(f"{what} exceed the model's context length {ctx}; pass --window W (and --sink S) "
                             f"to use the ring policy")
    return override(cfg, {"cache.sink": 0, "cache.window": need})


def score(text: str, cfg: Config, ring: bool = False, chunk: int = 64) -> ScoreReport:
    """Teacher-forced mean NLL of a text (the first token is not scored), with a plain full cache or the ring policy.

    In chunks of `chunk` rows with per-row masks. ring False: a plain full cache sized to the text (an error past the
    model's context length); True: the profile's sinks and window. No draft: nothing is generated."""
    cfg = override(cfg, {"model.max_rows": chunk})
    cfg = dataclasses.replace(cfg, draft=DraftSection(kind="none"))
    ids = cfg.target.tokenizer.encode(text)
    n = len(ids)
    if n < 2:
        raise ValueError(f"the text has {n} token(s); scoring needs at least 2")
    if not ring:
        cfg = _full_cache(cfg, n, f"the text's {n} tokens")
    engine = make_engine(cfg, check_rows=False)
    nll = engine.feed(ids, score=True)[1:].astype(np.float64)     # the pass's own surprisal (models/graph.py)
    return ScoreReport({"n_tokens": int(n), "nll_mean": float(nll.mean()), "token_ids": [int(t) for t in ids]})


def generate(prompt: str, cfg: Config, chat: bool = False, max_tokens: int = 64,
             ring: bool = False) -> GenerateReport:
    """Generate text; greedy unless --temperature > 0. With a draft, output is exactly what the target alone produces
    (lossless speculative decoding).

    From a raw (or chat-templated) prompt with the profile's draft and sampling. ring False: a plain full cache sized
    to prompt + max_tokens (an error past the model's context length); True: the profile's sinks and window."""
    tok = cfg.target.tokenizer
    ids = tok.render_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    if len(ids) == 0:
        raise ValueError("the prompt is empty")
    if not ring:
        cfg = _full_cache(cfg, len(ids) + max_tokens,
                          f"the prompt ({len(ids)} tokens) + max tokens ({max_tokens})")
    engine = make_engine(cfg)
    result = engine.generate(ids, max_tokens, cfg.sampling.params(), stop_ids=tok.stop_ids if chat else ())
    return GenerateReport({"token_ids": result.token_ids, "text": tok.decode(result.token_ids),
                           "stats": result.stats.as_dict()})

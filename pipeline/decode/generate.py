"""Score a text and generate from a prompt with the single-process engine (the `score` and `generate` verbs).

Owns the full-cache default (a plain cache sized to the text, refused past the model's context length). Never parses
argv and never prints: it returns plain data.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from models.convert import load_card
from models.registry import converted_dir, resolve_gguf
from models.tokenizer import Tokenizer
from pipeline.config import Config, DraftSection, override
from pipeline.decode.assemble import make_engine


class ContextTooLong(ValueError):
    pass


def _full_cache(cfg: Config, need: int, what: str) -> Config:
    """`cfg` with a plain full cache holding `need` tokens (no sinks, nothing wraps); an error past the model's
    context length."""
    ctx = load_card(converted_dir(resolve_gguf(cfg.model.gguf)))["config"]["context_length"]
    if need > ctx:
        raise ContextTooLong(f"{what} exceed the model's context length {ctx}; pass --window W (and --sink S) "
                             f"to use the ring policy")
    return override(cfg, {"cache.sink": 0, "cache.window": need})


def score(text: str, cfg: Config, ring: bool = False, chunk: int = 64) -> dict:
    """Teacher-forced mean NLL of `text` (the first token is not scored), in chunks of `chunk` rows with per-row
    masks. ring False: a plain full cache sized to the text (an error past the model's context length); True: the
    profile's sinks and window. No draft: nothing is generated."""
    cfg = override(cfg, {"model.max_rows": chunk})
    cfg = dataclasses.replace(cfg, draft=DraftSection(kind="none"))
    ids = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf)).encode(text)
    n = len(ids)
    if n < 2:
        raise ValueError(f"the text has {n} token(s); scoring needs at least 2")
    if not ring:
        cfg = _full_cache(cfg, n, f"the text's {n} tokens")
    engine = make_engine(cfg, check_rows=False)
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


def generate(prompt: str, cfg: Config, chat: bool = False, max_tokens: int = 64, ring: bool = False) -> dict:
    """Generate from a raw (or chat-templated) prompt with the profile's draft and sampling; greedy when temperature
    is 0. ring False: a plain full cache sized to prompt + max_tokens (an error past the model's context length);
    True: the profile's sinks and window."""
    tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
    ids = tok.render_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    if len(ids) == 0:
        raise ValueError("the prompt is empty")
    if not ring:
        cfg = _full_cache(cfg, len(ids) + max_tokens,
                          f"the prompt ({len(ids)} tokens) + max tokens ({max_tokens})")
    engine = make_engine(cfg)
    result = engine.generate(ids, max_tokens, cfg.sampling.params(), stop_ids=tok.stop_ids if chat else ())
    return {"token_ids": result.token_ids, "text": tok.decode(result.token_ids), "stats": result.stats.as_dict()}

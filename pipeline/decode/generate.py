"""Score a text and generate from a prompt with the single-process engine (the `score` and `generate` verbs).

Owns the full-cache default (a plain cache sized to the text, refused past the model's context length). Never parses
argv and never prints: it returns plain data.
"""
from __future__ import annotations

import numpy as np

from kernels.sampling import SamplingParams
from models.convert import load_card
from models.registry import converted_dir, resolve_gguf
from models.tokenizer import Tokenizer
from pipeline.decode.assemble import make_engine


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

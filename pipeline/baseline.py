"""Baseline speed, measured side by side in one run: ringspec target-only and with the suffix draft vs llama.cpp.

Owns the measurement protocol: the same GGUF, the same rendered log prefix, greedy decoding, systems alternated
within each repeat, medians reported. llama.cpp runs only when llama-cpp-python is installed (the `bench` extra).
Never asserts a speed: it prints numbers.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from kernels.sampling import SamplingParams
from pipeline.assemble import make_engine, resolve_gguf
from pipeline.records import read_log, render


def _ringspec(draft: str, prompt: np.ndarray, new_tokens: int, window: int, threads: int) -> dict:
    engine = make_engine(sink=4, window=window, draft=draft, draft_len=6, threads=threads)
    res = engine.generate(prompt, new_tokens, SamplingParams())
    st = res.stats.as_dict()
    return {"prompt_tokens_per_s": st["prompt_tokens_per_s"], "tokens_per_s": st["tokens_per_s"],
            "accepted_per_verify": st["accepted_per_verify"], "token_ids": res.token_ids}


def _llama_cpp(llm, prompt: np.ndarray, new_tokens: int) -> dict:
    n_vocab = llm.n_vocab()
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt.tolist())
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
    out = [int(np.argmax(logits))]
    t1 = time.perf_counter()
    while len(out) < new_tokens:
        llm.eval([out[-1]])
        out.append(int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)))))
    t2 = time.perf_counter()
    return {"prompt_tokens_per_s": len(prompt) / (t1 - t0), "tokens_per_s": (new_tokens - 1) / (t2 - t1),
            "accepted_per_verify": 1.0, "token_ids": out}


def run_baseline(log: str, prompt_tokens: int = 512, new_tokens: int = 128, repeats: int = 3, window: int = 1024,
                 threads: int = 2, offsets: int = 3, progress=None) -> dict:
    """Medians over `repeats` x `offsets` runs; each run uses a different `prompt_tokens` slice of the log."""
    from models.tokenizer import Tokenizer

    gguf = resolve_gguf("default")
    ids = Tokenizer.from_gguf(gguf).encode(render(read_log(log)))
    span = len(ids) - prompt_tokens
    if span <= 0:
        raise ValueError(f"{log} renders to {len(ids)} tokens; need more than {prompt_tokens}")
    starts = [int(s) for s in np.linspace(0, span, offsets)]
    systems = {"ringspec_target_only": lambda p: _ringspec("none", p, new_tokens, window, threads),
               "ringspec_suffix": lambda p: _ringspec("suffix", p, new_tokens, window, threads)}
    try:
        from llama_cpp import Llama

        llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512,
                    flash_attn=True, verbose=False)
        systems["llama_cpp"] = lambda p: _llama_cpp(llm, p, new_tokens)
    except ImportError:
        pass
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    agree = {name: [] for name in systems}
    for r in range(repeats):
        for start in starts:
            prompt = ids[start:start + prompt_tokens]
            reference = None
            for name, fn in systems.items():              # alternated within each repeat: same machine state
                result = fn(prompt)
                runs[name].append(result)
                reference = reference or result["token_ids"]
                agree[name].append(_prefix_agreement(result["token_ids"], reference))
                if progress:
                    progress(name, r, start, result)
    table = {}
    for name, results in runs.items():
        table[name] = {key: statistics.median(x[key] for x in results)
                       for key in ("prompt_tokens_per_s", "tokens_per_s", "accepted_per_verify")}
        table[name]["greedy_prefix_agreement_with_target_only"] = statistics.median(agree[name])
    return {"log": str(log), "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "repeats": repeats,
            "offsets": starts, "pool": {"sink": 4, "window": window}, "threads": threads, "systems": table}


def _prefix_agreement(a: list[int], b: list[int]) -> int:
    """Number of leading tokens two greedy outputs share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n

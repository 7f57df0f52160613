"""llama.cpp speculative decoding's fair peer: a draft GGUF run greedily by llama.cpp itself, keeping its KV cache
between calls, as llama-cpp-python's `draft_model` (a `LlamaDraftModel`: given every token so far, return a guess).

Owns the draft's llama.cpp context and what it has evaluated. Each call keeps the longest prefix its cache shares
with the tokens given (everything up to the first rejected guess), evaluates the rest in one batch, then extends
greedily one token at a time, stopping at `k` tokens or when its top probability falls below `p_min` (llama.cpp's
own speculative example stops the same way: `--draft-p-min`, common/speculative.cpp). A draft that called
`generate` afresh each time re-read the whole context per guess and ran at a quarter of plain decoding (issue 46).
Never verifies anything: llama-cpp-python's `Llama.generate` does, from the target's logits of every row.
"""
from __future__ import annotations

import numpy as np


def greedy_draft(lib, gguf: str, n_ctx: int, k: int, threads: int, p_min: float = 0.0):
    """A `lib.llama_speculative.LlamaDraftModel` over `gguf` (lib: the llama_cpp module, imported by the caller)."""

    class GreedyDraft(lib.llama_speculative.LlamaDraftModel):
        def __init__(self):
            self.llm = lib.Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                 n_batch=512, flash_attn=True, logits_all=False, verbose=False)
            self.vocab = self.llm.n_vocab()
            self.calls = self.proposed = self.evaluated = 0    # guesses asked, tokens proposed, tokens evaluated

        def _top(self) -> tuple[int, float]:
            """The greedy next token after everything evaluated, and its probability."""
            row = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))
            best = int(row.argmax())
            return best, float(1.0 / np.exp(row - row[best]).sum())

        def __call__(self, input_ids, /, **kwargs):
            llm, ids = self.llm, np.asarray(input_ids)
            have = llm.input_ids[:llm.n_tokens]
            n = min(len(have), len(ids))
            same = int(np.argmin(have[:n] == ids[:n])) if n and not (have[:n] == ids[:n]).all() else n
            same = min(same, len(ids) - 1)                     # at least one token evaluated: fresh logits
            llm.n_tokens = same                                # eval drops the cache past n_tokens
            llm.eval(ids[same:].tolist())
            self.evaluated += len(ids) - same
            out = []
            while len(out) < k and llm.n_tokens < n_ctx - 1:
                token, p = self._top()
                if p < p_min and out:
                    break
                out.append(token)
                if len(out) < k:
                    llm.eval([token])
                    self.evaluated += 1
            self.calls += 1
            self.proposed += len(out)
            return np.asarray(out, dtype=np.intc)

    return GreedyDraft()

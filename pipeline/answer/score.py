"""The model scores whole spans: which of a few candidates the target reads as the answer copied from the line.

Owns the scoring prompt (one log line, the question, one generic example, no ring and no system prompt: issue 59) and
`score_spans`: each candidate as a teacher-forced continuation " SPAN\\n" of that prompt, its tokens' log-probabilities
summed with the end's (the line end says the answer stops there), so a whole option is scored, never decided on its
first token. Three readings of the same numbers (`Scored`): the sum, the mean over the span's tokens (length
normalised), and the sum less the same continuation's log-probability without the question (PMI: how much the
question raises the span, Holtzman et al. 2021's domain-conditional PMI); bench/answer_stages.py measures which picks
best. The prompt is fed once; each candidate is fed after it and rolled back (`Engine.rollback`), so no candidate sees
another. Never ranks, never reads the archive: a caller hands it a line, a question and the candidates.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INSTRUCTION = "Copy the answer to the question from the log line, exactly as the line writes it."
EXAMPLE = ("2024-01-02 10:00:01 gw7 auth: session=8 user=operator3 action=login result=ok from 10.1.2.3",
           "Which user started session 8?", "operator3")
END = "\n"


def prompt_of(line: str, question: str) -> str:
    """The scoring prompt; a candidate follows it as " SPAN\\n"."""
    def block(lg: str, q: str) -> str:
        return f"Log line: {lg}\nQuestion: {q}\nAnswer copied from the line:"
    return f"{INSTRUCTION}\n\n{block(*EXAMPLE[:2])} {EXAMPLE[2]}{END}\n{block(line, question)}"


@dataclass(frozen=True)
class Scored:
    span: str
    logp: float          # sum of log p over the span's tokens and the end
    mean: float          # logp over the number of tokens scored
    pmi: float           # logp less the same continuation's log p under the prompt with no question

    def by(self, reading: str) -> float:
        return {"sum": self.logp, "mean": self.mean, "pmi": self.pmi}[reading]


def _continuations(engine, prompt: str, spans: list[str]) -> list[np.ndarray]:
    """Each span's log-probabilities after `prompt` (float64, one per token of " SPAN\n"). Each is fed with the
    prompt's last token before it, so that token's row, in the same pass, scores the span's first token."""
    tok = engine.tok
    ids = tok.encode(prompt)
    engine.reset()
    engine.feed(ids[:-1])
    mark = engine.index.n
    out = []
    for span in spans:
        nll = engine.feed(np.concatenate([ids[-1:], tok.encode(f" {span}{END}", add_bos=False)]), score=True)[1:]
        engine.rollback(mark)
        if np.isnan(nll).any():
            raise RuntimeError(f"a token of {span!r} was not scored")
        out.append(-nll.astype(np.float64))
    return out


def score_spans(engine, line: str, question: str, spans: list[str]) -> list[Scored]:
    """Each candidate span scored by `engine`'s target (a single-process Engine, pipeline/decode/assemble.py), in
    the order given. The engine's cache must hold the prompt and a span (a plain cache of a few thousand tokens)."""
    asked = _continuations(engine, prompt_of(line, question), spans)
    blind = _continuations(engine, prompt_of(line, ""), spans)
    return [Scored(s, float(a.sum()), float(a.mean()), float(a.sum() - b.sum())) for s, a, b in zip(spans, asked, blind)]

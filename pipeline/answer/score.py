"""The model scores whole spans: which of a few candidates the target reads as the answer copied from the line.

Owns the scoring prompt (one log line, the question, one generic example, no ring and no system prompt: issue 59) and
`SpanScorer`: each candidate as a teacher-forced continuation " SPAN\\n" of that prompt, its tokens' log-probabilities
summed with the end's (the line end says the answer stops there), so a whole option is scored, never decided on its
first token. Three readings of the same numbers (`Scored`): the sum, the mean over the span's tokens (length
normalised), and the sum less the same continuation's log-probability without the question (PMI: how much the
question raises the span, Holtzman et al. 2021's domain-conditional PMI); bench/answer_stages.py measures which picks
best. The head (instruction and example) is fed once for every question; a question's block is fed after it, each
candidate after that, and both are rolled back (`Engine.rollback`), so no candidate sees another and no question
another's. Never ranks, never reads the archive: a caller hands it a line, a question and the candidates.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INSTRUCTION = "Copy the answer to the question from the log line, exactly as the line writes it."
EXAMPLE = ("2024-01-02 10:00:01 gw7 auth: session=8 user=operator3 action=login result=ok from 10.1.2.3",
           "Which user started session 8?", "operator3")
END = "\n"


def _block(line: str, question: str) -> str:
    return f"Log line: {line}\nQuestion: {question}\nAnswer copied from the line:"


HEAD = f"{INSTRUCTION}\n\n{_block(*EXAMPLE[:2])} {EXAMPLE[2]}{END}\n"     # the same for every question


def prompt_of(line: str, question: str) -> str:
    """The scoring prompt (HEAD, then this line's block); a candidate follows it as " SPAN\\n"."""
    return HEAD + _block(line, question)


def tokens(tok, line: str, question: str, spans) -> tuple[np.ndarray, list[np.ndarray]]:
    """A scoring question's tokens as the cache owner feeds them after its ring: the prompt (no BOS) and each span's
    continuation " SPAN\\n"."""
    return tok.encode(prompt_of(line, question), add_bos=False), _continued(tok, spans)


def _continued(tok, spans) -> list[np.ndarray]:
    """Each span as the continuation scored: " SPAN\\n"."""
    return [tok.encode(f" {span}{END}", add_bos=False) for span in spans]


def too_long(prompt: np.ndarray, spans, room: int) -> str:
    """Why a scoring question does not fit the owner's scratch span of `room` tokens (serve.max_prompt_tokens +
    serve.max_answer_tokens), or "" when it does."""
    longest = max(len(t) for t in spans)
    if len(prompt) + longest <= room:
        return ""
    return (f"the scoring prompt takes {len(prompt)} tokens and its longest candidate {longest}, more than the "
            f"scratch span's {room}")


def continuations(engine, prompt: np.ndarray, spans, keep_going=lambda: True) -> list[np.ndarray]:
    """Each span's log-probabilities (float64, one per token of the span's ids) teacher-forced after `prompt`, fed
    into `engine` (a Decoder) at its current position; the engine is left after the prompt's all-but-last token. The
    prompt's last token is fed with each span, so its row, in the same pass, scores the span's first token; each span
    is rolled back before the next (no span sees another). keep_going() is asked before each span: False stops there
    (the spans scored so far are returned)."""
    engine.feed(prompt[:-1])
    mark = engine.index.n
    out = []
    for span in spans:
        if not keep_going():
            break
        nll = engine.feed(np.concatenate([prompt[-1:], span]), score=True)[1:]
        engine.rollback(mark)
        if np.isnan(nll).any():
            raise RuntimeError(f"a token of {span!r} was not scored")
        out.append(-nll.astype(np.float64))
    return out


@dataclass(frozen=True)
class Scored:
    span: str
    logp: float          # sum of log p over the span's tokens and the end
    mean: float          # logp over the number of tokens scored
    pmi: float           # logp less the same continuation's log p under the prompt with no question

    def by(self, reading: str) -> float:
        return {"sum": self.logp, "mean": self.mean, "pmi": self.pmi}[reading]


class SpanScorer:
    """Scores candidates on a single-process Engine (pipeline/decode/assemble.py) whose cache holds HEAD, fed once:
    each question feeds only its own block after it, each candidate after that, and both are rolled back. The cache
    must hold HEAD, a block and a span (a plain cache of a few thousand tokens)."""

    def __init__(self, engine):
        self.engine, self.tok = engine, engine.tok
        engine.reset()
        engine.feed(self.tok.encode(HEAD))
        self.head = engine.index.n

    def continuations(self, line: str, question: str, spans: list[str]) -> list[np.ndarray]:
        """Each span's log-probabilities (float64, one per token of " SPAN\\n") after HEAD and the line's block. A
        span is fed with the block's last token before it, so that token's row, in the same pass, scores the span's
        first token."""
        self.engine.rollback(self.head)
        return continuations(self.engine, self.tok.encode(_block(line, question), add_bos=False),
                             _continued(self.tok, spans))

    def score(self, line: str, question: str, spans: list[str], pmi: bool = True) -> list[Scored]:
        """Each candidate span scored, in the order given; pmi False: no second feed without the question (its
        `pmi` reading is then NaN)."""
        asked = self.continuations(line, question, spans)
        blind = self.continuations(line, "", spans) if pmi else [np.full(1, np.nan)] * len(spans)
        return [Scored(s, float(a.sum()), float(a.mean()), float(a.sum() - b.sum()))
                for s, a, b in zip(spans, asked, blind)]

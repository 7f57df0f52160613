"""Which line and which span of it answer a lookup: the ranker over the candidates of the lines the archive found.

Owns `pick`, the span reader's lookup (`serve.reader = "spans"`, issue 59): of the lines the archive found for a
question (those holding every value it names: pipeline/serve/cited.py reads them, within the question's budget),
those writing the most of the question (`said`: its word roots and its values) are ranked, at most MAX_RANKED and
while the budget lasts, newest first (the oldest first asked for a first); each line's candidates
(pipeline/answer/spans.py) but those the question writes itself (unless it offers its answers: "Up or Down?") are
scored by the ranker (pipeline/answer/rank.py), and the line taken is the newest whose best span scores within
LINE_SLACK of the best line's (so a repeated template answers from its newest line, and a line whose spans fit the
question better than a newer one's wins). Never reads the archive, never calls a model, never names a log format: a
pure function of the question, the lines and the ranker's weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pipeline.answer.rank import Question, Ranker
from pipeline.answer.spans import Span, candidates
from pipeline.stream.evidence import ArchivedLine

MAX_RANKED = 16        # lines ranked at most (a line's ~50-250 candidates take ~5 ms to rank; a 4 KB one's ~0.1 s)
LINE_SLACK = 1.0       # a newer line is taken over a better-scored one within this much of its best span's score
CLOSE = 1.0            # a runner-up within this much of the answer's score is named beside it


@dataclass(frozen=True)
class Ranked:
    line: ArchivedLine
    spans: tuple[tuple[Span, float], ...]      # the line's candidates, best first, with the ranker's scores

    @property
    def best(self) -> float:
        return self.spans[0][1]


@dataclass(frozen=True)
class Pick:
    chosen: Ranked                             # the line answering, its candidates ranked (its first: the answer)
    runner_up: tuple[Span, float] | None       # the next candidate of another text, when within CLOSE
    lines_ranked: int                          # how many lines were ranked (<= MAX_RANKED)
    fitting: int                               # how many lines wrote as much of the question
    others: tuple[tuple[ArchivedLine, Span], ...]      # ranked lines as good whose best span is another text, newest first

    @property
    def line(self) -> ArchivedLine:
        return self.chosen.line

    @property
    def answer(self) -> Span:
        return self.chosen.spans[0][0]

    def first(self, k: int) -> tuple[tuple[Span, float], ...]:
        """The line's first k candidates of distinct texts, best first, with their scores."""
        seen: dict[str, tuple[Span, float]] = {}
        for s, v in self.chosen.spans:
            if len(seen) == k:
                break
            seen.setdefault(s.text, (s, v))
        return tuple(seen.values())


@lru_cache(maxsize=1)
def ranker() -> Ranker:
    """The shipped ranker (pipeline/answer/ranker.json), read once a process."""
    return Ranker()


def rank_line(q: Question, line: ArchivedLine, model: Ranker) -> Ranked | None:
    """The line's candidates the question does not write itself, ranked; None when it has none."""
    spans = [s for s in candidates(line.text, named=line.cells)
             if q.offers or not _written_by(q, s.text)]
    if not spans:
        return None
    return Ranked(line, tuple(model.rank(q, line.text, spans)))


def said(q: Question, text: str) -> int:
    """How much of the question a line writes: each of its word roots of 3+ letters the line holds (case folded,
    anywhere: "start" in "started"), and each value it writes (a token with a digit: "1752", "06:05:19.576") twice."""
    folded = text.casefold()
    return sum(1 for r in q.roots if len(r) >= 3 and not r[0].isdigit() and r in folded) + \
        sum(2 for t in q.values if t in folded)


def pick(q: Question, lines, model: Ranker | None = None, keep_going=lambda: True) -> Pick | None:
    """The answer among `lines` (in the order to prefer: newest first, or oldest for a first): of those writing the
    most of the question (`said`), the first MAX_RANKED are ranked, while keep_going() says so (asked before each
    line after the first: a long line's candidates take ~0.1 s to rank); None when no line offers a span."""
    model = model or ranker()
    saying = [said(q, ln.text) for ln in lines]           # once a line: up to serve.question_max_lines of them
    most = max(saying, default=0)
    fitting = [ln for ln, n in zip(lines, saying) if n == most]
    ranked = []
    for i, ln in enumerate(fitting[:MAX_RANKED]):
        if i and not keep_going():
            break
        if (r := rank_line(q, ln, model)) is not None:
            ranked.append(r)
    if not ranked:
        return None
    top = max(r.best for r in ranked)
    chosen = next(r for r in ranked if r.best >= top - LINE_SLACK)
    answer, score = chosen.spans[0]
    runner = next(((s, v) for s, v in chosen.spans[1:] if s.text != answer.text), None)
    others, seen = [], {answer.text}
    for r in ranked:                           # lines as good saying otherwise, in the order preferred
        if r.best >= top - LINE_SLACK and (s := r.spans[0][0]).text not in seen:
            seen.add(s.text)
            others.append((r.line, s))
    return Pick(chosen, runner if runner and runner[1] >= score - CLOSE else None, len(ranked), len(fitting),
                tuple(others))


def _written_by(q: Question, text: str) -> bool:
    """The question writes this span itself: it names the line, it is not the answer ("from 10.0.0.7" asked)."""
    folded = text.casefold()
    return folded in q.tokens or len(folded) > 3 and folded in q.text.casefold()

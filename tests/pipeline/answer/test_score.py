"""The model scores whole spans (pipeline/answer/score.py, issue 59), on the real default model (integration tier):
a candidate's score is its tokens' teacher-forced log-probabilities after the prompt, as one plain feed of the whole
text gives them, and no candidate sees another, no question the one before."""
from __future__ import annotations

import numpy as np

from pipeline import config
from pipeline.answer.score import END, HEAD, SpanScorer, _block
from pipeline.decode.assemble import make_engine

LINE = "2024-03-01 08:15:02 plc4 modbus: unit=3 function=16 register=40001 result=exception code=0x02 from 10.0.0.7"
QUESTION = "Which exception code did unit 3 return?"
SPANS = ["0x02", "40001", "10.0.0.7", "exception code=0x02"]


def _engine():
    return make_engine(config.override(config.parse({}), {"draft.kind": "none", "cache.sink": 0,
                                                          "cache.window": 1024}), check_rows=False)


def test_a_spans_score_is_its_tokens_log_probabilities_after_the_prompt(default_gguf):
    engine = _engine()
    got = SpanScorer(engine).score(LINE, QUESTION, SPANS)
    tok = engine.tok
    prompt = np.concatenate([tok.encode(HEAD), tok.encode(_block(LINE, QUESTION), add_bos=False)])
    for s in got:
        cont = tok.encode(f" {s.span}{END}", add_bos=False)
        engine.reset()
        nll = engine.feed(np.concatenate([prompt, cont]), score=True)[len(prompt):].astype(np.float64)
        assert abs(s.logp - (-nll.sum())) < 1e-4 and abs(s.mean - (-nll.mean())) < 1e-5


def test_no_candidate_sees_another_and_no_question_the_one_before(default_gguf):
    scorer = SpanScorer(_engine())
    forward = {s.span: s for s in scorer.score(LINE, QUESTION, SPANS)}
    scorer.score("2024-03-01 08:15:03 plc4 modbus: unit=9 function=3 result=ok", "Which function did unit 9 call?",
                 ["3", "9"])
    backward = {s.span: s for s in scorer.score(LINE, QUESTION, SPANS[::-1])}
    assert forward == backward


class _Channel:
    """A channel that keeps what is sent (header and arrays) and says nothing was written to it."""

    def __init__(self):
        self.sent = []

    def send(self, header, arrays, timeout=None) -> int:
        self.sent.append((header, {k: np.array(v) for k, v in arrays.items()}))
        return len(self.sent)

    def written(self) -> int:
        return 0


def test_the_cache_owner_scores_a_scoring_question_after_its_ring_and_rolls_everything_back(default_gguf):
    """The owner's side of a scoring question (pipeline/serve/answers.py): each candidate's score is the sum of its
    tokens' log p after the ring and the prompt, as one plain feed of the whole text gives it; the ring is as it was."""
    from collections import Counter

    from pipeline.messages import Question
    from pipeline.serve.answers import Answers

    engine = _engine()
    engine.blocks = 0                       # the owner's engine counts the verify blocks it sent; this one sends none
    tok = engine.tok
    ring = tok.encode("10:00:01 plc4 modbus: unit=3 function=3 result=ok\n10:00:02 plc4 modbus: unit=4 result=ok\n")
    engine.feed(ring)
    n = engine.index.n
    out = _Channel()
    answers = Answers(engine, _Channel(), out, None, tok.stop_ids, Counter(), tok)
    prompt = tok.encode(HEAD + _block(LINE, QUESTION), add_bos=False)
    spans = [tok.encode(f" {s}{END}", add_bos=False) for s in SPANS]
    answers.take(Question(id="q1", client="c", max_tokens=1, deadline_s=60.0, ids=prompt,
                          spans=np.concatenate(spans), span_ends=np.cumsum([len(s) for s in spans]).astype(np.int32)),
                 seq=0)
    answers.answer_next(lambda: None)
    header, arrays = out.sent[-1]
    assert header["kind"] == "answer" and header["error"] is None and engine.index.n == n
    for got, cont in zip(arrays["scores"], spans):
        engine.reset()
        nll = engine.feed(np.concatenate([ring, prompt, cont]), score=True)[-len(cont):].astype(np.float64)
        assert abs(got - (-nll.sum())) < 1e-4

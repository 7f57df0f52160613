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

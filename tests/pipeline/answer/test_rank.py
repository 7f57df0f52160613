"""The span ranker (pipeline/answer/rank.py, issue 59): its shipped weights are its own features', and its order
follows what the question says about the span, never a format. Fast tier, no model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.answer.rank import NAMES, WEIGHTS, Ranker, question
from pipeline.answer.spans import candidates
from pipeline.stream.columns import delimited_header

RANKER = Ranker()


def _top(q: str, line: str, header=None) -> str:
    return RANKER.rank(question(q), line, candidates(line, header))[0][0].text


def test_the_shipped_weights_are_fitted_for_this_rankers_features(tmp_path):
    data = json.loads(WEIGHTS.read_text())
    assert data["features"] == list(NAMES) and len(data["weights"]) == len(NAMES) and data["left_out"]
    stale = tmp_path / "ranker.json"
    stale.write_text(json.dumps({**data, "features": data["features"][1:] + ["gone"]}))
    with pytest.raises(ValueError, match="refit"):
        Ranker(path=stale)


@pytest.mark.parametrize("q, line, gold", [
    ("Which destination port did the flow use?",
     '{"ts":"2024-01-02T10:00:01Z","src_ip":"10.0.0.5","src_port":5353,"dest_ip":"10.0.0.9","dest_port":53}', "53"),
    ("Which source address sent the alert?",
     '{"ts":"2024-01-02T10:00:01Z","src_ip":"10.0.0.5","src_port":5353,"dest_ip":"10.0.0.9","dest_port":53}',
     "10.0.0.5"),
    ("What user did session 8 run as?", "2024-01-02 10:00:01 session=8 user=operator3 action=login result=ok",
     "operator3"),
])
def test_the_span_a_question_word_names_by_its_key_ranks_first(q, line, gold):
    assert _top(q, line) == gold


def test_a_column_its_header_names_ranks_first_in_a_delimited_row():
    header = delimited_header("Time;Tag;Value;Unit;State")
    assert _top("Which state did TIC-101 report at 10:00:01?", "2024-01-02 10:00:01;TIC-101;23.5;degC;ACTIVE",
                header) == "ACTIVE"


def test_a_value_the_question_names_is_not_its_answer():
    line = "Dec 10 07:08:28 gw sshd[24208]: Accepted password for admin from 10.0.0.5 port 22 ssh2"
    ranked = RANKER.rank(question("Which user logged in from 10.0.0.5?"), line, candidates(line))
    assert ranked[0][0].text != "10.0.0.5"


def test_the_order_is_by_score_then_position():
    line = "a=1 b=2 c=3"
    spans = candidates(line)
    flat = Ranker(np.zeros(len(NAMES), np.float32))
    assert [s for s, _ in flat.rank(question("which?"), line, spans)] == sorted(spans, key=lambda s: (s.start, s.end))

"""The reader's vocabularies are written once (pipeline/stream/words.py) and every reader of lines and questions reads
the same ones: a level word is a status value, states its severity and is a level to the cited reader and the span
ranker alike; retrieval and routing drop the same function words."""
from __future__ import annotations

import pytest

from pipeline.answer import rank
from pipeline.serve import cited, route
from pipeline.stream import archive, values, words
from pipeline.stream.evidence import ArchivedLine
from pipeline.stream.severity import severity_of
from pipeline.stream.values import stem


@pytest.mark.parametrize("level", sorted(words.LEVEL_WORDS))
def test_a_level_word_is_a_status_value_with_its_severity_and_a_level_to_both_readers(level):
    text = f"2024-01-01 10:00:00 [{level}] pump P-101 stopped"
    found = [v for v in values.values_of(text) if v.kind == "status" and v.text == level]
    assert found, values.values_of(text)
    assert severity_of(text) == words.LEVEL_WORDS[level]
    assert cited._is_level(ArchivedLine(0, 0, "", text, (), 0), found[0]) and words.is_level(level)
    lower = text.replace(level, level.lower())
    low = next(v for v in values.values_of(lower) if v.kind == "status" and v.text == level.lower())
    assert cited._is_level(ArchivedLine(0, 0, "", lower, (), 0), low)                  # "[notice]": a level between brackets


def test_retrieval_routing_and_the_ranker_drop_the_same_function_words():
    for word in sorted(words.FUNCTION_WORDS):
        assert archive.query_terms(f"{word} pump") == ["pump"], word
        assert stem(word) not in route.route(f"which pump did {word} stop?").roots, word
        assert rank.question(f"{word} pump").roots == rank.question("pump").roots, word

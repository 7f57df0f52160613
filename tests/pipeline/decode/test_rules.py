"""Rules on what an answer may write (pipeline/decode/rules.py), against the reader that finds identifiers in text
(pipeline/stream/identifiers.py, regular expressions written apart from the rule's state machine).

Properties: whatever the logits, an answer drawn under an identifier rule mentions no identifier outside the allowed
ones, in any variant the reader knows; a rule never leaves a state with no allowed token; an options field is always
one option, or a list of distinct ones; the rule does not get in the way of writing what is allowed.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.sampling import SamplingParams, sample, target_probs
from pipeline.decode.rules import IdentifierRule, OptionsRule, TokenTable, constrain_rows, trim
from pipeline.stream.identifiers import invented, mentioned

# A vocabulary where identifiers come together in many ways: letters alone and in runs, digits alone and in runs
# (SmolLM2 writes digits one at a time; other tokenizers do not), letters and digits in one token, separators,
# underscores, words, a stop token.
PIECES = [b"<|im_end|>", b"\n", *(bytes([c]) for c in range(32, 127)), b"ir", b"FIR", b" F", b" FIR", b" AIR", b"IR",
          b"AIR", b"12", b"123", b"A1", b"R1", b"_3", b"__", b" the", b"The", b" alarm", b"CO", b" HH", b" H", b"\xc3",
          b"\xa9", b"ALARM"]
STOP = 0
DIGITS = [i for i, p in enumerate(PIECES) if any(48 <= c <= 57 for c in p)]
TABLE = TokenTable(PIECES)
ALLOWED = ["FIR123", "AIR003_3", "PIR10"]


def draw(rule, next_row, temperature: float, rng: np.random.Generator, stops=(STOP,)) -> tuple[list[int], str]:
    """An answer drawn token by token under `rule` (greedy at temperature 0) from the logits next_row(ids) gives
    after the tokens so far (None: stop), up to a stop token and at most 60 tokens; (tokens, state)."""
    state, out = "", []
    params = SamplingParams(temperature=temperature)
    while len(out) < 60 and (row := next_row(out)) is not None:
        row = np.array(row, np.float64).reshape(1, -1)
        constrain_rows(row, rule, [state])
        assert np.isfinite(row).any(), f"state {state!r} allows no token"
        token = int(np.argmax(row)) if params.greedy else sample(target_probs(row, params)[0], rng)
        state = rule.advance(state, token)
        assert state is not None, f"an allowed token {PIECES[token]!r} broke the rule"
        out.append(token)
        if token in stops:          # the answer ends (the reader's text leaves the stop token out)
            break
    return out, state


def text(ids) -> str:
    return b"".join(PIECES[i] for i in ids if i != STOP).decode("utf-8", "replace")


# What a model that invents identifiers tries to write: the allowed ones, near misses in every variant the reader
# knows, and text around them.
FRAGMENTS = ["FIR123", "FIR12", "FIR1234", "FIR124", "fir123", "fir12", " FIR 12", " FIR-12", " FIR 123", "AIR003",
             "AIR003_3", "AIR003_34", "AIR00", "PIR10", "PIR100", "P10", "CO2", "A1", " ", " ", ", ", ".", "-", "_",
             " the alarm", "HH", " HH 12", "12", "\n", "\xc3\xa9"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(wanted=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12).map("".join),
       seed=st.integers(0, 2**32 - 1), temperature=st.sampled_from([0.0, 1.0]))
def test_no_logits_make_an_identifier_rule_write_an_identifier_not_in_view(wanted, seed, temperature):
    """Each step's logits favour the next byte of a text full of identifiers not in view; whatever is drawn, the
    answer (cut where the writer cuts it) mentions none."""
    rng, rule, target = np.random.default_rng(seed), IdentifierRule(ALLOWED, TABLE), wanted.encode("latin-1")

    def next_row(ids):
        at = sum(len(PIECES[i]) for i in ids)
        if at >= len(target):
            return None
        row = rng.normal(0, 1, len(PIECES))
        row[PIECES.index(target[at:at + 1])] += 8.0
        return row

    ids, _ = draw(rule, next_row, temperature, rng)
    ids = trim(rule, "", ids)
    assert invented(text(ids), ALLOWED) == [], (wanted, text(ids))


@pytest.mark.parametrize("written", ["FIR123", " fir123", " FIR 123", " FIR-123", " AIR003_3", "PIR10", "CO2",
                                     " alarms 12", " 12 HH"])
def test_what_the_reader_allows_the_rule_allows(written):
    """Not vacuous: the allowed identifiers in every variant, and text without identifiers, can be written."""
    rule, state = IdentifierRule(ALLOWED, TABLE), ""
    for ch in written.encode():
        state = rule.advance(state, PIECES.index(bytes([ch])))
        assert state is not None, written
    assert rule.advance(state, PIECES.index(b".")) is not None


@pytest.mark.parametrize("written", ["FIR12.", "FIR124", " FIR 12.", " fir1234", "FIR123x", "AIR003.", "AIR003_4"])
def test_an_identifier_not_in_view_cannot_be_finished(written):
    rule, state = IdentifierRule(ALLOWED, TABLE), ""
    for ch in written.encode():
        state = rule.advance(state, PIECES.index(bytes([ch])))
        if state is None:
            return
    pytest.fail(f"{written!r} was written whole")


def test_a_form_field_ends_at_a_newline_not_a_stop_token():
    rule = IdentifierRule(ALLOWED, TABLE, banned=[STOP])
    for state in ("", "FIR123", "FIR12", "The"):
        assert rule.forbidden(state)[STOP]
        assert not rule.forbidden(state)[PIECES.index(b"\n")] or state == "FIR12"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_list_field_names_distinct_options_then_ends(seed):
    rule = OptionsRule(ALLOWED, TABLE, sep=", ", max_items=3)
    logits = np.random.default_rng(seed).normal(0, 3, (40, len(PIECES)))
    ids, state = draw(rule, lambda ids: logits[len(ids)] if len(ids) < len(logits) else None, 1.0,
                      np.random.default_rng(seed), stops=(PIECES.index(b"\n"),))
    assert ids[-1] == PIECES.index(b"\n"), text(ids)
    items = text(ids).strip().split(", ")
    assert len(items) == len(set(items)) <= 3 and set(items) <= set(ALLOWED), items
    assert mentioned(text(ids)) == sorted(i.upper() for i in items)


def test_the_real_vocabulary_writes_digits_alone(default_gguf):
    """Why an identifier rule's mask costs little with SmolLM2: a state moves through its 10 digit tokens, tokens
    starting with "_" and the rest by their first byte (TokenTable). The property test covers other vocabularies."""
    from models.tokenizer import Tokenizer
    table = TokenTable.of(Tokenizer.from_gguf(default_gguf))
    assert [table.pieces[i] for i in table.digit_ids] == [str(d).encode() for d in range(10)]
    rule = IdentifierRule(ALLOWED, table)
    assert rule.forbidden("") is None and rule.forbidden("The") is None    # most rows need no mask at all

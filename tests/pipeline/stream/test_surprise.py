"""Line surprisal: every token's -log p comes out of the prefill pass itself (models/graph.py `nll`), agrees with
llama.cpp's and with a float64 log-softmax of the full logits, loses no token at a feed's or a pass's edge, and the
online baseline (pipeline/stream/surprise.py) scores a line against its own kind."""
from __future__ import annotations

import numpy as np
import pytest

from kernels.sampling import SamplingParams
from pipeline.stream.surprise import MIN_SEEN, Surprise, template_of, unscored_tokens
from pipeline.stream.triggers import Triggers
from tests.pipeline.decode.test_engine_real import engine_of, log_softmax


@pytest.fixture(scope="module")
def fixture_run(default_gguf, fixture_npz):
    """The fixture's tokens through one full cache: (ids, the pass's surprisal, a float64 reference from every
    row's logits)."""
    ids = fixture_npz["token_ids"].astype(np.int64)
    engine = engine_of({"cache.sink": 0, "cache.window": len(ids)})
    rows = []
    engine.feed(ids, on_logits=lambda start, logits: rows.append(logits.copy()))
    ref = -log_softmax(np.concatenate(rows))[np.arange(len(ids) - 1), ids[1:]]
    engine.rollback(0)
    return ids, engine.feed(ids, score=True), ref


def test_surprisal_is_every_token_but_the_first_and_matches_a_float64_log_softmax(fixture_run):
    ids, nll, ref = fixture_run
    assert nll.shape == ids.shape and np.isnan(nll[0]) and np.isfinite(nll[1:]).all()
    assert np.abs(nll[1:] - ref).max() < 1e-4


def test_surprisal_agrees_with_llamacpp(fixture_run, fixture_npz):
    _, nll, _ = fixture_run
    cpp = -fixture_npz["next_token_logprob"].astype(np.float64)
    assert abs(nll[1:].mean() - cpp.mean()) / cpp.mean() < 0.01
    assert np.corrcoef(nll[1:], cpp)[0, 1] > 0.99


def test_no_token_is_lost_however_the_text_is_cut_into_feeds(default_gguf, fixture_npz):
    """Cuts off the prefill grid and on it, one-token feeds: a feed's first token is scored from the row before it
    (the verifier keeps it), so every token after the first has its surprisal, the same as in one feed."""
    ids = fixture_npz["token_ids"].astype(np.int64)[:200]
    engine = engine_of({"cache.sink": 4, "cache.window": 96})
    whole = engine.feed(ids, score=True)
    engine.rollback(0)
    cuts = [0, 1, 2, 19, 32, 33, 64, 95, 130, 131, 200]
    parts = np.concatenate([engine.feed(ids[a:b], score=True) for a, b in zip(cuts, cuts[1:])])
    assert np.isfinite(parts[1:]).all()
    assert np.abs(parts[1:] - whole[1:]).max() < 1e-4


def test_tokens_left_unscored_are_nan_and_the_rest_unchanged(default_gguf, fixture_npz):
    """With non-words unscored (the run time's default) their rows skip the head; every other token's surprisal is
    what scoring every row gives (a row's output does not depend on which rows share the head)."""
    ids = fixture_npz["token_ids"].astype(np.int64)[:200]
    engine = engine_of({"cache.sink": 4, "cache.window": 96})
    every = engine.feed(ids, score=True)
    engine.rollback(0)
    engine.verifier.unscored = skip = unscored_tokens(engine.tok)
    cuts = [0, 31, 32, 90, 200]
    words = np.concatenate([engine.feed(ids[a:b], score=True) for a, b in zip(cuts, cuts[1:])])
    assert skip[ids].any() and np.isnan(words[skip[ids]]).all()
    assert np.abs(words[1:][~skip[ids[1:]]] - every[1:][~skip[ids[1:]]]).max() < 1e-4


def test_only_words_are_scored_unless_every_token_is_asked_for(default_gguf):
    """A word is a token with a letter and no digit: times, counters, tag numbers, punctuation and spaces are what a
    line's template folds or keeps, so they are left out (their rows skip the head)."""
    from models.handle import Model
    tok = Model.of(default_gguf).tokenizer
    skip = unscored_tokens(tok)
    line = "01:32:20 PIR108 HH PRES REACT HIGH HIGH ALM, RAS KERNEL INFO cache parity error corrected\n"
    pieces = {tok.token_bytes(int(t)): bool(skip[t]) for t in tok.encode(line)}
    assert pieces and all(left == (not any(chr(b).isalpha() for b in p) or any(chr(b).isdigit() for b in p))
                          for p, left in pieces.items())
    assert {b"1", b":", b"\n"} <= {p for p, left in pieces.items() if left}
    assert any(not left and p.strip().isalpha() for p, left in pieces.items())
    assert unscored_tokens(tok, score_every_token=True) is None


def test_a_rolled_back_answer_between_lines_leaves_the_next_line_fully_scored(default_gguf, fixture_npz):
    ids = fixture_npz["token_ids"].astype(np.int64)[:120]
    engine = engine_of({"cache.sink": 4, "cache.window": 96})
    want = engine.feed(ids, score=True)
    engine.rollback(0)
    first = engine.feed(ids[:70], score=True)
    mark = engine.mark()
    engine.generate(ids[:5], 6, SamplingParams())          # a question and its answer after the stream
    engine.rollback(mark)
    second = engine.feed(ids[70:], score=True)
    assert np.abs(np.concatenate([first, second])[1:] - want[1:]).max() < 1e-4


def test_a_line_rewritten_after_a_rollback_is_not_scored_from_the_row_it_replaced(default_gguf, fixture_npz):
    ids = fixture_npz["token_ids"].astype(np.int64)[:60]
    engine = engine_of({"cache.sink": 4, "cache.window": 96})
    engine.feed(ids[:40], score=True)
    engine.rollback(30)
    engine.feed(ids[30:40])                                  # unscored: row 39 is not kept
    assert np.isnan(engine.feed(ids[40:], score=True)[0])


# -- the baseline ----------------------------------------------------------------------------------------------------

def test_a_template_folds_the_numbers_of_a_line():
    folded = "#:#:# FIR# H FLW HIGH"
    assert template_of("01:32:20 FIR123 H FLW HIGH") == template_of("11:02:59 FIR9 H FLW HIGH") == folded


def test_a_line_is_unusual_for_its_kind_not_for_its_raw_surprisal():
    s = Surprise(unusual_at=3.0)
    rng = np.random.default_rng(0)
    for _ in range(40):                          # a noisy template that always scores high, a quiet one that scores low
        s.line("noisy 1 line", rng.normal(6.0, 0.5, 10).astype(np.float32))
        s.line("quiet 1 line", rng.normal(1.0, 0.05, 10).astype(np.float32))
    noisy, quiet = s.line("noisy 2 line", np.full(10, 6.0, np.float32)), s.line("quiet 2 line", np.full(10, 3.0,
                                                                                                    np.float32))
    assert abs(noisy.surprise) < 1.0 and not noisy.unusual
    assert quiet.surprise > 3.0 and quiet.unusual
    assert quiet.nll_n == 10 and quiet.nll_sum == pytest.approx(30.0)


def test_a_new_template_is_judged_against_every_line_until_it_has_a_history():
    s = Surprise()
    assert s.line("first", np.ones(3, np.float32)).surprise is None              # nothing to judge against
    for _ in range(20):
        s.line("common 1", np.ones(5, np.float32))
    fresh = [s.line("rare 7", np.full(5, 4.0, np.float32)).surprise for _ in range(MIN_SEEN + 1)]
    assert fresh[0] > 3.0 and fresh[MIN_SEEN - 1] > 3.0       # still against every line (mostly ones)
    assert abs(fresh[MIN_SEEN]) < 1.0                           # its own history: 4.0 is what it does


def test_unscored_tokens_are_left_out_and_a_line_with_none_has_no_score():
    s = Surprise()
    got = s.line("x", np.array([np.nan, 2.0, 4.0], np.float32))
    assert (got.nll_sum, got.nll_n) == (6.0, 2)
    assert s.line("y", np.array([np.nan], np.float32)).surprise is None


def test_memory_is_bounded_by_the_template_table():
    s = Surprise(templates=8)
    for i in range(100):
        s.line(f"line {'x' * i}", np.ones(2, np.float32))
    assert len(s.templates) == 8


def test_the_surprise_trigger_fires_at_its_threshold_only():
    t = Triggers(100, surprise_above=4.0)
    assert [t.after_line("a", z) for z in (None, 3.9, 4.0, 10.0)] == [None, None, "surprise", "surprise"]
    assert Triggers(100).after_line("a", 99.0) is None                                   # off by default

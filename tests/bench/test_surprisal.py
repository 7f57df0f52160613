"""The surprisal evaluation's arithmetic (bench/surprisal.py): AUCs against brute force, labels cut off the text."""
from __future__ import annotations

import itertools

import numpy as np

from bench.surprisal import BGL, Rarity, average_precision, labelled, roc_auc


def test_roc_auc_is_the_share_of_positive_negative_pairs_ranked_right_ties_half():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, 80).astype(float)                   # many ties
    labels = rng.random(80) < 0.3
    pairs = [(p, n) for p, n in itertools.product(scores[labels], scores[~labels])]
    brute = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])
    assert abs(roc_auc(scores, labels) - brute) < 1e-12


def test_average_precision_of_known_rankings():
    labels = np.array([True, False, True, False])
    assert average_precision(np.array([4.0, 3, 2, 1]), labels) == (1 + 2 / 3) / 2
    assert average_precision(np.array([1.0, 1, 1, 1]), labels) == 0.5             # one tie: the base rate
    assert average_precision(np.array([1.0, 0, 1, 0]), labels) == 1.0


def test_bgl_labels_come_off_the_text_and_match_the_first_field():
    data = labelled(BGL)
    assert len(data) == 2000 and sum(a for a, _ in data) == 143
    raw = BGL.read_text().splitlines()
    assert all(not raw[i].startswith(text) and raw[i].endswith(text) for i, (_, text) in enumerate(data[:50]))


def test_rarity_baselines_are_online_and_add_one():
    r = Rarity()
    assert r.line("a 1", [5, 6]) == (0.0, np.log(1))        # nothing seen: a template share of (0+1)/(0+1)
    template, token = r.line("a 2", [5, 7])
    assert template == -np.log(2 / 2) and token > 0
    template, _ = r.line("b", [9])
    assert template == -np.log(1 / 3)

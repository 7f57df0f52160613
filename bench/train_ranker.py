"""Fits the span ranker (pipeline/answer/rank.py) on the project's opened question sets and validates it by leaving
one format family out.

Owns the training set (each question whose gold is one span: a lookup, a first, last or most frequent value; on its
newest gold line, under the header in force there; a candidate is right when its text is the gold), the fit (a
softmax over a line's candidates, linear scores, L2 toward the ranker's prior, Adam; numpy only) and its validation: for each family (the
loghub and TEP logs of dev and heldout together, then each fresh split: every split here is its own logs) the
ranker is fitted on the others and measured on it: top-1 and top-3 (is the gold among the first 3: the model's
scoring stage sees those). Then it is fitted on all of them and written to pipeline/answer/ranker.json with the
figures. Held-out splits (fresh6, fresh7) are never read.

    python -m bench.train_ranker            # validation table, then writes pipeline/answer/ranker.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

from bench.answer_questions import load
from bench.answer_stages import FAMILY, HELD_OUT, line_of, one_span
from bench.answers import wilson
from pipeline.answer.rank import NAMES, PRIOR_WEIGHTS, WEIGHTS, features, question

L2 = 1e-2           # toward rank.PRIOR
STEPS = 400


def dataset() -> list[dict]:
    """One row a question: its family, its candidates' features and which are right."""
    rows = []
    for q in load():
        if q.split in HELD_OUT or q.split not in FAMILY or not one_span(q):
            continue
        line, spans = line_of(q, q.gold_lines[-1])
        right = np.array([s.text == q.gold for s in spans])
        if not right.any():
            continue                                 # the candidates stage's miss: nothing to learn from
        rows.append({"id": q.id, "family": FAMILY[q.split], "X": features(question(q.text), line, spans), "y": right})
    return rows


def fit(rows: list[dict], steps: int = STEPS, l2: float = L2, lr: float = 0.05) -> np.ndarray:
    """Weights maximising the log-probability of the right candidates under a softmax over each line's candidates."""
    prior = PRIOR_WEIGHTS.astype(np.float64)
    w = prior.copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, steps + 1):
        g = l2 * (w - prior)
        for r in rows:
            s = r["X"] @ w
            p = np.exp(s - s.max())
            p /= p.sum()
            target = r["y"] / r["y"].sum()
            g += r["X"].T @ (p - target) / len(rows)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return w.astype(np.float32)


def topk(rows: list[dict], w: np.ndarray, k: int) -> int:
    hits = 0
    for r in rows:
        s = r["X"] @ w
        order = np.lexsort((np.arange(len(s)), -s))      # ties: the earlier candidate (the ranker's order)
        hits += bool(r["y"][order[:k]].any())
    return hits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.train_ranker", description=__doc__.split("\n\n")[0])
    p.add_argument("--no-write", action="store_true", help="validate only; leave ranker.json as it is")
    a = p.parse_args(argv)
    rows = dataset()
    families = sorted({r["family"] for r in rows})
    print(f"{len(rows)} questions, {len(NAMES)} features; each family left out in turn:", file=sys.stderr)
    print(f"{'family left out':<16} {'n':>4} {'top-1':>14} {'Wilson 95%':>14} {'top-3':>8}")
    figures = {}
    for fam in families:
        test = [r for r in rows if r["family"] == fam]
        w = fit([r for r in rows if r["family"] != fam])
        k1, k3 = topk(test, w, 1), topk(test, w, 3)
        lo, hi = wilson(k1, len(test))
        figures[fam] = {"n": len(test), "top1": k1, "top3": k3}
        print(f"{fam:<16} {len(test):>4} {k1:>5} ({100 * k1 / len(test):5.1f}%) [{lo:.2f}, {hi:.2f}] "
              f"{100 * k3 / len(test):7.1f}%")
    w = fit(rows)
    print(f"fitted on all {len(rows)}: top-1 {topk(rows, w, 1)}, top-3 {topk(rows, w, 3)} (in sample)")
    if not a.no_write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        WEIGHTS.write_text(json.dumps({
            "about": "the span ranker's weights (pipeline/answer/rank.py), fitted by python -m bench.train_ranker on "
                     "the opened question sets; 'left_out': each format family's figures when fitted without it",
            "commit": commit, "l2": L2, "steps": STEPS, "left_out": figures,
            "features": list(NAMES), "weights": [round(float(x), 5) for x in w]}, indent=1) + "\n")
        print(f"wrote {WEIGHTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

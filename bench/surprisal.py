"""Line surprisal as an anomaly detector on BGL, beside two baselines that need no model, and what scoring costs.

Owns the surprisal half of `eval-quality`. BGL_2k (loghub: 2,000 lines of a BlueGene/L supercomputer's RAS log)
labels each line by its first field: "-" is normal, anything else names an alert category. The label is cut off
before the line goes in; the rest streams through the serial engine's ring (the profile's sinks and window), scored
in the prefill pass (models/graph.py `nll`). Each line gets four scores, all online (a line is judged on what came
before it only):

- surprisal: its words' mean -log p under the ring (tokens with a digit or without a letter left out, as at run
  time, unless the profile's `replay.score_every_token`);
- surprise: that surprisal's z against its template's running baseline (pipeline/stream/surprise.py: what the
  run-time trigger and console use);
- template rarity (no model): -log of the share of earlier lines with its template (digit runs folded), add-one;
- token rarity (no model): the mean over its tokens of -log of the token's share of earlier tokens, add-one.

ROC-AUC (the chance a random alert outranks a random normal line; ties count half) and PR-AUC (average precision)
of each against the labels. The cost, on BGL and on the bundled TEP log (the main job's stream): each of the first
`speed_lines` lines is fed twice, scored and not, the order alternating, rolled back in between (a feed's K/V do not
depend on whether it is scored); prefill tokens/s of each, and their ratio. Never changes the engine.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import numpy as np

from pipeline.decode.assemble import make_engine
from pipeline.stream.records import read_log
from pipeline.stream.surprise import Surprise, template_of, unscored_tokens

BGL = Path(__file__).resolve().parents[2] / "shared" / "data" / "loghub" / "BGL_2k.log"
TEP = Path(__file__).resolve().parents[1] / "data" / "tep_demo.csv"     # the main job's stream
SCORES = ("surprisal", "surprise", "template_rarity", "token_rarity")


def labelled(path: Path = BGL, lines: int = 0) -> list[tuple[bool, str]]:
    """(alert, text without its label) per line of a BGL log (the first `lines`; 0: all)."""
    out = []
    for raw in path.read_text(errors="replace").splitlines()[:lines or None]:
        label, _, text = raw.partition(" ")
        out.append((label != "-", text))
    return out


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counting half (Mann-Whitney U)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores), np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):                      # tied scores share their mean rank
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    pos, neg = int(labels.sum()), int((~labels).sum())
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """PR-AUC as average precision: over thresholds from the highest score down (tied scores taken together), the
    precision at each, weighted by the share of the positives it adds."""
    total, ap, seen = int(labels.sum()), 0.0, 0
    for value in np.unique(scores)[::-1]:
        at = scores >= value
        hits = int(labels[at].sum())
        if hits > seen:
            ap += (hits - seen) / total * hits / int(at.sum())
            seen = hits
    return ap


class Rarity:
    """The two baselines without a model, online: template counts and token counts so far."""

    def __init__(self):
        self.templates, self.lines = Counter(), 0
        self.tokens, self.total = Counter(), 0

    def line(self, text: str, ids) -> tuple[float, float]:
        key = template_of(text)
        template = -math.log((self.templates[key] + 1) / (self.lines + 1))
        vocab = len(self.tokens) + 1
        token = float(np.mean([-math.log((self.tokens[t] + 1) / (self.total + vocab)) for t in ids]))
        self.templates[key] += 1
        self.lines += 1
        self.tokens.update(ids)
        self.total += len(ids)
        return template, token


def evaluate(cfg, frame, lines: int = 0, speed_lines: int = 200, progress=None) -> dict:
    """The four scores' ROC-AUC and PR-AUC on BGL's first `lines` lines (0: all), then scoring's prefill cost over
    the first `speed_lines` lines of BGL and of the bundled TEP log."""
    engine = make_engine(cfg, frame.spec)
    tok, data = frame.tok, labelled(BGL, lines)
    engine.verifier.unscored = unscored_tokens(tok, cfg.replay.score_every_token)      # as the run time scores
    engine.feed(frame.head)
    surprise, rarity = Surprise(), Rarity()
    scores = {k: np.zeros(len(data)) for k in SCORES}
    for i, (_, text) in enumerate(data):
        ids = tok.encode(text + "\n")
        scored = surprise.line(text, engine.feed(ids, score=True))
        scores["surprisal"][i] = scored.nll_mean
        scores["surprise"][i] = scored.surprise if scored.surprise is not None else 0.0
        scores["template_rarity"][i], scores["token_rarity"][i] = rarity.line(text, ids)
        if progress and ((i + 1) % 100 == 0 or i + 1 == len(data)):
            progress(i + 1, len(data))
    labels = np.array([alert for alert, _ in data])
    cost = {}
    for name, texts in ((BGL.name, [text for _, text in labelled(BGL, speed_lines)]),
                        (TEP.name, [r.text for r in read_log(str(TEP), "csv")[:speed_lines]])):
        engine.reset()
        engine.feed(frame.head)
        cost[name] = _cost(engine, tok, texts) if speed_lines else None
    return {"log": BGL.name, "lines": len(data), "alerts": int(labels.sum()), "speed_lines": speed_lines,
            "score_every_token": cfg.replay.score_every_token, "prefill_tokens_per_s": cost,
            **{k: {"roc_auc": roc_auc(v, labels), "pr_auc": average_precision(v, labels)} for k, v in scores.items()}}


def _cost(engine, tok, texts) -> dict:
    """Prefill tokens/s with scoring on and off, each line fed both ways, the order alternating."""
    timed = {True: [0, 0.0], False: [0, 0.0]}              # scored?: [tokens, seconds]
    for i, text in enumerate(texts):
        _both_ways(engine, tok.encode(text + "\n"), i % 2 == 0, timed)
    speed = {("scored" if k else "unscored"): n / s for k, (n, s) in timed.items()}
    return {**speed, "ratio": speed["scored"] / speed["unscored"], "tokens": timed[True][0]}


def _both_ways(engine, ids, scored_first: bool, timed: dict) -> np.ndarray:
    """Feed a line scored and unscored (in the given order, rolled back in between: the same K/V either way); the
    scored feed's surprisal. (Unscored second, it forgets the row that would score the next line's first token.)"""
    mark, nll = engine.mark(), None
    for scored in (scored_first, not scored_first):
        if scored != scored_first:
            engine.rollback(mark)
        t0 = time.perf_counter()
        got = engine.feed(ids, score=scored)
        timed[scored][0] += len(ids)
        timed[scored][1] += time.perf_counter() - t0
        nll = got if scored else nll
    return nll

"""The answering layer measured offline, stage by stage, over the committed question sets (issue 59).

Owns the per-stage figures `bench --task answers` cannot give (it sees only replies): for each question with a span
for its gold (a lookup; a first, last or most frequent value; each value of a "which"), on the newest line holding the
gold (a "which": each value on one of its lines), under the header in force there: is the gold among the line's candidates (`pipeline.answer.spans`)? Reported
per split with its Wilson 95% interval, with the candidates a line has (p50, p95, max: the ranker's work) and which
sources held the gold; then the ranker's top-1 and top-3 on that line (pipeline/answer/rank.py with its shipped
weights: in sample on an opened split, so beside it the figure with the split's family left out of the fit, from
ranker.json; a held-out split was never fitted on); with `--model-stage K`, the model's choice among the ranker's
first K (pipeline/answer/score.py, each of its readings: sum, mean, PMI), when the gold was offered and over all.
Counts are computed, not chosen: they have no stage here. With `--readers cited,spans`, each reader end to end without
a server or a model (`stage_reader`: the log's archive built as ingest builds it, each question read once the archive
holds its ask_after lines, `cited.read` with the budget's line bound and no time bound, so the figure does not depend
on the machine): exact per route, and the questions a reader hands to the model or to the free reader. The figure
of record stays `bench --task answers` (a live server, the model, timings).

A held-out split is measured once, at a commit fixed before it is opened: `--split fresh6|fresh7` is refused unless
`--first-sight` says this is that run. Never runs a server or a model; reads the logs and question sets only.

    python -m bench.answer_stages --split dev,heldout,fresh,fresh2,fresh3,fresh4,fresh5 [--readers cited,spans]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from bench.answer_questions import Question, lines_of, load, log_path
from bench.answers import exact, wilson
from pipeline.answer.rank import WEIGHTS, Ranker, question
from pipeline.answer.score import SpanScorer, too_long, tokens
from pipeline.answer.spans import Span, candidates
from pipeline import config
from pipeline.config import ServeSection
from pipeline.decode.assemble import make_engine
from pipeline.serve import cited
from pipeline.stream.archive import Archive
from pipeline.stream.columns import Header, Headers, delimited_header
from pipeline.stream.records import read_log

HELD_OUT = ("fresh6", "fresh7")       # issue 59's unseen splits: opened once, at a fixed commit
FAMILY = {"dev": "loghub+tep", "heldout": "loghub+tep", "fresh": "fresh", "fresh2": "fresh2", "fresh3": "fresh3",
          "fresh4": "fresh4", "fresh5": "fresh5"}      # a split's format family: its logs are no other split's
SPAN_KINDS = ("first", "last", "most_frequent")     # aggregates whose answer is one span of a line


@lru_cache(maxsize=None)
def _lines(log: str, fmt: str) -> tuple[str, ...]:
    return tuple(lines_of(log_path(log), fmt))


@lru_cache(maxsize=None)
def _headers(log: str, fmt: str) -> tuple[Header | None, ...]:
    """The header in force at each line: columns.Headers over the log in order, or the columns its first line names."""
    lines, headers = _lines(log, fmt), Headers()
    first = delimited_header(lines[0]) if lines else None
    return tuple(headers.take(text, n == 0) or first for n, text in enumerate(lines))


def golds(q: Question) -> list[str]:
    """The spans a question's answer copies (none for a count or a not-found question)."""
    if q.gold is None or q.kind == "count":
        return []
    if q.route == "lookup" or q.kind in SPAN_KINDS:
        return [q.gold]
    return [v.strip() for v in q.gold.split(",")] if q.kind == "which" else []


def one_span(q: Question) -> bool:
    """The question's gold is one span of its newest gold line (not a "which", a count or a not-found question)."""
    return q.kind != "which" and bool(golds(q)) and bool(q.gold_lines)


def line_of(q: Question, n: int) -> tuple[str, list[Span]]:
    """Line n of the question's log and its candidates, under the header in force there."""
    line = _lines(q.log, q.format)[n - 1]
    return line, candidates(line, _headers(q.log, q.format)[n - 1])


def stage_candidates(questions: list[Question]) -> dict:
    """Gold among the candidates of its newest gold line: per question (covered?), the lines' candidate counts, and
    which sources held a covered gold."""
    covered = total = 0
    sizes, sources, misses = [], Counter(), []
    for q in questions:
        want = golds(q)
        if not want or not q.gold_lines:
            continue
        lines = (q.gold_lines[-1],) if q.kind != "which" else q.gold_lines   # a "which" gathers its values' lines
        by_text = defaultdict(set)
        for n in lines:
            spans = line_of(q, n)[1]
            sizes.append(len(spans))
            for s in spans:
                by_text[s.text].update(src.split(":")[0] for src in s.sources)
        total += 1
        if all(g in by_text for g in want):
            covered += 1
            sources.update(frozenset().union(*(by_text[g] for g in want)))
        else:
            misses.append(q.id)
    return {"covered": covered, "total": total, "sizes": sizes, "sources": sources, "misses": misses}


def stage_ranker(questions: list[Question], ranker: Ranker) -> dict:
    """The ranker's first and first three candidates on the newest gold line, for each question whose gold is one
    span (a "which" gathers several: it has no top-1)."""
    top1 = top3 = total = 0
    for q in (q for q in questions if one_span(q)):
        ranked = [s.text for s, _ in ranker.rank(question(q.text), *line_of(q, q.gold_lines[-1]))]
        total += 1
        top1 += ranked[:1] == [q.gold]
        top3 += q.gold in ranked[:3]
    return {"top1": top1, "top3": top3, "total": total}


READINGS = ("rank", "sum", "mean", "pmi", "rank+sum", "rank+pmi")   # the model's alone, or added to the ranker's score


def stage_model(questions: list[Question], ranker: Ranker, scorer: SpanScorer, k: int, limit: int) -> dict:
    """The model's choice among the ranker's first k candidates (pipeline/answer/score.py), per reading of its
    scores: right when the gold was offered, and right over all (the ranker and the model together), on at most
    `limit` questions of the list (in its order: by log, then ask_after)."""
    right = {r: 0 for r in READINGS}
    offered = total = 0
    for q in (q for q in questions if one_span(q)):
        if total == limit:
            break
        line, spans = line_of(q, q.gold_lines[-1])
        ranked = ranker.rank(question(q.text), line, spans)[:k]
        top, prior = [s.text for s, _ in ranked], {s.text: v for s, v in reversed(ranked)}
        total += 1
        if q.gold not in top:
            continue
        offered += 1
        scored = scorer.score(line, q.text, top)
        for r in READINGS:
            reading = r.split("+")[-1]
            best = max(scored, key=lambda x: (x.by(reading) if reading != "rank" else 0.0)
                       + (prior[x.span] if r.startswith("rank") else 0.0))
            right[r] += best.span == q.gold
        print(f"  [{total}] {q.id}: offered; " + ", ".join(f"{r} {right[r]}" for r in READINGS), file=sys.stderr)
    return {"total": total, "offered": offered, **right}


ROOM = ServeSection.max_prompt_tokens + ServeSection.max_answer_tokens     # the owner's scratch span for a question


def stage_reader(questions: list[Question], spans: bool, scorer: SpanScorer | None = None, k: int = 0) -> dict:
    """Each question answered by the cited reader (`spans`: its lookups by pipeline/answer/pick.py) over an archive
    holding the log's first ask_after lines; {route: Counter(n, exact, model, scored, free)}: "model" a Choice left
    to the model (not exact here), "scored" a spans reader's Choice (serve.span_model = k) that `scorer` scored as
    the cache owner would (but after its prompt's head, not after a ring), "free" no reply (the free reader's: not
    exact here)."""
    out: dict[str, Counter] = defaultdict(Counter)
    by_log = defaultdict(list)
    for q in questions:
        by_log[(q.log, q.format)].append(q)
    with tempfile.TemporaryDirectory() as d:
        for n, ((log, fmt), asked) in enumerate(by_log.items()):
            records, path, at = read_log(log_path(log), fmt), Path(d) / f"{n}.sqlite", 0
            with Archive(path) as archive:
                for q in sorted(asked, key=lambda q: q.ask_after):
                    for rec in records[at:q.ask_after]:
                        archive.add(rec.offset, rec.time, rec.text)
                    at = max(at, q.ask_after)
                    archive.flush()
                    reply = cited.read(str(path), q.text, budget_s=3600.0, spans=spans, model=k if scorer else 0)
                    row = out[q.route]
                    row["n"] += 1
                    if isinstance(reply, cited.Choice) and reply.prior:       # as the front would ask the owner
                        prompt, cands = tokens(scorer.tok, reply.line.text, q.text, reply.options)
                        if why := too_long(prompt, cands, ROOM):
                            reply = cited.unscored(reply, why)
                        else:
                            row["scored"] += 1
                            got = scorer.score(reply.line.text, q.text, list(reply.options), pmi=False)
                            reply = cited.scored(reply, [s.logp for s in got])
                    if isinstance(reply, cited.Choice):
                        row["model"] += 1
                    elif reply is None:
                        row["free"] += 1
                    else:
                        row["exact"] += exact(q, reply.answer)
    return out


def engine_for(profile: str | None, model: str | None):
    """A single-process engine on the profile's target (or --model), with a plain cache for a prompt and a span."""
    cfg = config.load(profile)
    over = {"cache.sink": 0, "cache.window": 2048, "draft.kind": "none"}
    if model:
        over["model.gguf"] = model
    return make_engine(config.override(cfg, over), check_rows=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.answer_stages", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", default="dev,heldout,fresh,fresh2,fresh3,fresh4,fresh5",
                   help="comma-separated splits (bench/answer_questions.py); default every split already opened")
    p.add_argument("--first-sight", action="store_true",
                   help=f"this is the one measurement of a held-out split ({', '.join(HELD_OUT)})")
    p.add_argument("--misses", action="store_true", help="list the questions whose gold no candidate holds")
    p.add_argument("--model-stage", type=int, default=0, metavar="K",
                   help="also score the ranker's first K candidates with the target (pipeline/answer/score.py)")
    p.add_argument("--config", help="the profile whose target scores (default configs/default.toml)")
    p.add_argument("--model", help="the target to score with instead (a registry name or a GGUF)")
    p.add_argument("--questions", type=int, default=40, help="model stage: questions a split at most (default 40)")
    p.add_argument("--readers", default="", help="also each of these cited readers end to end without a server or a "
                   "model (cited, spans: `stage_reader`)")
    a = p.parse_args(argv)
    splits = a.split.split(",")
    if set(splits) & set(HELD_OUT) and not a.first_sight:
        p.error(f"{', '.join(sorted(set(splits) & set(HELD_OUT)))} is held out: measured once, with --first-sight")
    questions = load()
    ranker, left_out, scorer = Ranker(), json.loads(WEIGHTS.read_text())["left_out"], None
    print(f"{'split':<8} {'gold among candidates':>24} {'Wilson 95%':>14} {'candidates p50/p95/max':>24} "
          f"{'ranker top-1':>14} {'top-3':>7} {'its family left out':>20}  sources")
    for split in splits:
        chosen = [q for q in questions if q.split == split]
        if not chosen:
            p.error(f"no questions in split {split!r}")
        r = stage_candidates(chosen)
        lo, hi = wilson(r["covered"], r["total"])
        s = np.array(r["sizes"])
        k = stage_ranker(chosen, ranker)
        fam = left_out.get(FAMILY.get(split, ""), {})
        print(f"{split:<8} {r['covered']:>5}/{r['total']:<5} {100 * r['covered'] / max(r['total'], 1):6.1f}%"
              f"      [{lo:.2f}, {hi:.2f}] {int(np.median(s)):>8}/{int(np.percentile(s, 95))}/{s.max():<8} "
              f"{100 * k['top1'] / max(k['total'], 1):13.1f}% {100 * k['top3'] / max(k['total'], 1):6.1f}% "
              + (f"{100 * fam['top1'] / fam['n']:12.1f}% {100 * fam['top3'] / fam['n']:5.1f}%" if fam else
                 f"{'(never fitted on)':>20}") + "  " + ", ".join(f"{k} {v}" for k, v in r["sources"].most_common()))
        if a.misses and r["misses"]:
            print("  missed:", " ".join(r["misses"]))
        if a.model_stage:
            scorer = scorer or SpanScorer(engine_for(a.config, a.model))
        for reader in (x for x in a.readers.split(",") if x):
            got = stage_reader(chosen, reader == "spans", scorer if reader == "spans" else None, a.model_stage)
            print(f"  reader {reader}: " + "; ".join(
                f"{route} {c['exact']}/{c['n']} exact ({100 * c['exact'] / c['n']:.1f}%"
                f"{', %d to the model' % c['model'] if c['model'] else ''}"
                f"{', %d scored by it' % c['scored'] if c['scored'] else ''}{', %d free' % c['free'] if c['free'] else ''})"
                for route, c in sorted(got.items())), flush=True)
        if a.model_stage and not a.readers:
            m = stage_model(chosen, ranker, scorer, a.model_stage, a.questions)
            print(f"  model over the ranker's first {a.model_stage}: gold offered {m['offered']}/{m['total']}; right "
                  "when offered " + ", ".join(f"{r} {m[r]}/{m['offered']}" for r in READINGS)
                  + "; right over all " + ", ".join(f"{r} {m[r]}/{m['total']}" for r in READINGS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

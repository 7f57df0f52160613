"""`eval-quality`: what the assessments are worth to an operator, per form, in one run.

Owns the forms' measurement. Each evaluation log is streamed through the serial engine once per form (free,
constrained, structured: pipeline/stream/forms.py), the forms one after the other, the first rotating from log to
log; the profile's ring, draft and triggers (every N lines, and the HH/LL pattern). The stream's K/V are the same
for every form (a feed's K/V do not depend on what was asked before: pipeline/decode/step.py), so the forms answer at
the same points from the same views. Per form:

- invented identifiers per assessment: what the reader (pipeline/stream/identifiers.py, written apart from the rule)
  finds in the text that no line every row of the answer can see carries;
- trigger named: the share of assessments whose text names an identifier of the line that triggered them;
- HH/LL recall: of the high-high and low-low alarms in view and not yet recovered (no "HH NR"/"LL NR" line for the
  tag since), the share the assessment names (pooled over assessments);
- tokens per second of writing: tokens the model wrote over the seconds spent writing them (the question is
  prefilled untimed, but for its last token; a structured form's labels are inside the time: they are its cost).

The logs: the TEP `deadband` fault cases in ../shared/data that the bundled draft was not trained on (60 of 80,
numeric order; data/draft-smollm2-tep.json lists its training logs), and the first LOGHUB_LINES lines of loghub's
Linux, Zookeeper and BGL logs (no HH/LL there; identifiers are what the TAG class matches, BGL's node names mostly).
Never changes the engine; `run_eval_quality` is the verb.
"""
from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path


from bench import surprisal
from bench.recall_questions import alarm_of
from pipeline.config import override
from pipeline.decode.assemble import make_engine
from pipeline.decode.rules import normal
from pipeline.report import Report
from pipeline.stream.forms import FORMS, Writer, text_of, view_start
from pipeline.stream.frame import replay_frame
from pipeline.stream.identifiers import invented, mentioned
from pipeline.stream.records import read_log
from pipeline.stream.sources import line_of
from pipeline.stream.session import StreamSession

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DRAFT_CARD = ROOT / "data" / "draft-smollm2-tep.json"
LOGHUB = ("Linux_2k.log", "Zookeeper_2k.log", "BGL_2k.log")
LOGHUB_LINES = 200


def evaluation_logs(tep_logs: int = 0) -> list[tuple[str, str, Path]]:
    """(set, format, path): the deadband cases the draft never saw (the first `tep_logs`, 0: all), then loghub's."""
    trained = set(json.loads(DRAFT_CARD.read_text())["logs"])
    number = lambda p: int(re.search(r"(\d+)\.csv$", p.name)[1])     # noqa: E731
    tep = sorted((p for p in (SHARED / "tep_alarms" / "deadband").glob("*.csv") if p.name not in trained), key=number)
    return [("tep", "csv", p) for p in tep[:tep_logs or None]] + [("loghub", "plain", SHARED / "loghub" / n)
                                                                   for n in LOGHUB]


@dataclass
class Tally:
    assessments: int = 0
    invented: int = 0
    with_invented: int = 0
    triggered: int = 0              # assessments whose triggering line carries an identifier
    trigger_named: int = 0
    hhll_in_view: int = 0
    hhll_named: int = 0
    tokens: int = 0
    write_s: float = 0.0

    def figures(self) -> dict:
        n = max(self.assessments, 1)
        return {"assessments": self.assessments, "invented_per_assessment": self.invented / n,
                "assessments_with_invented": self.with_invented, "invented": self.invented,
                "trigger_named_rate": self.trigger_named / self.triggered if self.triggered else None,
                "triggered": self.triggered, "trigger_named": self.trigger_named,
                "hhll_recall": self.hhll_named / self.hhll_in_view if self.hhll_in_view else None,
                "hhll_in_view": self.hhll_in_view, "hhll_named": self.hhll_named, "tokens": self.tokens,
                "tokens_per_s": self.tokens / self.write_s if self.write_s else 0.0}


def run_eval_quality(cfg, tep_logs: int = 0, forms: str = "", progress=None, loghub_lines: int = LOGHUB_LINES,
                     surprisal_lines: int = 2000, speed_lines: int = 200) -> "QualityReport":
    """Invented identifiers, trigger named, HH/LL recall and writing speed per assessment form, then line surprisal
    on BGL against its labels (bench/surprisal.py), one run.

    Every log is streamed once per form, the forms alternated; each form answers at the same points from the same
    views (the module docstring of bench/quality.py)."""
    forms = [] if forms == "none" else [f for f in forms.split(",") if f] or list(FORMS)
    frame = replay_frame(override(cfg, {"replay.form": "structured"}))     # the ring's slack holds every form
    r = cfg.replay
    writers = {f: Writer.of(frame.tok, r, form=f) for f in forms}
    engine = make_engine(cfg, frame.spec)
    tallies = {(s, f): Tally() for s in ("tep", "loghub") for f in forms}
    t0 = time.perf_counter()
    logs = [log for log in evaluation_logs(tep_logs) if forms and (log[0] == "tep" or loghub_lines)]
    for i, (kind, fmt, path) in enumerate(logs):
        records = read_log(str(path), fmt)[:loghub_lines if kind == "loghub" else None]
        for f in forms[i % len(forms):] + forms[:i % len(forms)]:     # the first form rotates from log to log
            _stream(engine, frame, cfg, records, kind, writers[f], tallies[kind, f])
        if progress:
            progress(i + 1, len(logs), path.name, {f: tallies[kind, f].figures() for f in forms})
    scored = None
    if surprisal_lines:
        del engine                          # one model in memory at a time
        scored = surprisal.evaluate(cfg, frame, surprisal_lines, speed_lines,
                                    progress and (lambda i, n: print(f"[surprisal] {i}/{n} BGL lines", file=sys.stderr,
                                                                     flush=True)))
    return QualityReport({"forms": forms, "logs": [p.name for _, _, p in logs], "loghub_lines": loghub_lines,
                          "wall_s": time.perf_counter() - t0, "surprisal": scored,
                          **{s: {f: tallies[s, f].figures() for f in forms} for s in ("tep", "loghub")}})


def _stream(engine, frame, cfg, records, kind: str, writer: Writer, tally: Tally) -> None:
    """One log through a fresh ring, assessed in one form wherever the triggers fire (each form streams the log on
    its own: the stream proposer keeps rolled-back answers, so a form after another would copy its answers)."""
    engine.reset()
    engine.feed(frame.head)
    unscored = replace(cfg.replay, score_stream=False, surprise_above=0.0)      # forms only: surprisal is apart
    session = StreamSession(engine, replace(frame, writer=writer), unscored, "")   # the lines in view, as at run time
    active = {}                             # HH/LL tag -> its line's first position, until its NR line
    for seq, rec in enumerate(records, start=1):
        first, line = session.next_position(), line_of(rec, frame.tok, seq)
        session.feed([line])
        tag, level = _alarm(rec) if kind == "tep" else ("", "")
        if level in ("HH", "LL"):
            active[tag] = first
        elif level in ("HH NR", "LL NR"):
            active.pop(tag, None)
        if session.due is not None:
            _assess(session, writer, writer.ask(rec.text), active, line.tags, tally)


def _alarm(rec) -> tuple[str, str]:
    """(tag, type) of a TEP line; ("", "") for a line of another shape (a CSV row cut short)."""
    return alarm_of(rec) if len(rec.text.split()) >= 4 else ("", "")


def _assess(session: StreamSession, writer: Writer, ask, active: dict, trigger_ids, tally: Tally) -> None:
    engine, frame = session.engine, session.frame
    mark = engine.mark()
    oldest = view_start(engine.index.n, len(ask), writer.scratch(), frame.spec.window)
    allowed, stated = session.in_view(ask), session.stated(ask)
    engine.feed(ask[:-1])                  # untimed: the same question for every form of its kind
    t0 = time.perf_counter()
    written = writer.write(engine, ask[-1:], allowed, frame.params, stated=stated)
    tally.write_s += time.perf_counter() - t0
    engine.rollback(mark)
    session.assessed()
    text = text_of(frame.tok, written.ids)
    named, wrong = set(mentioned(text)), invented(text, allowed)
    tally.assessments += 1
    tally.tokens += written.stats.generated
    tally.invented += len(wrong)
    tally.with_invented += bool(wrong)
    if trigger_ids:
        tally.triggered += 1
        tally.trigger_named += bool(named & {normal(t) for t in trigger_ids})
    alarms = {normal(tag) for tag, first in active.items() if first >= oldest}
    tally.hhll_in_view += len(alarms)
    tally.hhll_named += len(alarms & named)


@dataclass
class QualityReport(Report):
    def text(self) -> str:
        d = self.data
        rows = [f"{'logs':<7} {'form':<12} {'assessed':>8} {'invented':>9} {'per one':>8} {'trigger':>8} "
                f"{'HH/LL':>7} {'tok/s':>6}"]
        for s in ("tep", "loghub"):
            for f in d["forms"]:
                x = d[s][f]
                pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"         # noqa: E731
                rows.append(f"{s:<7} {f:<12} {x['assessments']:>8} {x['invented']:>9} "
                            f"{x['invented_per_assessment']:>8.2f} {pct(x['trigger_named_rate']):>8} "
                            f"{pct(x['hhll_recall']):>7} {x['tokens_per_s']:>6.1f}")
        sc = d.get("surprisal")
        if sc:
            sp = sc["prefill_tokens_per_s"]
            rows.append(f"\nsurprisal on {sc['log']}: {sc['lines']} lines, {sc['alerts']} alerts (label cut off)")
            rows.append(f"{'score':<16} {'ROC-AUC':>8} {'PR-AUC':>8}")
            rows += [f"{k:<16} {sc[k]['roc_auc']:>8.3f} {sc[k]['pr_auc']:>8.3f}" for k in surprisal.SCORES]
            for log, c in sp.items():
                if c:
                    rows.append(f"prefill on {log}: {c['scored']:.0f} tok/s scored vs {c['unscored']:.0f} unscored "
                                f"({c['ratio']:.3f}x; {sc['speed_lines']} lines fed both ways, alternating)")
        rows.append(f"{len(d['logs'])} logs, {d['wall_s']:.0f} s")
        return "\n".join(rows)


def progress_line(i: int, n: int, name: str, figures: dict) -> None:
    """The figures so far of the log's set (a long run read while it goes, or cut short)."""
    print(f"[{i}/{n}] {name}: " + "; ".join(
        f"{f} {x['assessments']} assessed, {x['invented']} invented, trigger named {x['trigger_named']}/"
        f"{x['triggered']}, HH/LL {x['hhll_named']}/{x['hhll_in_view']}, {x['tokens_per_s']:.1f} tok/s"
        for f, x in figures.items()), file=sys.stderr, flush=True)

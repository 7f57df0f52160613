"""`eval-quality`'s protocol (bench/quality.py): which logs it reads, and how its figures are counted. The real run
(minutes per log) is a documented command, not part of the suite."""
from __future__ import annotations

import json

from bench.quality import DRAFT_CARD, LOGHUB, QualityReport, Tally, evaluation_logs


def test_the_tep_logs_are_forty_or_more_the_draft_never_saw():
    trained = set(json.loads(DRAFT_CARD.read_text())["logs"])
    logs = evaluation_logs()
    tep = [p for kind, _, p in logs if kind == "tep"]
    assert len(tep) >= 40 and not {p.name for p in tep} & trained
    assert all("deadband" in p.name for p in tep) and [p.name for _, _, p in logs[-len(LOGHUB):]] == list(LOGHUB)
    assert [p.name for _, _, p in evaluation_logs(5)][:5] == [p.name for p in tep[:5]]


def test_rates_are_none_when_nothing_was_there_to_name():
    t = Tally(assessments=4, invented=2, with_invented=1, triggered=2, trigger_named=1, tokens=100, write_s=2.0)
    f = t.figures()
    assert f["invented_per_assessment"] == 0.5 and f["trigger_named_rate"] == 0.5 and f["hhll_recall"] is None
    assert f["tokens_per_s"] == 50.0
    report = QualityReport({"forms": ["free"], "logs": ["a"], "wall_s": 1.0, "tep": {"free": f}, "loghub": {"free": f}})
    assert "50%" in report.text() and "0.50" in report.text()

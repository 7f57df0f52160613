"""The bounds command (bench/bounds.py) end to end on its cheapest findings: one row each of the table's shape, the
bound held on this tree; its help names every finding. (The floods and the 1M-line question are commands, not CI.)"""
from __future__ import annotations

import json

import pytest

from bench import bounds


def test_a_cheap_findings_rows_come_out_as_json_lines_of_the_tables_shape(capsys):
    assert bounds.main(["--finding", "10", "--finding", "8", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["finding"] for r in rows] == ["8", "8", "8", "10", "10", "10"]      # in finding order, each once
    for r in rows:
        assert set(r) == {"finding", "measured", "figure", "bound", "held", "took_s"}
        assert all(isinstance(r[k], str) and r[k] for k in ("measured", "figure", "bound"))
        assert r["held"] is True
    assert "steps at 4096" in rows[-1]["figure"] and "value rows" in rows[1]["figure"]


def test_the_table_marks_a_bound_not_held_and_the_command_exits_1(capsys, monkeypatch):
    monkeypatch.setitem(bounds.FINDINGS, "10", (lambda: [bounds._row("10", "m", "f", "b", False)], "planted"))
    assert bounds.main(["--finding", "10"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "finding | measured | figure | bound | held" and out[-1] == "10 | m | f | b | NO"


def test_the_help_gives_each_findings_reproduction_in_one_line(capsys):
    with pytest.raises(SystemExit):
        bounds.main(["--help"])
    text = capsys.readouterr().out
    for n, (_, line) in bounds.FINDINGS.items():
        assert f"{n:>2}  {line}" in text

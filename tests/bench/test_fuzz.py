"""`run.py fuzz`: every target runs real code and holds its property on a small N; a planted fault is caught."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st

from bench import fuzz
from pipeline import config
from tests import procs
from tests.paths import ROOT


def test_fuzz_runs_every_target_and_prints_cases_and_failures_and_leaves_no_segment(default_gguf):
    before = set(Path("/dev/shm").glob("ringspec_fuzz_*"))
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "fuzz", "--cases", "40", "--json"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert set(out) == set(fuzz.TARGETS)
    for name, row in out.items():
        assert row["failures"] == 0 and row["cases"] >= 40, (name, row)
    assert set(Path("/dev/shm").glob("ringspec_fuzz_*")) <= before, "a fuzz target left its channel in /dev/shm"


def test_the_records_property_catches_a_cleaner_that_lets_control_characters_through(default_gguf, monkeypatch):
    from pipeline.stream import records
    check, _, closing = fuzz._records(config.load(None), st)
    check(("plain", b"", [b"a\x01b"], True))                   # holds on the real cleaner
    monkeypatch.setattr(records, "_clean", lambda text: text)
    with pytest.raises(AssertionError, match="unprintable"):
        check(("plain", b"", [b"a\x01b"], True))
    closing()


def test_the_http_property_catches_a_body_read_by_a_negative_length(default_gguf, monkeypatch):
    """The finding of issue 19: `int("-1")` passed the limit and `read(-1)` read to the end of the connection."""
    from pipeline.serve import http_api
    before = set(Path("/dev/shm").glob("ringspec_fuzz_*"))
    check, _, closing = fuzz._http(config.load(None), st)
    try:
        case = ("POST", "/v1/completions", "-1", [], b'{"prompt": "0"}', True)
        check(case)                                                  # holds on the real server: a 400
        monkeypatch.setattr(http_api._Handler, "_body",
                            lambda self: json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        with pytest.raises(AssertionError, match="-1 length, 15 bytes reached the front"):
            check(case)
    finally:
        closing()
    assert set(Path("/dev/shm").glob("ringspec_fuzz_*")) <= before, "the fuzz owner left its channel in /dev/shm"

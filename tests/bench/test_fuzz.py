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


def test_the_site_property_catches_a_hub_that_delivers_a_message_with_a_wrong_mac(default_gguf, monkeypatch):
    """A stranger's message with valid frames under another key is a counted drop on the real hub; with the MAC check
    planted away it reaches the front, and the property says so. A few drawn cases hold in well under 15 s."""
    import hmac as real_hmac
    import secrets
    from types import SimpleNamespace

    from pipeline.serve import site_link
    assert fuzz._run("site", config.load(None), 25, 0) == {"cases": 25, "failures": 0}
    check, _, closing = fuzz._site(config.load(None), st)
    try:
        forged = site_link.seal(secrets.token_bytes(32), site_link.UP, ["s9", 1, "d9", 1],      # a newer start's, if it passed
                           site_link.pack("event", fuzz.GROUP, "tep", {}, {}, None))
        check(("pull", forged))                                       # holds on the real hub: a bad_mac drop
        monkeypatch.setattr(site_link, "hmac", SimpleNamespace(new=real_hmac.new, compare_digest=lambda a, b: True))
        with pytest.raises(AssertionError, match="delivered to the front"):
            check(("pull", forged))
    finally:
        closing()


def test_the_smuggling_property_catches_a_face_that_keeps_a_connection_open_after_an_unread_body(default_gguf,
                                                                                                  monkeypatch):
    """The finding of issue 48: a keyless POST whose body was a second request got [401, 200]. The real face closes
    the connection after the 401 (one answer); planted to keep it open, the smuggled request is answered too."""
    from pipeline.serve import http_api
    assert fuzz._run("http_smuggle", config.load(None), 20, 0) == {"cases": 20, "failures": 0}
    check, _, closing = fuzz._http_smuggle(config.load(None), st)
    try:
        case = ("unread", ("POST", "/v1/chat/completions", []), fuzz.SMUGGLED[0])
        check(case)                                                   # holds on the real face: one answer, a 401

        def keeps_open(self):
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
        monkeypatch.setattr(http_api._Handler, "_end_headers", keeps_open)
        with pytest.raises(AssertionError, match=r"2 answers \[b'401', b'200'\] on one connection"):
            check(case)
    finally:
        closing()

"""`bench`'s command line: a profile-key flag reaches every process that runs the measurement, or is refused."""
from __future__ import annotations

import pytest

from bench.__main__ import _profile_only, parser


def args(*argv: str):
    return parser().parse_args(["bench", *argv])


@pytest.mark.parametrize("argv", [("--task", "operator", "--kernel", "nbits"), ("--task", "answers", "--threads", "1"),
                                  ("--task", "ingest", "--kernel", "native"), ("--task", "streams", "--window", "64")])
def test_a_profile_key_the_started_servers_or_actors_would_not_read_is_refused_by_name(argv):
    with pytest.raises(ValueError, match=r"model\.kernel|model\.threads|cache\.window"):
        _profile_only(args(*argv))


@pytest.mark.parametrize("argv", [("--task", "log", "--kernel", "native"), ("--task", "streams", "--target-only",
                                                                              "--kernel", "nbits"),
                                  ("--task", "ingest", "--model", "default"), ("--task", "operator",)])
def test_flags_the_measurement_does_apply_are_taken(argv):
    _profile_only(args(*argv))


def test_the_speed_benchs_workers_are_handed_every_profile_key_given(monkeypatch):
    from bench import __main__ as cli, speed
    seen, given = [], args("--task", "log", "--kernel", "nbits", "--window", "64")
    monkeypatch.setattr(speed, "run_bench", lambda *a, **k: seen.append(a))
    cli._bench(given)
    assert seen[0][-1] == {"model.kernel": "nbits", "cache.window": 64}

"""Assessment triggers: every N lines since the last one, right after a matching line, after a quiet spell."""
from pipeline.stream.triggers import Triggers


def test_every_n_lines_counts_from_the_last_assessment():
    t = Triggers(3, r"\bHH\b")
    fired = [t.after_line(x) for x in ["a", "b HH", "c", "d", "e", "f", "g"]]
    assert fired == [None, "pattern", None, None, "every", None, None]


def test_idle_fires_once_and_only_after_new_lines():
    t = Triggers(100, idle_s=2.0)
    assert t.on_quiet(10.0) is None                 # nothing to assess yet
    t.after_line("x")
    assert t.on_quiet(1.0) is None
    assert t.on_quiet(2.5) == "idle"
    assert t.on_quiet(9.0) is None                  # already assessed


def test_idle_is_off_by_default():
    t = Triggers(100)
    t.after_line("x")
    assert t.on_quiet(1e9) is None

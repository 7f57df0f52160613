"""The template miner's bounds (pipeline/stream/templates.py): a line compared with a bounded number of templates
however many there are, the same templates as a full scan on real logs, at most max_templates held. No model, fast."""
from __future__ import annotations

import random
import string

from pipeline.stream import templates
from pipeline.stream.templates import MASK, Miner
from tests.paths import ROOT

LOGHUB = ROOT / "bench" / "data" / "loghub"


def distinct(rng: random.Random, n: int = 5) -> str:
    """A line of one group ("evt" and n words) sharing no word with another: each starts a template of its own."""
    return "evt " + " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(8)) for _ in range(n))


def scan(lines: list[str]) -> list[tuple[int, list[str]]]:
    """What the miner gives, by the rule its docstring states, comparing every template of the group (the reference)."""
    groups, out, next_id = {}, [], 1
    for text in lines:
        raw = templates._TOKENS.split(text.strip()) if text.strip() else []
        tokens = [MASK if templates._DIGIT.search(t) else t for t in raw]
        group = groups.setdefault(Miner._key(tokens), [])
        scores = [sum(a == b or a == MASK for a, b in zip(p, tokens)) / len(tokens) if tokens else 1.0
                  for _, p in group]
        if not scores or max(scores) < 0.5:
            group.append((next_id, tokens))
            pattern, tid, next_id = tokens, next_id, next_id + 1
        else:
            i = scores.index(max(scores))
            tid, pattern = group[i][0], [a if a == b else MASK for a, b in zip(group[i][1], tokens)]
            group[i] = (tid, pattern)
        out.append((tid, [t for t, p in zip(raw, pattern) if p == MASK]))
    return out


def test_a_line_is_compared_with_a_bounded_number_of_templates_at_ten_thousand_in_its_group():
    """Finding 8 of issue 55: each line was compared with every template of its group (15 ms a line at 10k)."""
    rng = random.Random(55)
    miner = Miner(max_templates=20_000)
    kinds = [distinct(rng) for _ in range(10_000)]
    for text in kinds:
        miner.add(text)
    assert len(miner.templates) == 10_000
    before = miner.compared
    for i in range(0, 10_000, 100):                  # a known kind, one word changed: found among the 10k
        words = kinds[i].split()
        words[3] = "changed"
        assert miner.add(" ".join(words))[0] == i + 1
    for _ in range(100):                             # a new kind: compared with a few, then a template of its own
        miner.add(distinct(rng))
    assert miner.compared - before <= 200 * (templates.COMPARED + 1)
    assert len(miner.templates) == 10_100


def test_the_index_gives_the_templates_and_parameters_a_full_scan_gives_on_real_logs():
    for name in ("OpenSSH_2k.log", "HDFS_2k.log", "Thunderbird_2k.log"):
        lines = (LOGHUB / name).read_text(encoding="utf-8", errors="replace").splitlines()
        miner = Miner()
        assert [miner.add(text) for text in lines] == scan(lines), name


def test_the_miner_holds_at_most_max_templates_the_least_recently_used_forgotten():
    miner = Miner(max_templates=3)
    a, b, c = (miner.add(f"{kind} started unit {kind}x")[0] for kind in ("alpha", "beta", "gamma"))
    assert miner.add("alpha started unit 7")[0] == a            # alpha used again: beta is now the oldest
    d = miner.add("delta started unit deltax")[0]
    assert sorted(miner.templates) == [a, c, d] and miner.forgotten == 1
    assert miner.add("beta started unit betax")[0] not in (a, b, c, d)      # a kind forgotten starts a new id
    assert miner.take_changed()[b] == "beta started unit betax"             # still stored: its lines name it


def test_the_miner_holds_at_most_its_bound_of_tokens_however_long_the_lines():
    rng = random.Random(7)
    miner = Miner(max_templates=10)
    for _ in range(50):
        miner.add(distinct(rng, 200))
    assert miner.tokens <= 10 * templates.TOKENS_EACH + 201 and len(miner.templates) >= 1


def test_a_forgotten_template_takes_no_more_lines_and_is_not_stored():
    miner = Miner()
    tid, _ = miner.add("pump P1 tripped on overload")
    miner.forget([tid, 99])
    assert miner.take_changed() == {}
    assert miner.add("pump P2 tripped on overload")[0] != tid

"""Every pattern that runs on a log line or an operator's question does work linear in its length (issue 55, finding
5, 9 and 10), counted in steps by bench/regex_steps.py (a backtracking matcher following sre's rules), never timed.

Log lines are cut at 4,096 bytes before any pattern sees them (pipeline/stream/sources.py, `max_line_bytes`) and a
question is refused past serve.max_prompt_tokens (384) before the cited reader routes it (pipeline/serve/front.py),
a few thousand characters at most: inputs here grow from 2,048 to 8,192 characters, within and past both caps
(each family screened at 64 and 128 first). A pattern is linear on a family of inputs when its steps at most double
(x2.2) from 2,048 to 4,096 and from 4,096 to 8,192 characters, and stay under STEPS_PER_CHAR a character. The families are built from the characters each pattern
names: one character repeated, two alternating, a run closed by another character, the findings' reproductions.
Functions that apply a pattern once per span (the cited reader's word before a span, a line's values, a question's
naming words) are checked whole: their steps and Python lines together grow linearly with the line.
"""
from __future__ import annotations

import importlib
import itertools
import re
import sys

import pytest

from bench import regex_steps as rs
from pipeline.serve import cited
from pipeline.serve import route as route_mod
from pipeline.stream import values
from pipeline.stream.archive import Archive

# modules whose module-level patterns run on a log line or a question (every re.Pattern in them, or in a tuple)
MODULES = ("pipeline.stream.values", "pipeline.stream.records", "pipeline.stream.columns", "pipeline.stream.templates",
           "pipeline.stream.evidence", "pipeline.stream.sources", "pipeline.stream.identifiers",
           "pipeline.stream.severity", "pipeline.stream.surprise", "pipeline.stream.archive",
           "pipeline.answer.spans", "pipeline.serve.route", "pipeline.serve.cited")
# patterns compiled inline where they run (re.search(r"...", q) in pipeline/serve/route.py, on the question; the
# front's text splitter, on a reply the cited reader wrote)
INLINE = (r"\bhow many (\w+)\b", r"\bhow many\b", r"\bhow many (bytes|kb|mb|gb)\b",
          r"\bhow often\b|\bcount\b|\bnumber of\b", r"\bmost (frequent|frequently|common|commonly|often)\b",
          r"\b(which|what|who)\b", r"\bthe most\b(?!\s+recent)",
          r"\bmost recent", r"\b(which|what)\b", r"\bHH\b", r"\bLL\b", r"\btype (HH|LL|H|L|NR)\b",
          r"\b(HH|LL|H|L|NR) alarms?\b", r"\S+\s*|\s+")
# Not checked, and why: pipeline/stream/records.py's re.split(r"(\d+)", name) runs on rotated file names the
# source lists, not on lines; pipeline/stream/triggers.py compiles the operator's own trigger_pattern (configuration,
# not input). No module above is left out.
SIZES = (2048, 4096, 8192)
GROWTH = 2.2                        # steps(2n) / steps(n) at most, at the largest sizes
STEPS_PER_CHAR = 200                # a run past this many steps a character stops: super-linear
SCREEN = (64, 128)                  # the small sizes every family is tried at, to pick the worst for the large ones


def _patterns() -> list[tuple[str, re.Pattern]]:
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, value in sorted(vars(module).items()):
            items = value if isinstance(value, (tuple, list)) else (value,)
            for i, p in enumerate(items):
                if isinstance(p, re.Pattern) and isinstance(p.pattern, str):
                    found.append((f"{name.rsplit('.', 1)[1]}.{attr}" + (f"[{i}]" if items is value else ""), p))
    found += [(f"inline {p}", re.compile(p)) for p in INLINE]
    return found


PATTERNS = _patterns()


def _chars(pattern: re.Pattern) -> list[str]:
    """Characters the pattern names (its literals, its classes' ends, a sample of each category), 'a', '1' and ' '
    first, at most 7."""
    named: list[str] = []

    def walk(nodes):
        for op, av in nodes:
            if op in (rs.C.LITERAL, rs.C.NOT_LITERAL):
                named.append(chr(av))
            elif op is rs.C.RANGE:
                named.append(chr(av[0]))
            elif op is rs.C.CATEGORY:
                named.append({rs.C.CATEGORY_DIGIT: "1", rs.C.CATEGORY_SPACE: " ", rs.C.CATEGORY_WORD: "a"}.get(av, "."))
            elif op is rs.C.IN:
                walk(av)
            elif op is rs.C.BRANCH:
                for alt in av[1]:
                    walk(alt)
            elif op is rs.C.SUBPATTERN:
                walk(av[3])
            elif op in (rs.C.MAX_REPEAT, rs.C.MIN_REPEAT, rs.C.POSSESSIVE_REPEAT):
                walk(av[2])
            elif op in (rs.C.ASSERT, rs.C.ASSERT_NOT):
                walk(av[1])
            elif op is rs.C.ATOMIC_GROUP:
                walk(av)
    walk(rs._nodes(pattern))
    out = list(dict.fromkeys(["a", "1", " ", *(c for c in named if c.isprintable())]))
    return out[:7]


def _families(pattern: re.Pattern) -> dict[str, callable]:
    chars = _chars(pattern)
    fams = {}
    for c in chars:
        fams[f"{c!r}*n"] = lambda n, c=c: c * n
    for c, d in itertools.combinations(chars, 2):
        fams[f"({c + d!r})*n"] = lambda n, c=c, d=d: (c + d) * (n // 2)
        fams[f"{c!r}*n+{d!r}"] = lambda n, c=c, d=d: c * (n - 1) + d
        fams[f"{d!r}*n+{c!r}"] = lambda n, c=c, d=d: d * (n - 1) + c
    fams["a+1*n+' b'"] = lambda n: "a" + "1" * (n - 3) + " b"                     # finding 5's line
    fams["a+1*n+' b port '"] = lambda n: "a" + "1" * (n - 9) + " b port "
    fams["'a.'*n+':/'"] = lambda n: "a." * (n // 2 - 1) + ":/"                    # a scheme that never ends
    fams["a*n+':/ :x'"] = lambda n: "a" * (n - 5) + ":/ :x"                       # a host before no port
    fams["words+keys"] = lambda n: "w" * (n // 2) + " " + " ".join(f"k{i}" for i in range(n // 8))
    return fams


def _steps(pattern: re.Pattern, text: str) -> int:
    """finditer's steps over the whole text: a search that fails tries every start, one that matches goes on."""
    return rs.finditer(pattern, text, limit=STEPS_PER_CHAR * len(text) + 1000)[1]


@pytest.mark.parametrize("name, pattern", PATTERNS, ids=[n for n, _ in PATTERNS])
def test_pattern_steps_grow_linearly_with_the_input(name, pattern):
    fams = _families(pattern)
    screened = []
    for fam, make in fams.items():
        try:
            small, large = (_steps(pattern, make(n)) for n in SCREEN)
        except rs.TooManySteps:
            pytest.fail(f"{name}: more than {STEPS_PER_CHAR} steps a character on {fam} at {SCREEN[1]} characters")
        screened.append((large / max(small, 1), large, fam))
    worst = {max(screened)[2], max(screened, key=lambda s: s[1])[2]}     # the steepest and the costliest
    for fam in sorted(worst):
        counts = []
        for n in SIZES:
            try:
                counts.append(_steps(pattern, fams[fam](n)))
            except rs.TooManySteps:
                pytest.fail(f"{name}: more than {STEPS_PER_CHAR} steps a character on {fam} at {n} characters "
                            f"(steps so far {counts})")
        ratios = [b / max(a, 1) for a, b in zip(counts, counts[1:])]
        assert max(ratios) <= GROWTH, f"{name} on {fam}: steps {dict(zip(SIZES, counts))} grow x{max(ratios):.2f}"


SAMPLES = [
    "Dec 10 06:55:48 LabSZ sshd[24200]: Failed password for invalid user webmaster from 173.234.31.186 port 38926 ssh2",
    "17/06/09 20:10:46 INFO storage.MemoryStore: Block broadcast_3 stored as values in memory (estimated size 28.0 KB, "
    "free 317.1 MB)",
    "081109 204005 35 INFO dfs.FSNamesystem: BLOCK* NameSystem.addStoredBlock: blockMap updated: 10.251.73.220:50010 "
    "is added to blk_-1608999687919862906 size 67108864",
    '127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326 "http://x.org/" "Mozilla"',
    "2015-10-18 18:01:47,978 INFO [main] hdfs://msra-sa-41:9000/x file:/D:/x.jar C:\\Windows\\a.dll user=root "
    "tag=\"A b\"",
    "which port did gw7 use? how many kB did broadcast_3 free? HH alarms of type LL, the most recent "
    "(boot, wait, halt)",
    "onStandStepChanged 3601 action: SCREEN_OFF to RUNNING E_FAIL 0x80004005 LOG:  connection received port=22",
    "a" + "1" * 40 + " b port 22", "a." * 20 + ":/", "up or Down?", "x1 y2 slot 9 stage 1.0 TID 56 'quoted phrase'",
]


@pytest.mark.parametrize("name, pattern", PATTERNS, ids=[n for n, _ in PATTERNS])
def test_step_counter_finds_what_re_finds(name, pattern):
    """The instrument agrees with re on every match's span (finditer) on real lines, questions and the families."""
    texts = SAMPLES + [make(24) for make in _families(pattern).values()]
    for text in texts:
        assert rs.finditer(pattern, text)[0] == [m.span() for m in pattern.finditer(text)], (name, text)
        for end in (len(text) // 2, len(text)):
            m = pattern.search(text, 0, end)
            assert rs.search(pattern, text, 0, end)[0] == (m.span() if m else None), (name, text, end)


def test_step_counter_refuses_what_it_does_not_model():
    with pytest.raises(rs.Unsupported, match="GROUPREF"):
        rs.search(re.compile(r"(a)\1"), "aa")


def test_step_counter_counts_a_quadratic_pattern_as_quadratic():
    """The instrument sees what sre does: the cited reader's old word-before pattern grows x4 a doubling."""
    old = re.compile(r"([A-Za-z]\w*)[^A-Za-z]*$")
    small, large = (rs.steps(old, "a" + "1" * n + " b port ") for n in (200, 400))
    assert large / small > 3.5


# -- functions applying a pattern per span or per key: their whole work ------------------------------------------------
def _lines_run(fn) -> int:
    """Python lines executed by fn() (every frame, generator expressions too): the work outside the patterns."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _linear(work: dict[int, int]) -> bool:
    sizes = sorted(work)
    return all(work[b] / max(work[a], 1) <= GROWTH for a, b in zip(sizes, sizes[1:]))


LINES = {   # a 4 KB line of each shape, cut to n characters
    "host:port run": lambda n: "a" * (n - 5) + ":/ :x",
    "scheme run": lambda n: "a." * (n // 2 - 1) + ":/",
    "many values": lambda n: ("1.5 kB 10.0.0.1 x1 port 22 /a/b " * n)[:n],
    "numbers": lambda n: "1 " * (n // 2),
}


@pytest.mark.parametrize("shape", LINES)
def test_value_extraction_steps_grow_linearly_with_the_line(shape):
    work = {}
    for n in (1024, 2048, 4096):
        with rs.counting(values, per_char=STEPS_PER_CHAR) as tally:
            values.values_of(LINES[shape](n))
        work[n] = tally.steps
    assert _linear(work), f"values_of's regex steps on {shape}: {work}"


@pytest.mark.parametrize("shape", LINES)
def test_value_extraction_python_work_grows_linearly_with_the_line(shape):
    """Outside its patterns values_of's work is linear too: no span is checked against every span taken before it."""
    work = {n: _lines_run(lambda n=n: values.values_of(LINES[shape](n))) for n in (1024, 2048, 4096)}
    assert _linear(work), f"values_of's Python lines on {shape}: {work}"


def _archive(tmp_path, lines):
    path = tmp_path / "a.sqlite"
    with Archive(path) as archive:
        for i, text in enumerate(lines):
            archive.add(i, "", text)
    return str(path)


def test_word_before_each_span_costs_steps_linear_in_the_line(tmp_path):
    """Finding 5: "which port did gw7 use?" over lines a + 1*n + " b port 22" (the word before each span was searched
    over the line's whole prefix: quadratic, 10 s on five 3.6 KB lines)."""
    work = {}
    for n in (1024, 2048, 4096):
        line = "gw7 a" + "1" * (n - 30) + " b port 22 port 80 port 81"
        (tmp_path / str(n)).mkdir()
        path = _archive(tmp_path / str(n), [line])
        with rs.counting(cited, per_char=STEPS_PER_CHAR) as tally:
            reply = cited.read(path, "which port did gw7 use?")
        work[n] = tally.steps
        assert isinstance(reply, cited.Choice) and reply.options == ("22", "80", "81")
    assert _linear(work), f"the cited reader's steps over a lookup's spans: {work}"


def test_fitting_every_span_of_a_line_costs_steps_linear_in_the_line():
    """Each span's fit reads the words in the _NEAR characters before it, not the line's whole prefix: over a line of
    a span every 8 characters the fits together stay linear (the archive keeps 64 values a line; the fit does not
    count on it)."""
    r = route_mod.route("which port did gw7 use?")
    work = {}
    for n in (1024, 2048, 4096):
        line = " ".join(f"port {i % 90 + 10}" for i in range(n // 8))
        spans = [v for v in values.values_of(line) if v.kind == "port"]
        with rs.counting(cited, per_char=STEPS_PER_CHAR) as tally:
            for v in spans:
                cited._fit(r, line[:v.start], v.text, line[v.end:])
        work[len(spans)] = tally.steps
    assert _linear(work), f"the fits' steps by the number of spans: {work}"


QUESTIONS = {   # past the 384-token cap: 4,096 characters of these are 2,000 tokens and more
    "long word and keys": lambda n: "which port did " + "w" * (n // 2) + " " + " ".join(f"k{i}" for i in range(n // 8)),
    "key glued to a word": lambda n: "which port did " + "a" * (n // 2) + " " + "a" * (n // 4) + "1 use?",
    "dashed words": lambda n: "did " + "a-" * (n // 2) + " go up or down",
    "paired": lambda n: "which " + "a1" * (n // 2) + " 9 slot",
    "many pairs and values": lambda n: ("slot 9 besides x1 " * n)[:n],
    "offered": lambda n: "which action (" + ", ".join(f"w{i}" for i in range(n // 6)) + ")",
}


@pytest.mark.parametrize("shape", QUESTIONS)
def test_routing_a_question_costs_steps_linear_in_its_length(shape):
    """Finding 9: route() of a question under the 384-token cap took 1.1-1.7 s (the word naming each key was found by
    `(\\w+)[\\s:=#]*KEY`, backtracking over every start of a long word, for every key)."""
    steps, lines = {}, {}
    for n in (512, 1024, 2048, 4096):
        question = QUESTIONS[shape](n)
        with rs.counting(route_mod, values, per_char=STEPS_PER_CHAR) as tally:
            route_mod.route(question)
        steps[n] = tally.steps
        lines[n] = _lines_run(lambda: route_mod.route(question))
    assert _linear(steps), f"route()'s regex steps on {shape}: {steps}"
    assert _linear(lines), f"route()'s Python lines on {shape}: {lines}"

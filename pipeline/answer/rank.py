"""The ranker that names no format: which of a line's span candidates answers an operator's question.

Owns the features of a (question, line, span) (`features`), the linear score over them with weights read from
`ranker.json` (`Ranker`), and the order of a line's candidates (`Ranker.rank`). Every feature is about language or
structure, never a log format (issue 59): a question word naming the span (its key or column, the word before or
after it), the span being a value the question itself names or holding one, its distance in atoms to the value the
question names, its shape (ip, time, path, a number, a quoted text, ...) crossed with the kind of thing the question
asks for (an address, a time, a place, a quantity, a who, an identifier, a name, a state), its length and make-up,
a log level not asked for. The weights are fitted by bench/train_ranker.py on the project's question sets, validated
by leaving one format family out (never on the split being measured), and written to ranker.json beside this file.
Never reads the archive, never calls a model: a pure function of its inputs.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.answer.spans import ATOM, Span
from pipeline.stream.columns import meaning
from pipeline.stream.values import stem
from pipeline.stream.words import RETRIEVAL_STOP, is_level

WEIGHTS = Path(__file__).with_name("ranker.json")
# What a question asks for, by its words (generic English, no format's vocabulary); the first kind a word gives wins
ASKS = {
    "address": "ip address addr client source destination remote peer src dst ip4 ipv4 ipv6 origin",
    "port": "port",
    "time": "when time date timestamp clock day hour",
    "place": "path file url uri directory folder page request resource endpoint location",
    "quantity": "size bytes byte kb mb gb length duration long much many count number total ms seconds took amount",
    "who": "user username account principal who login owner name",
    "id": "id identifier pid uid code number serial session connection conn transaction sequence",
    "host": "host hostname server node machine computer device station domain site",
    "state": "status state level result outcome severity reason error action mode type kind protocol method",
}
ASKED = {w: kind for kind, words in ASKS.items() for w in words.split()}
ASKED_ROOT = {stem(w): kind for w, kind in reversed(ASKED.items())}      # a line's word, stemmed: the kind it names
KINDS = tuple(ASKS) + ("other",)
SHAPES = ("ip", "ipv6", "port", "time", "url", "path", "number", "hex", "host", "hostport", "uuid", "quoted",
          "bracketed", "rest",
          "word", "digits", "alnum", "phrase")
_WORDS = re.compile(r"\w+")
_LEAD = re.compile(r"[A-Za-z]{2,}")
_CLOCK = re.compile(r"\d:\d\d")
_LEVEL_ASKED = frozenset({"level", "severity", "status", "priority"})
# English's function words (articles, conjunctions, prepositions that name no state, pronouns, auxiliaries): a span
# that is one of them alone answers nothing ("and" after "20 kB"); "in", "on", "off", "up", "down", "out" can be states
FUNCTION_WORDS = frozenset("a an the and or but nor of to for from with by at as into onto than then that this these "
                           "those it its is are was were be been being has have had do does did".split())


@dataclass(frozen=True)
class Question:
    """What the ranker reads of a question: its content words' stems, the kinds it asks for, its words as written."""
    text: str
    roots: frozenset[str]
    kinds: tuple[str, ...]
    tokens: frozenset[str]          # every token of the question (\S+ and \w+), case folded: a value it names
    offers: bool                    # it offers its answers: "301 or 302?", "(boot, wait, halt)"
    values: frozenset[str]          # the values it writes: its tokens of 3+ characters with a digit, case folded


def question(text: str) -> Question:
    words = [w.casefold() for w in _WORDS.findall(text)]
    # the kind a noun phrase asks is its head's, its last word: "destination port" asks a port, "source address" one
    heads = [w for i, w in enumerate(words) if w in ASKED and not (i + 1 < len(words) and words[i + 1] in ASKED)]
    kinds = tuple(dict.fromkeys(ASKED[w] for w in heads)) or ("other",)
    tokens = {t.casefold().strip("?.,;:!'\"()[]") for t in text.split()} | set(words)
    return Question(text, frozenset(stem(w) for w in words if w not in RETRIEVAL_STOP and len(w) > 1), kinds,
                    frozenset(t for t in tokens if t), " or " in text or "(" in text,
                    frozenset(t for t in tokens if len(t) >= 3 and any(c.isdigit() for c in t)))


def _shape(s: Span) -> set[str]:
    out = {src.split(":", 1)[1] for src in s.sources if src.startswith("shape:")}
    t = s.text
    if " " in t:
        out.add("phrase")
    elif t.isalpha():
        out.add("word")
    elif t.isdigit():
        out.add("digits")
    elif any(c.isalpha() for c in t) and any(c.isdigit() for c in t):
        out.add("alnum")
    return out


NAMES = ("no_named_value", "in_question", "holds_named", "near_named", "named_by_key", "word_before", "word_after",
         "word_before2", "key_kind", "before_kind", "offered", "time_at_line_time",
         "part_of_atom", "holds_question_word", "self_named", "time_with_clock", "longest_time", "ends_with_punct",
         "word_after2", "atoms1", "atoms2", "atoms3", "atoms4plus", "structured", "atoms_only", "level_not_asked",
         "at_start", "relative_position", "line_time", "has_brackets", "function_word", "level_asked") \
    + tuple(f"shape:{t}" for t in SHAPES) + tuple(f"{k}x{t}" for k in KINDS for t in SHAPES)
INDEX = {n: i for i, n in enumerate(NAMES)}
# What a reader of logs expects before any data, the fit's centre (bench/train_ranker.py pulls the weights toward it,
# so a feature a family's structure alone shows, a column's name, keeps its sense when that family is left out)
PRIOR = {"named_by_key": 2.0, "key_kind": 1.5, "word_before": 1.5, "before_kind": 1.0, "word_after": 0.5,
         "in_question": -3.0, "holds_named": -1.0, "part_of_atom": -1.0, "self_named": 1.0, "time_with_clock": 1.0,
         "longest_time": 1.0, "ends_with_punct": -1.0, "function_word": -3.0, "level_asked": 2.0, "hostxhost": 1.0,
         "portxhostport": -0.5, "offered": 4.0, "level_not_asked": -1.0, "time_at_line_time": 1.0,
         "addressxip": 2.0, "addressxipv6": 2.0, "portxport": 2.0, "timextime": 2.0, "placexpath": 1.5,
         "placexurl": 1.0, "quantityxnumber": 1.0, "idxdigits": 0.5, "hostxalnum": 0.5, "whoxword": 0.5}
PRIOR_WEIGHTS = np.array([PRIOR.get(n, 0.0) for n in NAMES], np.float32)


def features(q: Question, line: str, spans: list[Span]) -> np.ndarray:
    """[len(spans), len(NAMES)] float32: each candidate's features for question `q` on `line`."""
    atoms = [(m.start(), m.end(), m.group()) for m in ATOM.finditer(line)]
    starts = np.array([a for a, _, _ in atoms] or [0])
    named = [i for i, (_, _, t) in enumerate(atoms) if t.casefold() in q.tokens and not t.isalpha()
             or (t.casefold() in q.tokens and len(t) > 3 and t.casefold() not in RETRIEVAL_STOP)]
    words = [(i, stem(t)) for i, (_, _, t) in enumerate(atoms) if t[0].isalpha()]
    times = [(s.start, s.end) for s in spans if "shape:time" in s.sources]      # by position (candidates' order)
    first_time = times[0][0] if times else -1
    X = np.zeros((len(spans), len(NAMES)), np.float32)
    for row, s in enumerate(spans):
        x = X[row]
        a = int(np.searchsorted(starts, s.start, side="right")) - 1       # the span's first and last atoms
        b = int(np.searchsorted(starts, s.end - 1, side="right")) - 1
        text = s.text.casefold()
        x[INDEX["in_question"]] = text in q.tokens or (len(text) > 3 and text in q.text.casefold())
        inside = [i for i in named if a <= i <= b]
        x[INDEX["holds_named"]] = bool(inside) and not x[INDEX["in_question"]]
        if named:
            d = min(min(abs(i - a), abs(i - b)) for i in named)
            x[INDEX["near_named"]] = 1.0 / (1 + d)
        else:
            x[INDEX["no_named_value"]] = 1
        keys = set().union(*(meaning(n) for n in s.names)) if s.names else set()
        x[INDEX["named_by_key"]] = min(len(keys & q.roots), 3)       # words of the question its key says
        x[INDEX["key_kind"]] = any(ASKED_ROOT.get(k) in q.kinds for k in keys)
        before = [w for i, w in words if i < a][-2:]
        x[INDEX["before_kind"]] = bool(before) and ASKED_ROOT.get(before[-1]) in q.kinds
        after2 = [w for i, w in words if i > b][:2]
        after = after2[0] if after2 else ""
        x[INDEX["word_after2"]] = len(after2) == 2 and after2[1] in q.roots
        x[INDEX["word_before"]] = bool(before) and before[-1] in q.roots
        x[INDEX["word_before2"]] = len(before) == 2 and before[0] in q.roots
        x[INDEX["word_after"]] = after in q.roots
        whole = atoms[a][0] == s.start and atoms[b][1] == s.end if atoms else True
        x[INDEX["part_of_atom"]] = not whole
        parts = [stem(w) for w in _WORDS.findall(s.text) if w[0].isalpha()]
        x[INDEX["holds_question_word"]] = any(w in q.roots for w in parts[1:]) or (len(parts) > 0 and " " in s.text
                                                                                  and parts[-1] in q.roots)
        lead = _LEAD.match(s.text)
        x[INDEX["self_named"]] = bool(lead) and stem(lead[0]) in q.roots and lead.end() < len(s.text)
        x[INDEX["time_with_clock"]] = "time" in q.kinds and bool(_CLOCK.search(s.text))
        x[INDEX["longest_time"]] = "shape:time" in s.sources and not any(
            a0 <= s.start and s.end <= b0 and (a0, b0) != (s.start, s.end) for a0, b0 in times)
        x[INDEX["ends_with_punct"]] = not s.text[-1].isalnum() and not s.names
        n = b - a + 1
        x[INDEX["atoms1" if n == 1 else "atoms2" if n == 2 else "atoms3" if n == 3 else "atoms4plus"]] = 1
        x[INDEX["structured"]] = bool(s.names)
        x[INDEX["atoms_only"]] = s.sources == ("atoms",)
        x[INDEX["level_not_asked"]] = is_level(s.text) and not (q.roots & _LEVEL_ASKED)
        x[INDEX["at_start"]] = s.start == 0
        x[INDEX["relative_position"]] = s.start / max(len(line), 1)
        x[INDEX["line_time"]] = s.start == first_time
        x[INDEX["time_at_line_time"]] = s.start == first_time and "time" in q.kinds
        x[INDEX["offered"]] = x[INDEX["in_question"]] and q.offers
        x[INDEX["has_brackets"]] = s.text[:1] in "[(<{" or s.text[-1:] in "])>}"
        x[INDEX["function_word"]] = text in FUNCTION_WORDS
        x[INDEX["level_asked"]] = is_level(s.text) and bool(q.roots & _LEVEL_ASKED)
        for t in _shape(s):
            x[INDEX[f"shape:{t}"]] = 1
            for k in q.kinds:
                x[INDEX[f"{k}x{t}"]] = 1
    return X


class Ranker:
    """A line's candidates in order of the fitted linear score (ties: the earlier, shorter span first)."""

    def __init__(self, weights: np.ndarray | None = None, path: Path = WEIGHTS):
        if weights is None:
            data = json.loads(path.read_text())
            if tuple(data["features"]) != NAMES:
                raise ValueError(f"{path}: its features are not this ranker's (refit: python -m bench.train_ranker)")
            weights = np.array(data["weights"], np.float32)
        self.w = np.asarray(weights, np.float32)

    def scores(self, q: Question, line: str, spans: list[Span]) -> np.ndarray:
        return features(q, line, spans) @ self.w if spans else np.zeros(0, np.float32)

    def rank(self, q: Question, line: str, spans: list[Span]) -> list[tuple[Span, float]]:
        s = self.scores(q, line, spans)
        order = sorted(range(len(spans)), key=lambda i: (-s[i], spans[i].start, spans[i].end))
        return [(spans[i], float(s[i])) for i in order]

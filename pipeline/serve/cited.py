"""The cited reader: an operator's lookup or aggregate answered from the archive, every answer with the lines it
stands on, or no answer.

Owns what a routed question (pipeline/serve/route.py) becomes: a `Reply` (the answer, the text streamed to the
operator, the citations the server writes: seq, time, text of each line), or a `Choice` when the wanted kind and the
question's words leave several spans in the line (the model picks one of them under an options rule, and `chosen`
turns its pick into the Reply). Never runs a model; never writes an answer that is not a span of a cited line
(lookups, first/last), or a value computed here over the archive (count, most, distinct).

Lookups: the lines holding every value the question names (exact match), of its TEP alarm type when it asks one,
with a span of the wanted kind (other than the named values), those covering the most of the question's word roots,
newest first. A positional row (W3C, Zeek, an NCSA access log: pipeline/stream/columns.py) answers with the cell
whose column name says most of the question's words ("which source port" -> id.orig_p); a header line is no event.
The newest line's spans are narrowed by the word just before each span ("free 317.1 MB" for "... free?") and by the
size unit asked; one left: the answer, no model call. Lines of the same rank whose one span
differs from the answer: "other lines say otherwise", each cited, newest first (the answer stays the newest line's).
No line with a span of the kind asked but lines holding the values named: the best of them offers all its spans
(`_spread`) and the model picks one; so does a line whose only candidate is the value right after a value named (a
guess, "HRESULT = 0x80004005 - E_FAIL", wrong on positional formats such as access logs). No line: answer null, "not
found", with the `nearest` lines (not citations). Aggregates: count, most frequent value of the wanted kind,
distinct values, first/last line, over the same lines; each says its scope, "since line #a (time)", the archive's
oldest line (serve.archive_max_lines bounds its history). A count of no line is "not found" (answer null: no answer
without a citation; the text says 0 lines, the nearest lines are given); a list of distinct values cites a line for
every value it lists. An aggregate naming no value whose words match no line is not the archive's to answer (None:
the free reader answers it), except the most frequent value of a kind, or the lines of an alarm type asked, taken
over every line then ("which tag alarms most often?" on a log writing ALM; not "which tags are alarming now?": a
list of every tag would answer another question). A lookup naming no value stands on the lines holding every word
root of the question; none: the free reader's.

Bounded (issue 55): a question reads at most serve.question_max_lines candidate lines (the newest; the oldest for a
first) within serve.question_budget_s, its nearest lines included (pipeline/stream/evidence.py `Budget`); an answer
taken over fewer lines than there were says so, with the lines weighed, their seqs and what to narrow by (a count is
then "at least N"); none weighed: not found, too broad. Never an answer without its citation either way.
"""
from __future__ import annotations

import re
import sqlite3
from collections import Counter
from dataclasses import dataclass

from pipeline.answer import rank
from pipeline.answer.pick import pick
from pipeline.config import ServeSection
from pipeline.serve.route import DURATIONS, Route, route
from pipeline.stream import evidence
from pipeline.stream.archive import open_reader, search
from pipeline.stream.columns import header_of, meaning
from pipeline.stream.evidence import ArchivedLine
from pipeline.stream.values import Value, key_of, stem
from pipeline.stream.words import LEVEL_WORDS, is_level

MAX_CITED = 8
MAX_OPTIONS = 8                     # spans a line offers the model when none is of the kind asked
UNDECIDED = 0.05                    # a scoring choice's best and next within this (ranker score + log p): not decided
_SERVE = ServeSection()             # a question's budget when none is given: serve.question_budget_s, ...max_lines
_WORD = re.compile(r"\w+")
_BEFORE = re.compile(r"(?<!\w)[^\WA-Za-z]*+([A-Za-z]\w*+)[^A-Za-z]*+$")   # the last word before a span (group 1),
#   numbers skipped: "request /10.0.0.2:"; tried once a run of word characters, from its first letter (a word run ends
#   where it ends from any start in it: `([A-Za-z]\w*)[^A-Za-z]*$` rescanned it from each: quadratic, finding 5)
_NEAR = 256                         # characters before a span its naming words are read in (the last word and 4 more)
_WORD_AT = re.compile(r"[A-Za-z]+")               # a line's words, split at case changes too: "onReceive" -> on, Receive
_BYTES = re.compile(r"(?<!\d)\d++(?=\s?(?:bytes?|B)$)")         # "301" of "301 bytes"
_TIMED = re.compile(r"(?<!\d)(-?\d++(?:\.\d++)?+)\s?([A-Za-z]++)\b")     # "1938 ms": the number and its unit
_AFTER = re.compile(r"[^A-Za-z]{0,3}([A-Za-z]+)")         # the word just after a span: "344 bytes received"
_GAP = re.compile(r"[^A-Za-z0-9]*(?:[A-Za-z]+[^A-Za-z0-9]*)?")   # between a naming word and its value: one word at most
# a direction word before a span -> the roots of the nouns that ask for it: "from 127.0.0.1:22 to 142.93.136.142:80"
_DIRECTION = {"to": ("destin", "target", "dest", "dst"), "dst": ("destin", "dest"), "dest": ("destin",),
              "from": ("source", "origin", "src"), "src": ("source",)}


@dataclass(frozen=True)
class Citation:
    seq: int
    time: str
    text: str


@dataclass(frozen=True)
class Reply:
    route: str                                   # lookup | aggregate
    answer: str | None                           # the span copied, or the computed value; None: not found
    text: str                                    # what the operator reads (streamed)
    citations: tuple[Citation, ...] = ()
    nearest: tuple[Citation, ...] = ()           # when not found: the lines closest to the question


@dataclass(frozen=True)
class Choice:
    """Several spans of one line fit the question: the model picks one option (a span's text), written under an
    options rule; or, with `prior` (serve.reader "spans"), scores each as a whole continuation (`scored`)."""
    routed: Route
    line: ArchivedLine
    options: tuple[str, ...]
    lead: str                                    # how the reply starts ("the last of 3 matching lines...")
    prior: tuple[float, ...] = ()                # the ranker's score of each option: the model's scores add to it


def cite(line: ArchivedLine) -> Citation:
    return Citation(line.seq, line.when, line.text)


def read(archive_path, question: str, budget_s: float | None = None, max_lines: int | None = None,
         budget: evidence.Budget | None = None, spans: bool = False, model: int = 0) -> Reply | Choice | None:
    """The cited reader's answer to `question`, or None when it is not a lookup or an aggregate (or there is no
    archive yet): the free reader answers those. Its work is bounded by `budget` (default: `budget_s` seconds and
    `max_lines` lines read, each None: serve.question_budget_s, serve.question_max_lines); past it the reply says
    its bound (`_bound`), or that the question is too broad. `spans` (serve.reader "spans"): a lookup's line and
    span are the ranker's (pipeline/answer/pick.py), not this module's rules; `model` (serve.span_model) > 0: its
    first `model` candidates are handed to the model to score (a Choice with `prior`)."""
    r = route(question)
    if r.kind == "other" or not archive_path:
        return None
    con = open_reader(archive_path)
    if con is None:
        return None
    if budget is None:
        budget = evidence.Budget(_SERVE.question_budget_s if budget_s is None else budget_s,
                                 _SERVE.question_max_lines if max_lines is None else max_lines)
    budget.watch(con)
    try:
        return _read(con, r, archive_path, question, budget, spans, model)
    except sqlite3.OperationalError:
        if budget.cut != "time":
            raise
        return _too_broad(r, budget, "in the archive")          # a query the budget aborted before any line
    finally:
        con.close()


def _read(con, r: Route, archive_path, question: str, budget: evidence.Budget, spans: bool,
          model: int) -> Reply | Choice | None:
    first = evidence.oldest(con)          # the scope first: one row, before the budget is spent
    scope = f"since line #{first.seq} ({first.when})" if first else "in an empty archive"
    early = r.op == "first"               # the first: the oldest candidates read, the newest otherwise
    lines = [ln for ln in evidence.holding(con, r.keys, r.roots, budget, early) if _fits(ln, r)]
    if not r.keys and r.op == "span":     # found by words alone: a line must hold every one of them
        lines = [ln for ln in lines if ln.covers(r.roots) == len(r.roots)]
    if not r.keys and r.roots and not lines:
        if r.op != "most" and not r.alarm:
            return None                   # the free reader's (also when the budget found no line: as it was)
        if not budget.cut:
            lines = [ln for ln in evidence.holding(con, budget=budget, oldest_first=early) if _fits(ln, r)]
    if early:
        lines.reverse()                       # newest first, as every rule reads them
    if not lines and budget.cut:
        return _too_broad(r, budget, scope)
    if r.op == "count":
        return _count(r, lines, scope, lambda: _nearest(archive_path, question, budget), budget)
    if r.op in ("most", "distinct"):
        return _values(r, lines, scope, budget)
    if spans:
        return _picked(r, question, lines, scope, lambda: _nearest(archive_path, question, budget), budget, model)
    return _lookup(r, lines, scope, lambda: _nearest(archive_path, question, budget), budget)


def chosen(choice: Choice, written: str) -> Reply:
    """The Reply for the option the model wrote (None when it wrote none: cut short)."""
    pick = written.strip()
    r = choice.routed
    if pick not in choice.options:
        return undecided(choice, "the model chose none of them")
    return Reply(r.kind, pick, _said(r, pick, choice.line, choice.lead), (cite(choice.line),))


def scored(choice: Choice, scores) -> Reply:
    """The Reply for a scoring choice: the option of the highest ranker score plus the model's sum of log p (the
    best reading measured, docs/operators.md); within UNDECIDED of the next one: not decided, the line cited."""
    total = [p + float(s) for p, s in zip(choice.prior, scores)]
    order = sorted(range(len(total)), key=lambda i: -total[i])
    best = order[0]
    if len(order) > 1 and total[best] - total[order[1]] < UNDECIDED:
        return undecided(choice, f"{choice.options[best]} and {choice.options[order[1]]} score within "
                                 f"{UNDECIDED} of each other")
    pick_ = choice.options[best]
    return Reply(choice.routed.kind, pick_, _said(choice.routed, pick_, choice.line, choice.lead),
                 (cite(choice.line),))


def unscored(choice: Choice, why: str) -> Reply:
    """A scoring choice the model was not asked about: the ranker's first option, saying why."""
    r = choice.routed
    return Reply(r.kind, choice.options[0], _said(r, choice.options[0], choice.line, choice.lead) +
                 f"\nthe ranker's choice, no model asked: {why}", (cite(choice.line),))


def undecided(choice: Choice, why: str) -> Reply:
    """No option taken (answer null): the options and why, citing the line they are spans of."""
    return Reply(choice.routed.kind, None, f"not decided between {', '.join(choice.options)} on line "
                                           f"#{choice.line.seq}: {why}", (cite(choice.line),))


# -- lookups, first and last ---------------------------------------------------------------------------------------
def _lookup(r: Route, lines: list[ArchivedLine], scope: str, nearest, budget: evidence.Budget) -> Reply | Choice:
    keys = {key_of(k) for k in r.keys}
    weighed: list[ArchivedLine] = []                     # the lines weighed before the budget ran out (newest first)
    ranked = []
    for ln in budget.each(lines if r.op != "first" else reversed(lines)):   # the first: weighed from the oldest
        weighed.append(ln)
        if not r.want:
            ranked.append(((ln.covers(r.roots),), ln, ((ln.text,), 0, 0)))
        elif (found := _options(r, ln, keys))[0]:
            ranked.append((_rank(r, ln, found), ln, found))
    if r.op == "first":
        weighed.reverse()
        ranked.reverse()
    bound = _bound(budget, weighed)
    lines = weighed
    if not ranked and r.want and lines and (spread := _spread(r, lines, keys, bound)):
        return spread
    if not ranked:
        return _none(r, lines, scope, bound, budget, nearest)
    top = max(rank for rank, _, _ in ranked)
    fitting = [(ln, found) for rank, ln, found in ranked if rank == top]             # newest first
    line, (options, _, tier) = fitting[-1] if r.op == "first" else fitting[0]
    lead = "" if r.op == "span" and not bound else f"the {r.op} of {len(fitting)} matching lines {scope}{bound}" \
        if r.op != "span" else bound[2:]
    if not r.want:                               # no kind wanted: the line itself (its time, asked "when")
        return Reply(r.kind, line.text, _said(r, line.text, line, lead), (cite(line),))
    if tier == 0 and len(spans := _every_span(r, line, keys)) > 1:   # only "after the value named": a guess
        return Choice(r, line, spans, lead)
    if len(options) > 1:
        return Choice(r, line, options, lead)
    answer = options[0]
    others: dict[str, tuple[str, ArchivedLine]] = {}
    if r.op == "span":
        for ln, (theirs, _, _) in fitting[1:]:
            if len(theirs) == 1 and key_of(theirs[0]) != key_of(answer) and key_of(theirs[0]) not in others:
                others[key_of(theirs[0])] = (theirs[0], ln)
    text = _said(r, answer, line, lead)
    listed = list(others.values())[:MAX_CITED - 1]
    if listed:
        text += "\nother lines say otherwise, newest first: " + "; ".join(
            f"{theirs} on line #{ln.seq} at {ln.when}" for theirs, ln in listed)
    return Reply(r.kind, answer, text, (cite(line), *(cite(ln) for _, ln in listed)))


def _none(r: Route, lines: list[ArchivedLine], scope: str, bound: str, budget: evidence.Budget, nearest) -> Reply:
    """Not found: no line holding the values named with a span of the kind asked; the lines that held the values (not
    citations), else the nearest lines."""
    held = "" if not r.keys else f" holding {', '.join(r.keys)}"
    what = f" with a {r.type_noun or '/'.join(r.want)}" if r.want and lines else ""
    return Reply(r.kind, None, f"not found: no line{held}{what} {scope}{bound}", (),
                 tuple(cite(ln) for ln in lines[:3]) or (() if budget.cut else nearest()))


def _picked(r: Route, question: str, lines: list[ArchivedLine], scope: str, nearest, budget: evidence.Budget,
            model: int = 0) -> Reply | Choice:
    """A lookup answered by the ranker (serve.reader "spans", pipeline/answer/pick.py): of the lines weighed within
    the budget, those covering most of the question's word roots go to `pick` (newest first; the oldest first asked
    for a first), which takes a line and its best-ranked span. Lines as good whose best span is another text: "other
    lines say otherwise", each cited; a runner-up within reach on the same line is named. `model` > 0: the line's
    first `model` candidates (of distinct texts) go to the model as a scoring Choice instead (`scored`)."""
    weighed = list(budget.each(lines if r.op != "first" else reversed(lines)))     # in the order to prefer
    got = pick(rank.question(question), weighed, keep_going=lambda: not budget.over())
    bound = _bound(budget, weighed[::-1] if r.op == "first" else weighed)
    if got is None:
        return _none(r, weighed, scope, bound, budget, nearest)
    lead = bound[2:] if r.op == "span" else f"the {r.op} of {got.fitting} matching lines {scope}{bound}"
    if model and len(top_k := got.first(model)) > 1:
        return Choice(r, got.line, tuple(s.text for s, _ in top_k), lead, tuple(v for _, v in top_k))
    text = _said(r, got.answer.text, got.line, lead)
    if got.runner_up:
        text += f"\nclose behind on the same line: {got.runner_up[0].text}"
    listed = got.others[:MAX_CITED - 1]
    if listed:
        text += "\nother lines say otherwise: " + "; ".join(
            f"{span.text} on line #{ln.seq} at {ln.when}" for ln, span in listed)
    return Reply(r.kind, got.answer.text, text, (cite(got.line), *(cite(ln) for ln, _ in listed)))


def _spread(r: Route, lines: list[ArchivedLine], keys: set[str], bound: str = "") -> Choice | None:
    """No line has a span of the kind asked, or one after a word naming it: the line covering the most of the
    question's roots (the newest; the oldest asked "first") offers every span it holds but the values named and its
    time, and the model picks one; None when it holds no other span."""
    top = max(ln.covers(r.roots) for ln in lines)
    best = [ln for ln in lines if ln.covers(r.roots) == top]
    line = best[-1] if r.op == "first" else best[0]
    options = _every_span(r, line, keys)
    if not options:
        return None
    lead = bound[2:] if r.op == "span" else f"the {r.op} of {len(best)} matching lines{bound}"
    return Choice(r, line, options, lead)


def _every_span(r: Route, line: ArchivedLine, keys: set[str]) -> tuple[str, ...]:
    """A line's spans in line order (distinct texts, at most MAX_OPTIONS) but its time, the values the question
    names and those it says are not the answer."""
    return tuple(dict.fromkeys(v.text for v in sorted(_free(r, line, keys), key=lambda v: v.start)))[:MAX_OPTIONS]


def _free(r: Route, line: ArchivedLine, keys: set[str]) -> list[Value]:
    """The line's values that may be an answer: not its time, not a value the question names or says is not the
    answer."""
    return [v for v in line.values if v.kind not in ("time", "clock") and key_of(v.text) not in keys and
            not _said_by_question(r, v) and v.text not in r.besides]


def _rank(r: Route, line: ArchivedLine, found: tuple) -> tuple[int, int, int]:
    """How well a line answers: the question's word roots it covers, then how its best spans fit, then whether they
    are of a kind asked (2) or the value after a word naming what is asked (1) or after a value named (0)."""
    _, fit, tier = found
    return line.covers(r.roots), fit, tier


def _options(r: Route, line: ArchivedLine, keys: set[str]) -> tuple[tuple[str, ...], int, int]:
    """The spans of `line` that may answer (distinct texts), their fit and tier (see `_rank`); () when none: the spans of
    the kinds asked best fitting the question (of equal fit, of the kind asked first); else the value right after a
    word of the line naming what is asked (the words after "which", then the type nouns: "instruction address:
    0x00004ed8", "action: ...SCREEN_OFF"); else the value right after a value the question names ("HRESULT =
    0x80004005 - E_FAIL": tier 0, a guess `_lookup` hands to the model). Before all, the line's word among the
    answers the question offers ("Up or Down?")."""
    if r.alternatives:                              # "Up or Down?": the line's word among the answers offered
        offered = [m for m in _WORD_AT.finditer(line.text) if m[0].casefold() in r.alternatives]
        if offered:
            return tuple(dict.fromkeys(m[0] for m in offered)), 1, 2
    if (named := _columns(r, line, keys))[0]:        # a row whose header (or format) names its cells
        return named
    spans = [(i, v) for i, kind in enumerate(r.want) for v in _spans(line, kind, keys, r)]
    if spans:
        scored = [(_fit(r, line.text[:v.start], v.text, line.text[v.end:]), -i, v.text) for i, v in spans]
        best = max(s[:2] for s in scored)
        return tuple(dict.fromkeys(t for f, i, t in scored if (f, i) == best)), best[0], 2
    free = _free(r, line, keys)
    words = list(_WORD_AT.finditer(line.text))
    for tier, starts in ((1, [m.end() for m in words if _names(stem(m[0]), set(r.subject) - {""})]),
                         (1, [m.end() for m in words if _names(stem(m[0]), set(r.nouns) - {""})]),
                         (0, [v.end for v in line.values if key_of(v.text) in keys])):
        for at in starts:
            after = [v for v in free if v.start >= at and _GAP.fullmatch(line.text, at, v.start)]
            if after:
                first = min(after, key=lambda v: (v.start, -v.end))
                return (first.text,), 0, tier
    return (), 0, 0


def _columns(r: Route, line: ArchivedLine, keys: set[str]) -> tuple[tuple[str, ...], int, int]:
    """The cells of the columns whose names say most of what the question asks (pipeline/stream/columns.py: "which
    source port" -> Zeek's id.orig_p, "bytes the client sent" -> W3C's cs-bytes); of equal say, those holding a value
    of a kind asked, then the names saying least else ("status" -> sc-status, not sc-win32-status). () when no name
    says a word of the question, or when the best are the line's time itself (asked "when": the time, not its date
    and clock cells). A name saying the noun asked ("uid", "which client") weighs twice a word the line is found by."""
    cols = [v for v in line.cells if key_of(v.text) not in keys and v.text not in r.besides]
    named = {*r.nouns, *r.subject, stem(r.type_noun)} - {""}            # what is asked: 2 points a word
    asked = {*r.roots} - named                                            # words to find the line by: 1
    if not cols or not (named or asked):
        return (), 0, 0
    kinds = {(v.start, v.end): v.kind for v in line.values}
    scored = []
    for v in cols:
        said = meaning(v.kind[4:])
        hits = sum((2 if a in named else 1) for a in named | asked
                   if any(a == w or len(a) >= 3 and w.startswith(a) for w in said))
        scored.append(((hits, kinds.get((v.start, v.end)) in r.want, -len(said)), v))
    best = max(s for s, _ in scored)
    chosen = [v for s, v in scored if s == best]
    when = next((v for v in line.values if v.kind == "time"), None)
    if best[0] == 0 or when and all(when.start <= v.start and v.end <= when.end for v in chosen):
        return (), 0, 0
    return tuple(dict.fromkeys(v.text for v in chosen)), best[0], 2


def _names(word: str, names: set[str]) -> bool:
    return any(word == n or len(n) >= 3 and word.startswith(n) for n in names)


def _said_by_question(r: Route, v: Value) -> bool:
    """A one-word span the question itself says is not its answer ("after NEW, which state...")."""
    return v.kind == "status" and stem(v.text) in r.roots


def _said(r: Route, answer: str, line: ArchivedLine, lead: str) -> str:
    noun = f"{r.type_noun} " if r.type_noun and r.type_noun not in ("when", "time", "timestamp", "date", "where") and \
        not answer.casefold().startswith(r.type_noun) else ""
    where = f"from line #{line.seq} at {line.when}" + (f" ({lead})" if lead else "")
    return f"{noun}{answer}, {where}: {line.text}"


def _spans(line: ArchivedLine, kind: str, keys: set[str], r: Route | None = None) -> list[Value]:
    """The line's values of `kind`, other than the values the question names (a line's time: its first); a log level
    (INFO, WARN) is a status only when a level is asked, and then only a level is."""
    if kind.startswith("field:"):              # a field whose name holds the word asked: "calories", totalCalories=
        root = stem(kind[6:])
        found = [v for v in line.values if v.kind.startswith("field:") and key_of(v.text) not in keys and
                 (root == v.kind[6:] or len(root) >= 3 and root in v.kind[6:])]     # "as" is no "password"
        return found
    found = [v for v in line.values if v.kind == kind and key_of(v.text) not in keys and
             not (r and (_said_by_question(r, v) or v.text in r.besides))]
    if kind == "size" and r is not None and r.unit == "b":       # "how many bytes": the number of "301 bytes"
        found = [Value("number", m[0], v.start, v.start + m.end()) for v in found if (m := _BYTES.match(v.text))] \
            or found                                             # written in bytes first, not "(1.16 KB)"
    if kind == "number" and r is not None and r.unit in DURATIONS.values():   # "how many ms?": the number of "1938 ms"
        timed = [Value("number", m[1], v.start, v.start + len(m[1])) for v in found
                 if (m := _TIMED.match(line.text, v.start)) and DURATIONS.get(m[2].casefold()) == r.unit]
        found = timed or found
    if kind == "status" and r is not None:
        level = r.type_noun in ("level", "severity")
        found = [v for v in found if _is_level(line, v) == level] or found
    return found[:1] if kind == "time" else found


def _is_level(line: ArchivedLine, v: Value) -> bool:
    """A log level: as written (WARN, Android's letter, PostgreSQL's LOG), or a level word in lower case between
    brackets ("[notice]")."""
    if v.text.isupper():
        return is_level(v.text)
    return v.text.upper() in LEVEL_WORDS and line.text[v.start - 1:v.start] == "[" and line.text[v.end:v.end + 1] == "]"


def _fit(r: Route, before: str, text: str, after: str | None = None) -> int:
    """How well a span fits the question: 2 points for each of the question's word roots and type nouns the word just
    before it holds ("onStandStepChanged 3601" for "the stand step count"; "to" holds a destination, "from" a
    source), 2 if it starts with a type noun ("attempt_1445..." for "which attempt"), 1 if its unit is the unit asked,
    1 for each root among the 4 words before that one ("Connection broken for id 1889..." against "my id = 1", asked
    which id the connection broke for) and 1 for each root the word just after it starts with ("344 bytes received"
    for "bytes received?")."""
    before = before[-_NEAR:]                                   # the words just before the span, not the whole prefix
    word = _word_before(before, len(before)).casefold()
    names = {*r.roots, *r.nouns, *([stem(r.type_noun)] if r.type_noun else ())} - {""}
    near = sum(1 for n in names if word and (stem(word).startswith(n) or n.startswith(stem(word)) or
                                             len(n) >= 3 and n in word or n in _DIRECTION.get(word, ())))
    context = _WORD.findall(before.casefold())[-5:-1]          # the words before that one: "broken for id 1889..."
    said = sum(1 for n in r.roots if any(w.startswith(n) for w in context))
    if after is not None and (m := _AFTER.match(after)):      # the word just after: "344 bytes received"
        said += sum(1 for n in r.roots if len(n) >= 3 and stem(m[1].casefold()).startswith(n))
    unit = bool(r.unit) and text.casefold().replace(" ", "").endswith(r.unit)
    named = any(len(n) >= 3 and text.casefold().startswith(n)                # "attempt_..." for an attempt
                for n in {*r.nouns, r.type_noun} - {""})
    return 2 * near + 2 * named + unit + said


# -- aggregates ------------------------------------------------------------------------------------------------------
def _count(r: Route, lines: list[ArchivedLine], scope: str, nearest, budget: evidence.Budget) -> Reply:
    covered = [(ln, ln.covers(r.roots)) for ln in budget.each(lines)]      # newest first, while the budget lasts
    bound = _bound(budget, [ln for ln, _ in covered])
    best = max((c for _, c in covered), default=0)
    counted = [ln for ln, c in covered if c == best]
    criteria = [*r.keys, *([f"type {r.alarm}"] if r.alarm else []),
                *(f"{root}*" for root in r.roots if best and any(ln.covers([root]) for ln in counted[:1]))]
    what = f", counting lines with {', '.join(criteria)}" if criteria else ", counting every line"
    n = len(counted)
    if not counted:                              # nothing to cite: not found (no answer without a citation)
        return Reply(r.kind, None, f"not found: no line {scope}{what}{bound}", (), () if budget.cut else nearest())
    if bound:                                    # a partial count: a lower bound, and the lines it was taken over
        return Reply(r.kind, f"at least {n}", f"at least {n} time{'s' if n != 1 else ''} {scope}{what}{bound}",
                     tuple(cite(ln) for ln in counted[:3]))
    text = f"{n} time{'s' if n != 1 else ''} {scope}{what}"
    return Reply(r.kind, str(n), text, tuple(cite(ln) for ln in counted[:3]))


def _values(r: Route, lines: list[ArchivedLine], scope: str, budget: evidence.Budget) -> Reply:
    """The most frequent or the distinct values over the lines of the best word coverage: each line's value is what a
    lookup would copy from it (`_options`: its one best span; a line whose spans tie gives none), so every value
    listed is a span of a line cited. Over the lines weighed before the budget ran out (newest first)."""
    covered = [(ln, ln.covers(r.roots)) for ln in budget.each(lines)]
    best = max((c for _, c in covered), default=0)
    lines = [ln for ln, c in covered if c == best]                          # newest first
    keys = {key_of(k) for k in r.keys}
    weighed: list[ArchivedLine] = []
    picked = []
    for ln in budget.each(lines):
        weighed.append(ln)
        if len((found := _options(r, ln, keys))[0]) == 1:
            picked.append((ln, found))
    bound = _bound(budget, weighed if len(weighed) < len(lines) else [ln for ln, _ in covered])
    tier = max((found[2] for _, found in picked), default=0)                 # of a kind asked, if any line has one
    newest: dict[str, tuple[str, ArchivedLine]] = {}
    counts: Counter = Counter()
    for ln, ((text,), _, their_tier) in picked:
        if their_tier == tier:
            counts[key_of(text)] += 1
            newest.setdefault(key_of(text), (text, ln))
    if not counts:
        return Reply(r.kind, None, f"not found: no matching line with a {r.type_noun or 'value'} {scope}{bound}",
                     (), tuple(cite(ln) for ln in lines[:3]))
    if r.op == "most":
        top = max(counts.values())
        key = next(k for k in newest if counts[k] == top)                    # ties: the newest
        text, line = newest[key]
        return Reply(r.kind, text, f"{text}, in {top} of {sum(counts.values())} matching lines {scope}{bound}; "
                                   f"newest: line #{line.seq} at {line.when}: {line.text}", (cite(line),))
    listed = [newest[k][0] for k in newest]                                  # newest first
    answer = ", ".join(listed)
    noun = f"{r.type_noun} values" if r.type_noun else "values"
    cited = {ln.seq: ln for _, ln in newest.values()}                        # every value listed stands on a line
    return Reply(r.kind, answer, f"{len(listed)} different {noun} {scope}{bound}, newest first: {answer}",
                 tuple(cite(ln) for ln in cited.values()))


# -- shared ------------------------------------------------------------------------------------------------------------
def _bound(budget: evidence.Budget, weighed: list[ArchivedLine]) -> str:
    """What an answer cut short by its budget stands on, to append to its text ("" when nothing was cut): the lines
    weighed, their seqs, and why no more were (serve.question_max_lines, serve.question_budget_s)."""
    if not budget.cut:
        return ""
    why = f"serve.question_max_lines ({budget.max_lines}) reached" if budget.cut == "lines" else \
        f"the question's budget (serve.question_budget_s, {budget.seconds:g} s) spent"
    seqs = [ln.seq for ln in weighed]
    over = f" (lines #{min(seqs)} to #{max(seqs)})" if seqs else ""
    return f"; only {len(weighed)} candidate line{'s' if len(weighed) != 1 else ''} weighed{over}, {why}: too " \
           f"broad, narrow it by a value or a time"


def _too_broad(r: Route, budget: evidence.Budget, scope: str) -> Reply:
    """No line weighed before the budget ran out: no answer (nothing to cite), and what would narrow the question."""
    return Reply(r.kind, None, f"not found {scope}{_bound(budget, [])}", ())


def _fits(line: ArchivedLine, r: Route) -> bool:
    """A line the question may stand on: of the alarm type asked, writing what it must, and not a header line (it
    names columns: no event of its own)."""
    return _alarm_ok(line, r.alarm) and _written(line, r) and not header_of(line.text)


def _alarm_ok(line: ArchivedLine, alarm: str) -> bool:
    """A TEP line of the alarm type asked (a recovery only when a recovery is asked)."""
    if not alarm:
        return True
    recovered = line.has("status", "nr")
    return any(recovered if a == "NR" else line.has("status", a.casefold()) and not recovered
               for a in alarm.split("|"))


def _written(line: ArchivedLine, r: Route) -> bool:
    """The line writes each quoted phrase, and each short number named with its noun right after that noun ("slot 9":
    not "child 9")."""
    text = line.text.casefold()
    if not all(p in text for p in r.phrases):
        return False
    for noun, value in r.pairs:
        if not any(key_of(v.text) == key_of(value) and (word := _word_before(line.text, v.start)) and
                   _names(stem(word), {noun}) for v in line.values):
            return False
    return True


def _word_before(text: str, end: int) -> str:
    """The last word before text[end:] ("port" of "... port 22"), read in the _NEAR characters before it: "" when
    none."""
    m = _BEFORE.search(text[max(0, end - _NEAR):end])
    return m[1] if m else ""


def _nearest(archive_path, question: str, budget: evidence.Budget) -> tuple[Citation, ...]:
    """The lines closest to the question (not citations), within what is left of its budget (none when spent)."""
    if budget.over():
        return ()
    return tuple(Citation(h.seq, h.time, h.text) for h in search(archive_path, question, k=3, watch=budget.watch))

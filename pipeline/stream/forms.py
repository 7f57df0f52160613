"""How an assessment is written: free text, constrained text, or a structured form filled field by field.

Owns the forms (`FORMS`), the structured form's fields (label, lead, token budget, who writes the value) and
`write`, which asks the engine for an assessment in the chosen form, in the scratch span after the question (the
caller marks and rolls back). `constrained` and `structured` answers cannot write an identifier that is not in view:
every token the model writes is drawn from the target constrained by a rule (pipeline/decode/rules.py) whose allowed
identifiers are those of the lines the model can see. In the structured form the model writes only what it adds
(what changed, what may follow); what the assessed lines state, their latest tags and their severity, is computed
from them (`stated_by`, pipeline/stream/severity.py) and written by the engine, and a field the model wrote that
repeats another is left out (`repeats`). `text_of` and `fields_of` read a written assessment (the output actor and
the serial replay). Never chooses what is in view or which lines are assessed, and never runs a model directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.config import ReplaySection
from pipeline.decode.rules import IdentifierRule, TokenTable, trim
from pipeline.decode.step import Stats
from pipeline.stream.prompts import Prompt, question_span
from pipeline.stream.severity import SEVERITIES, highest

FORMS = ("free", "constrained", "structured")
NO_ALARM = "none"
__all__ = ["FIELDS", "FORMS", "NO_ALARM", "SEVERITIES", "Field", "Stated", "Writer", "Written", "fields_of", "in_view",
           "repeats", "stated_by", "text_of", "view_start"]      # SEVERITIES: the values the form's severity takes


@dataclass(frozen=True)
class Field:
    name: str
    label: str              # written by the engine on a line of its own, before the value ("{entry}": the stream's
    lead: str               # word for a line); ... and the value's first words (a sentence's start), also the engine's
    budget: int             # the tokens its value may take, its newline included
    computed: bool = False  # the engine writes the value, computed from the assessed lines (`Stated`); else the model


# Measured on the TEP deadband logs (`eval-quality`, docs/stream-quality.md "Assessment forms"): the model (135M
# parameters) lists tags it has seen often (AIR001_1, AIR001_3, ...) unless it has just written the latest line:
# "Changed:" first, its lead " The latest alarm is" (the engine's words), and the model copies the quoted line, tag
# included (the triggering tag named in 151 of 151 assessments on 11 logs, against 78% with the tags first and a
# lead " The"); after a bare "Changed:" it writes dates or repeats the label. The same logs showed what it could not
# add: a severity of "low" in 100 of 100 assessments, an HH alarm included, and a "Summary" equal to "Changed": so
# the tags and the severity are computed from the lines, and the last field asks for what may follow instead.
FIELDS = (Field("changed", "Changed:", " The latest {entry} is", 32),
          Field("alarms", "Latest {entry} tags:", "", 32, computed=True),
          Field("severity", "Severity:", "", 6, computed=True),
          Field("next", "What may follow:", " The", 40))      # last: when it repeats another, nothing follows it
LATEST = " The latest {entry}: "
LATEST_TOKENS = 48          # the quoted line is cut to this many tokens (the question's room in the ring is fixed)
MAX_ALARMS = 3


@dataclass(frozen=True)
class Stated:
    """What the assessed lines state, computed by code: the engine writes it into the form, the model reads it."""
    tags: tuple[str, ...] = ()      # the identifiers of the latest lines, the newest line's first, at most MAX_ALARMS
    severity: str = ""              # the highest the lines state (pipeline/stream/severity.py); "" = none: left out


def stated_by(lines) -> Stated:
    """What the assessed `lines` state; lines: (identifiers, severity) of each, oldest first."""
    tags: list[str] = []
    for line_tags, _ in reversed(lines):
        tags += [t for t in line_tags if t not in tags]
    return Stated(tuple(tags[:MAX_ALARMS]), highest(severity for _, severity in lines))


def repeats(text: str, others) -> bool:
    """Does `text` repeat one of `others` (the same words, or the start of them, or they the start of it; case,
    spacing and closing punctuation aside)? An empty text repeats anything."""
    mine = _words(text)
    return any(mine.startswith(_words(o)) or _words(o).startswith(mine) for o in others if _words(o)) or not mine


def _words(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .,;:!")


@dataclass
class Written:
    ids: list[int]                              # the assessment as written (labels and values when structured)
    fields: dict[str, list[int]] | None         # structured: each field's value tokens (a field left out: absent)
    stats: Stats = field(default_factory=Stats)
    cut: bool = False                           # keep_going() said stop before the end: the caller asks again


def view_start(n: int, ask: int, scratch: int, window: int) -> int:
    """The first stream position every row of an assessment can see: the window of its last row (the stream ends at
    n; the question's `ask` tokens and the `scratch` it may write follow)."""
    return n + ask + scratch - window


def in_view(lines, n: int, ask: int, scratch: int, window: int) -> list[str]:
    """The identifiers every row of an assessment can see: those of the lines (first position, identifiers) whose
    tokens all lie at or after `view_start`."""
    oldest = view_start(n, ask, scratch, window)
    return sorted({t for first, tags in lines if first >= oldest for t in tags})


class Writer:
    """Writes assessments for one engine and tokenizer in one form, in one stream's words."""

    def __init__(self, tok, form: str, max_new_tokens: int, prompt: Prompt | str, question: str, form_question: str,
                 entry: str = ReplaySection.entry):
        """prompt: the stream's (pipeline/stream/prompts.py); entry: what one line of its log is called."""
        if form not in FORMS:
            raise ValueError(f"form {form!r}: one of {', '.join(FORMS)}")
        self.tok, self.form, self.max_new_tokens = tok, form, max_new_tokens
        self.prompt, self.question = prompt, form_question if form == "structured" else question
        self._ask = question_span(tok, prompt, [{"role": "user", "content": self.question}])
        self.latest = LATEST.format(entry=entry)
        self.stop_ids = frozenset(tok.stop_ids)
        self.table = TokenTable.of(tok) if form != "free" else None
        self.encode = lambda text: [int(t) for t in tok.encode(text)]
        self.labels = {f.name: (self.encode(f.label.format(entry=entry)), self.encode(f.lead.format(entry=entry)))
                       for f in FIELDS}
        self.newline = self.encode("\n")

    @classmethod
    def of(cls, tok, replay, form: str | None = None) -> "Writer":
        """The writer of a stream's [replay] section (pipeline/config.py ReplaySection), in its form or `form`."""
        return cls(tok, form or replay.form, replay.max_new_tokens, Prompt.of(replay), replay.question,
                   replay.form_question, replay.entry)

    def ask(self, latest: str = "") -> np.ndarray:
        """The question's span (pipeline/stream/prompts.py); the structured form quotes the `latest` line (its first
        LATEST_TOKENS tokens) after it."""
        if self.form != "structured" or not latest:
            return self._ask
        line = self.tok.decode(self.tok.encode(latest)[:LATEST_TOKENS])
        return question_span(self.tok, self.prompt, [{"role": "user", "content": self.question + self.latest + line}])

    def span(self) -> int:
        """The most tokens an assessment's span takes: its question and what it may write."""
        quoted = len(self.tok.encode(self.latest)) + LATEST_TOKENS + 2 if self.form == "structured" else 0
        return len(self._ask) + quoted + self.scratch()

    def scratch(self) -> int:
        """Tokens an assessment may write after its question."""
        if self.form != "structured":
            return self.max_new_tokens
        return sum(len(self.newline) + sum(map(len, self.labels[f.name])) + f.budget for f in FIELDS)

    def write(self, engine, ask: np.ndarray, allowed, params, keep_going=None, stated: Stated = Stated()) -> Written:
        """An assessment after the question `ask`. allowed: the identifiers in view (as the lines write them); stated:
        what the assessed lines state (`stated_by`), the structured form's computed fields."""
        if self.form != "structured":
            rule = IdentifierRule(allowed, self.table) if self.form == "constrained" else None
            res = engine.generate(ask, self.max_new_tokens, params, stop_ids=self.stop_ids, keep_going=keep_going,
                                  rule=rule)
            ids, cut = self._ended(res.token_ids, self.max_new_tokens, self.stop_ids, rule)
            return Written(ids, None, res.stats, cut)
        words = IdentifierRule(allowed, self.table, banned=self.stop_ids)
        ids, fields, stats, before = [], {}, Stats(), [int(t) for t in ask]
        for f in FIELDS:
            label, lead = self.labels[f.name]
            if f.computed:                          # the engine's: the model reads it before the fields after it
                value = self._computed(f, stated)
                if value is not None:
                    ids += label + value + self.newline
                    before = before + label + value + self.newline
                    fields[f.name] = value
                continue
            state = _after(words, lead)
            res = engine.generate(np.array(before + label + lead, np.int64), f.budget, params,
                                  stop_ids=self.table.newline_ids, keep_going=keep_going, rule=words,
                                  rule_state=state)
            value, cut = self._ended(res.token_ids, f.budget, self.table.newline_ids, words, state)
            ttft = stats.ttft_ms if stats.generated else res.stats.ttft_ms        # the form's first token's
            stats.add(res.stats)
            stats.ttft_ms = ttft
            if cut:
                return Written(ids, fields, stats, True)
            if len(value) < len(res.token_ids):        # an unfinished identifier trimmed: the cache forgets it too
                engine.rollback(engine.index.n - len(res.token_ids) + 1 + len(value))
            if repeats(text_of(self.tok, lead + value), [text_of(self.tok, v) for v in fields.values()]):
                continue                               # adds nothing (FIELDS: the last field, so nothing follows)
            ids += label + lead + value
            fields[f.name] = lead + value
            before = [] if value and value[-1] in self.table.newline_ids else list(self.newline)
            ids += before
        return Written(ids, fields, stats)

    def _computed(self, f: Field, stated: Stated) -> list[int] | None:
        """A computed field's value tokens (within its budget, whole tags only), or None: the lines state none."""
        if f.name == "severity":
            return self.encode(" " + stated.severity) if stated.severity else None
        value = self.encode(" " + NO_ALARM)
        for i in range(len(stated.tags), 0, -1):
            value = self.encode(" " + ", ".join(stated.tags[:i]))
            if len(value) + len(self.newline) <= f.budget:
                break
        return value

    @staticmethod
    def _ended(ids: list[int], budget: int, stops, rule, state: str = "") -> tuple[list[int], bool]:
        """(the tokens kept, cut): an answer that reached neither a stop nor its budget was cut by keep_going; one
        cut by its budget loses an identifier it left unfinished."""
        if ids and ids[-1] in stops:
            return list(ids), False
        if len(ids) < budget:
            return list(ids), True
        return (trim(rule, state, list(ids)) if rule is not None else list(ids)), False


def _after(rule, ids) -> str:
    """The rule's state after text the engine wrote (a field's lead)."""
    state = ""
    for t in ids:
        state = rule.advance(state, t)
    return state


def text_of(tok, ids) -> str:
    stops = set(tok.stop_ids)
    return tok.decode([int(t) for t in ids if int(t) not in stops]).strip()


def fields_of(tok, fields: dict) -> dict:
    """A structured assessment's fields as read: text, the alarms a list of tags."""
    out = {name: text_of(tok, ids) for name, ids in fields.items()}
    if "alarms" in out:
        out["alarms"] = [a for a in out["alarms"].split(", ") if a and a != NO_ALARM]
    return out

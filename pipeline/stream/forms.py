"""How an assessment is written: free text, constrained text, or a structured form filled field by field.

Owns the forms (`FORMS`), the structured form's fields (label, rule, token budget) and `write`, which asks the engine
for an assessment in the chosen form, in the scratch span after the question (the caller marks and rolls back).
`constrained` and `structured` answers cannot write an identifier that is not in view: every token is drawn from
the target constrained by a rule (pipeline/decode/rules.py) whose allowed identifiers are those of the lines the
model can see. `text_of` and `fields_of` read a written assessment (the output actor and the serial replay). Never
chooses what is in view and never runs a model directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.decode.rules import IdentifierRule, OptionsRule, TokenTable, trim
from pipeline.decode.step import Stats
from pipeline.stream.prompts import question_span

FORMS = ("free", "constrained", "structured")
SEVERITIES = ("low", "medium", "high", "critical")
NO_ALARM = "none"


@dataclass(frozen=True)
class Field:
    name: str
    label: str              # written by the engine on a line of its own, before the value
    lead: str               # ... and the value's first words (a sentence's start), also the engine's
    budget: int             # the tokens the model may write, its newline included


# Measured on the TEP deadband logs (`eval-quality`, docs/stream-quality.md "Assessment forms"): the model (135M
# parameters) lists tags it has seen often (AIR001_1, AIR001_3, ...) unless it has just written the latest line:
# "Changed:" first, its lead " The latest alarm is" (the engine's words), and the model copies the quoted line, tag
# included (the triggering tag named in 151 of 151 assessments on 11 logs, against 78% with the tags first and a
# lead " The"); after a bare "Changed:" it writes dates or repeats the label.
FIELDS = (Field("changed", "Changed:", " The latest alarm is", 32), Field("alarms", "Latest alarm tags:", "", 32),
          Field("severity", "Severity:", "", 6), Field("summary", "Summary:", " The", 40))
LATEST = " The latest alarm: "
LATEST_TOKENS = 48          # the quoted line is cut to this many tokens (the question's room in the ring is fixed)
MAX_ALARMS = 3


@dataclass
class Written:
    ids: list[int]                              # the assessment as written (labels and values when structured)
    fields: dict[str, list[int]] | None         # structured: each field's value tokens
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
    """Writes assessments for one engine and tokenizer in one form."""

    def __init__(self, tok, form: str, max_new_tokens: int, system: str, question: str, form_question: str):
        if form not in FORMS:
            raise ValueError(f"form {form!r}: one of {', '.join(FORMS)}")
        self.tok, self.form, self.max_new_tokens = tok, form, max_new_tokens
        self.system, self.question = system, form_question if form == "structured" else question
        self._ask = question_span(tok, system, [{"role": "user", "content": self.question}])
        self.stop_ids = frozenset(tok.stop_ids)
        self.table = TokenTable.of(tok) if form != "free" else None
        encode = lambda text: [int(t) for t in tok.encode(text)]      # noqa: E731
        self.labels = {f.name: (encode(f.label), encode(f.lead)) for f in FIELDS}
        self.newline = encode("\n")

    def ask(self, latest: str = "") -> np.ndarray:
        """The question's span (pipeline/stream/prompts.py); the structured form quotes the `latest` line (its first
        LATEST_TOKENS tokens) after it."""
        if self.form != "structured" or not latest:
            return self._ask
        line = self.tok.decode(self.tok.encode(latest)[:LATEST_TOKENS])
        return question_span(self.tok, self.system, [{"role": "user", "content": self.question + LATEST + line}])

    def span(self) -> int:
        """The most tokens an assessment's span takes: its question and what it may write."""
        quoted = len(self.tok.encode(LATEST)) + LATEST_TOKENS + 2 if self.form == "structured" else 0
        return len(self._ask) + quoted + self.scratch()

    def scratch(self) -> int:
        """Tokens an assessment may write after its question."""
        if self.form != "structured":
            return self.max_new_tokens
        return sum(len(self.newline) + sum(map(len, self.labels[f.name])) + f.budget for f in FIELDS)

    def write(self, engine, ask: np.ndarray, allowed, params, keep_going=None, fresh=()) -> Written:
        """An assessment after the question `ask`. allowed: the identifiers in view (as the lines write them); fresh:
        those of the lines since the last assessment, the structured form's alarms (all in view when none is)."""
        if self.form != "structured":
            rule = IdentifierRule(allowed, self.table) if self.form == "constrained" else None
            res = engine.generate(ask, self.max_new_tokens, params, stop_ids=self.stop_ids, keep_going=keep_going,
                                  rule=rule)
            ids, cut = self._ended(res.token_ids, self.max_new_tokens, self.stop_ids, rule)
            return Written(ids, None, res.stats, cut)
        words = IdentifierRule(allowed, self.table, banned=self.stop_ids)
        alarms = sorted(set(fresh) & set(allowed)) or sorted(set(allowed)) or [NO_ALARM]
        rules = {"severity": OptionsRule(SEVERITIES, self.table),
                 "alarms": OptionsRule(alarms, self.table, sep=", ", max_items=MAX_ALARMS),
                 "changed": words, "summary": words}
        ids, fields, stats, before = [], {}, Stats(), [int(t) for t in ask]
        for f in FIELDS:
            (label, lead), rule = self.labels[f.name], rules[f.name]
            state = _after(rule, lead)
            res = engine.generate(np.array(before + label + lead, np.int64), f.budget, params,
                                  stop_ids=self.table.newline_ids, keep_going=keep_going, rule=rule, rule_state=state)
            value, cut = self._ended(res.token_ids, f.budget, self.table.newline_ids, rule, state)
            ttft = stats.ttft_ms if fields else res.stats.ttft_ms            # the form's first token's
            stats.add(res.stats)
            stats.ttft_ms = ttft
            if cut:
                return Written(ids, fields, stats, True)
            if len(value) < len(res.token_ids):        # an unfinished identifier trimmed: the cache forgets it too
                engine.rollback(engine.index.n - len(res.token_ids) + 1 + len(value))
            ids += label + lead + value
            fields[f.name] = lead + value
            before = [] if value and value[-1] in self.table.newline_ids else self.newline
            ids += before
        return Written(ids, fields, stats)

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

"""A question framed: what the front sends the cache owner for an operator's question, or the reply it needs none for.

Owns the steps from a request's words to one of three outcomes (`Framing.frame`): the archive's reply, given alone
(`Direct`, serve.reader = "cited" or "spans": pipeline/serve/cited.py); a line's candidate spans for the model to score
whole (`Scoring`, pipeline/answer/score.py); or the token span the model answers (`ToModel`: the stream's system
prompt, older lines retrieved from the archive, the conversation, within serve.max_prompt_tokens, the conversation
kept first and the oldest retrieved lines dropped first). Every read of the archive is within the question's one
`Budget`. Never holds a slot, sends anything or keeps a request: the front (pipeline/serve/front.py) does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.answer import score
from pipeline.config import replay_of
from pipeline.serve import cited
from pipeline.serve.views import StreamView
from pipeline.stream.archive import search
from pipeline.stream.evidence import Budget
from pipeline.stream.prompts import Prompt, question_span


class RequestError(Exception):
    """A request refused before it reached the owner: `status` is the HTTP code, the message says why."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass(frozen=True)
class Direct:
    """The archive answered alone: nothing goes to the owner."""
    question: str
    reply: cited.Reply


@dataclass(frozen=True)
class Scoring:
    """The model scores a line's candidate spans whole (one Question with `spans`)."""
    question: str
    choice: cited.Choice
    ids: np.ndarray            # [p] the line and the question (no ring lines, no system prompt)
    spans: np.ndarray          # [c] the candidates " SPAN\n" end to end
    ends: np.ndarray           # [k] each candidate's end in `spans`


@dataclass(frozen=True)
class ToModel:
    """The model writes the answer over `span` (with a choice: picks one of its options, nothing else)."""
    question: str
    span: np.ndarray           # [p] the prompt the owner appends to its ring for the answer
    retrieved: list            # the archive's older lines in the span (the citations)
    read: cited.Choice | None  # the options the model picks from, when the cited reader found several
    max_tokens: int


class Framing:
    """How one front frames: its profile, the target's tokenizer, the span builder (`question_span`)."""

    def __init__(self, cfg, tok):
        self.cfg, self.serve, self.tok = cfg, cfg.serve, tok
        self.span = question_span

    def frame(self, view: StreamView, messages, prompt, max_tokens: int, budget: Budget) -> Direct | Scoring | ToModel:
        """Chat `messages` (or a raw `prompt` continuing the log) asked of `view`'s stream; RequestError when the
        request is malformed or its prompt does not fit."""
        if messages is None:
            if not isinstance(prompt, str) or not prompt:
                raise RequestError(400, "prompt must be a non-empty string")
            return self._fits(ToModel(prompt, self.tok.encode(prompt).astype(np.int32), [], None, max_tokens))
        s, tok = self.serve, self.tok
        question = check_messages(messages)
        words = Prompt.of(replay_of(self.cfg, view.name))          # the stream's own system prompt and log label
        # the conversation alone must fit before the archive is searched: a question too long costs no search
        span = self.span(tok, words, messages, [])
        read = None
        if s.reader in ("cited", "spans") and len(span) <= s.max_prompt_tokens:
            read = cited.read(view.archive_path, question, budget=budget, spans=s.reader == "spans",
                              model=s.span_model)
        if isinstance(read, cited.Choice) and read.prior:        # the model scores the line's candidates whole
            scoring = self._scoring(question, read)
            if not isinstance(scoring, str):
                return scoring
            read = cited.unscored(read, scoring)
        if isinstance(read, cited.Reply):
            return Direct(question, read)
        if isinstance(read, cited.Choice):                       # the model picks one of the line's spans
            messages = [*messages[:-1], {"role": "user", "content": f"{question}\nAnswer with one of: "
                                                                    f"{', '.join(read.options)}"}]
            span = self.span(tok, words, messages, [read.line.text])
            if len(span) > s.max_prompt_tokens:                  # a long line: the options alone, else no choice
                span = self.span(tok, words, messages, [])
            if len(span) > s.max_prompt_tokens:
                return Direct(question, cited.undecided(
                    read, f"the choice takes {len(span)} tokens, more than serve.max_prompt_tokens "
                          f"({s.max_prompt_tokens})"))
            max_tokens = min(max_tokens, max(len(tok.encode(o)) for o in read.options) + 2)
        retrieved = self.retrieve(question, view, budget) if len(span) <= s.max_prompt_tokens and read is None \
            else []
        if retrieved:
            span = self.span(tok, words, messages, [h.text for h in retrieved])
        while len(span) > s.max_prompt_tokens and retrieved:          # the conversation first, then old lines
            retrieved = retrieved[:-1]
            span = self.span(tok, words, messages, [h.text for h in retrieved])
        return self._fits(ToModel(question, span, retrieved, read, max_tokens))

    def retrieve(self, question: str, view: StreamView, budget: Budget) -> list:
        """Older lines about the question, from the stream's archive (none of those still inside its window): the
        free reader's, for the model to write over; within what is left of the question's budget (a search it
        interrupts retrieves nothing)."""
        if not self.serve.retrieve or not view.archive_path:
            return []
        return search(view.archive_path, question, self.serve.retrieve, before_seq=view.window_from_seq,
                      watch=budget.watch)

    def _scoring(self, question: str, choice: cited.Choice) -> Scoring | str:
        """A scoring choice's prompt (pipeline/answer/score.py: the line and the question, no ring lines, no system
        prompt) and its candidates " SPAN\\n" end to end with their ends; or why the model is not asked (too long
        for the scratch span: serve.max_prompt_tokens + serve.max_answer_tokens)."""
        ids, spans = score.tokens(self.tok, choice.line.text, question, choice.options)
        if why := score.too_long(ids, spans, self.serve.max_prompt_tokens + self.serve.max_answer_tokens):
            return why
        return Scoring(question, choice, ids, np.concatenate(spans).astype(np.int32),
                       np.cumsum([len(t) for t in spans]).astype(np.int32))

    def _fits(self, framed: ToModel) -> ToModel:
        if len(framed.span) > self.serve.max_prompt_tokens:
            raise RequestError(400, f"the prompt takes {len(framed.span)} tokens; this server takes at most "
                                    f"{self.serve.max_prompt_tokens} (serve.max_prompt_tokens)",
                               "context_length_exceeded")
        return framed


def check_messages(messages) -> str:
    """The question (the last user message) of a well-formed chat; RequestError otherwise. The operators' system
    messages are dropped: the gateway's own system prompt is in the sinks."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                not isinstance(m.get("content"), str):
            raise RequestError(400, f"messages[{i}] must be {{\"role\": system|user|assistant, \"content\": string}}")
    if messages[-1]["role"] != "user":
        raise RequestError(400, "the last message must be the user's question")
    messages[:] = [m for m in messages if m["role"] != "system"]
    return messages[-1]["content"]

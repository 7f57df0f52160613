"""What the model is shown around the stream: the chat frame the ring is built in, and an operator's question span.

Owns the token layout and a stream's `Prompt` (what it says it is: its system turn, and the label its log turn opens
with, "Alarm log:" for the TEP console, from its profile). The sinks hold the system turn and an open user turn
("Alarm log:\n"); stream lines continue that turn in the ring. A question (an analysis's or an operator's) is a
scratch span after the stream: it closes the log turn, carries the conversation (retrieved older lines first, in the
last user turn), and opens the assistant's turn. Log text and operator text are data: the tokenizer's `render_chat`
never lets their content become control tokens. Never runs a model and never decides what is retrieved.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from pipeline.config import ReplaySection

RETRIEVED_HEAD = "Earlier lines of the log that may be relevant:\n"


@dataclass(frozen=True)
class Prompt:
    """A stream's own words in its sinks: the system turn, and the label that opens its log's user turn."""
    system: str
    label: str = ReplaySection.log_label

    @classmethod
    def of(cls, replay: ReplaySection) -> "Prompt":
        return cls(replay.system_prompt, replay.log_label)

    @property
    def log_turn(self) -> str:
        return self.label + "\n"


def chat_frame(tok, prompt: Prompt | str, question: str) -> tuple[np.ndarray, np.ndarray]:
    """(head, ask): head opens a user turn after the system turn ("...<|im_start|>user\nAlarm log:\n"), to be
    continued by log lines; ask closes that turn, asks `question` and opens the assistant's turn."""
    return stream_head(tok, prompt), question_span(tok, prompt, [{"role": "user", "content": question}])


def stream_head(tok, prompt: Prompt | str) -> np.ndarray:
    """The sinks' tokens: the system turn and the open log turn. prompt: a stream's `Prompt` (a bare string is a
    system prompt under the default label)."""
    closed, open_len = _log_turn(tok, _prompt(prompt))
    return closed[:open_len].copy()


def question_span(tok, prompt: Prompt | str, messages: list[dict], retrieved: list[str] = ()) -> np.ndarray:
    """The scratch span after the stream of `prompt`'s head: close the log turn, then `messages` (user and assistant
    turns, the last a user turn), with `retrieved` lines leading the last user turn, then the assistant's turn
    opens."""
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("the conversation must end with a user message")
    prompt = _prompt(prompt)
    turns = [dict(m) for m in messages]
    if retrieved:
        turns[-1]["content"] = RETRIEVED_HEAD + "".join(line + "\n" for line in retrieved) + "\n" + turns[-1]["content"]
    closed, open_len = _log_turn(tok, prompt)
    asked = tok.render_chat([{"role": "system", "content": prompt.system},
                             {"role": "user", "content": prompt.log_turn}, *turns], add_generation_prompt=True)
    return np.concatenate([closed[open_len:], asked[len(closed):]]).astype(np.int32)


def _prompt(prompt: Prompt | str) -> Prompt:
    return Prompt(prompt) if isinstance(prompt, str) else prompt


@functools.lru_cache(maxsize=16)
def _log_turn(tok, prompt: Prompt) -> tuple[np.ndarray, int]:
    """The system turn plus the closed log turn, and where the log turn's content ends (the ring continues there).
    The same for every question of a stream, so rendered once (callers never write into the array)."""
    turns = [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.log_turn}]
    closed = tok.render_chat(turns, add_generation_prompt=False)
    longer = tok.render_chat([turns[0], {"role": "user", "content": prompt.log_turn + "zz"}],
                             add_generation_prompt=False)
    return closed, next(i for i, (a, b) in enumerate(zip(closed, longer)) if a != b)

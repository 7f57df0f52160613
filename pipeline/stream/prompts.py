"""What the model is shown around the stream: the chat frame the ring is built in, and an operator's question span.

Owns the token layout. The sinks hold the system turn and an open user turn ("Alarm log:"); stream lines continue that
turn in the ring. A question (an analysis's or an operator's) is a scratch span after the stream: it closes the log
turn, carries the conversation (retrieved older lines first, in the last user turn), and opens the assistant's turn.
Log text and operator text are data: the tokenizer's `render_chat` never lets their content become control tokens.
Never runs a model and never decides what is retrieved.
"""
from __future__ import annotations

import functools

import numpy as np

LOG_TURN = "Alarm log:\n"
RETRIEVED_HEAD = "Earlier lines of the log that may be relevant:\n"


def chat_frame(tok, system: str, question: str) -> tuple[np.ndarray, np.ndarray]:
    """(head, ask): head opens a user turn after the system turn ("...<|im_start|>user\nAlarm log:\n"), to be
    continued by log lines; ask closes that turn, asks `question` and opens the assistant's turn."""
    return stream_head(tok, system), question_span(tok, system, [{"role": "user", "content": question}])


def stream_head(tok, system: str) -> np.ndarray:
    closed, open_len = _log_turn(tok, system)
    return closed[:open_len].copy()


def question_span(tok, system: str, messages: list[dict], retrieved: list[str] = ()) -> np.ndarray:
    """The scratch span after the stream: close the log turn, then `messages` (user and assistant turns, the last a
    user turn), with `retrieved` lines leading the last user turn, then the assistant's turn opens."""
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("the conversation must end with a user message")
    turns = [dict(m) for m in messages]
    if retrieved:
        turns[-1]["content"] = RETRIEVED_HEAD + "".join(line + "\n" for line in retrieved) + "\n" + turns[-1]["content"]
    closed, open_len = _log_turn(tok, system)
    asked = tok.render_chat([{"role": "system", "content": system}, {"role": "user", "content": LOG_TURN}, *turns],
                            add_generation_prompt=True)
    return np.concatenate([closed[open_len:], asked[len(closed):]]).astype(np.int32)


@functools.lru_cache(maxsize=8)
def _log_turn(tok, system: str) -> tuple[np.ndarray, int]:
    """The system turn plus the closed log turn, and where the log turn's content ends (the ring continues there).
    The same for every question of a run, so rendered once (callers never write into the array)."""
    turns = [{"role": "system", "content": system}, {"role": "user", "content": LOG_TURN}]
    closed = tok.render_chat(turns, add_generation_prompt=False)
    longer = tok.render_chat([turns[0], {"role": "user", "content": LOG_TURN + "zz"}], add_generation_prompt=False)
    return closed, next(i for i, (a, b) in enumerate(zip(closed, longer)) if a != b)

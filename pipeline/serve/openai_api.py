"""OpenAI's shapes: what a chat or completion request asks (`question_of`) and the replies the HTTP face writes for it
(`whole`, `delta_chunk`, `last_chunk`), with ringspec's own fields beside OpenAI's (`meta`), which the zmq face's
replies carry too.

Owns the JSON of the OpenAI-compatible API: object kinds, choices, deltas, usage, the model name a stream answers to
("ringspec", or "ringspec/NAME" with several). Never reads a socket or a request's bytes (pipeline/serve/http_api.py
does) and never decides an answer (pipeline/serve/front.py does).
"""
from __future__ import annotations

from pipeline.serve.framing import RequestError

MODEL_NAME = "ringspec"


def question_of(body: dict, chat: bool) -> dict:
    """The front's `ask` keywords for a parsed request body: the chat messages or the prompt, max_tokens,
    deadline_s, stop strings, and the stream the model names (several streams: ringspec/NAME; OpenAI's own "stream"
    is the SSE flag). RequestError for stop strings OpenAI would refuse."""
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise RequestError(400, "stop must be a string or a list of at most 4 strings")
    model = body.get("model")
    stream = model[len(MODEL_NAME) + 1:] if isinstance(model, str) and model.startswith(f"{MODEL_NAME}/") else None
    if chat:
        words = {"messages": body.get("messages")}
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        words = {"prompt": prompt if isinstance(prompt, str) else None}
    return {**words, "max_tokens": body.get("max_tokens"), "deadline_s": body.get("deadline_s"),
            "stop": tuple(stop), "stream": stream}


def models(streams) -> dict:
    """/v1/models: the model a stream answers to, one per stream when there are several (named)."""
    names = [f"{MODEL_NAME}/{n}" for n in streams if n] or [MODEL_NAME]
    return {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "ringspec", "created": 0}
                                       for n in names]}


def model_of(answer) -> str:
    """The model name an answer's stream answers to."""
    return f"{MODEL_NAME}/{answer.stream}" if getattr(answer, "stream", "") else MODEL_NAME


def whole(answer, info: dict, chat: bool, created: int) -> dict:
    """A whole (not streamed) reply: one choice with the answer's text, its usage and ringspec's fields."""
    choice = {"index": 0, "finish_reason": info["finish_reason"], "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": answer.text}} if chat else {"text": answer.text})
    return {"id": answer.id, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model_of(answer), "choices": [choice], "usage": usage(info), "ringspec": meta(info)}


def delta_chunk(answer, text: str, chat: bool, created: int, first: bool) -> dict:
    """A streamed piece of the answer's text (a chat's first names the assistant's role)."""
    delta = {"role": "assistant", "content": text} if first and chat else {"content": text}
    choice = {"index": 0, "delta": delta, "finish_reason": None} if chat else \
        {"index": 0, "text": text, "finish_reason": None}
    return _chunk(answer, chat, created, choice)


def last_chunk(answer, info: dict, chat: bool, created: int) -> dict:
    """A streamed answer's end: its finish reason, usage and ringspec's fields (an error: OpenAI's error object)."""
    if info["error"]:
        return {"error": {"message": info["error"], "type": "timeout"}}
    choice = {"index": 0, "delta": {}, "finish_reason": info["finish_reason"]} if chat else \
        {"index": 0, "text": "", "finish_reason": info["finish_reason"]}
    return {**_chunk(answer, chat, created, choice), "usage": usage(info), "ringspec": meta(info)}


def _chunk(answer, chat: bool, created: int, choice: dict) -> dict:
    return {"id": answer.id, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model_of(answer), "choices": [choice]}


def usage(info: dict) -> dict:
    p, c = info["prompt_tokens"], info["completion_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def meta(info: dict) -> dict:
    """ringspec's own fields beside OpenAI's: the answer (a span copied from a cited line, a computed value, or None:
    not found, or written freely by the model), its route (lookup, aggregate, other), the citations the server wrote
    ([{seq, time, text}]: the lines it stands on, or those retrieved for the model), the nearest lines when not found,
    whether the model was asked (False: the archive answered alone), and the timings."""
    st = info.get("stats", {})
    return {"answer": info["answer"], "route": info["route"], "citations": info["citations"],
            "model_call": info.get("model_call", True),
            "nearest": info["nearest"], "frame_ms": info["frame_ms"], "queued_ms": info["queued_ms"],
            "queued_blocks": info["queued_blocks"], "prefill_ms": st.get("ttft_ms"), "ttft_ms": info["ttft_ms"],
            "total_ms": info["total_ms"], "tokens_per_s": st.get("tokens_per_s"),
            "accepted_per_verify": st.get("accepted_per_verify")}

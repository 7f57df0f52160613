"""The zmq face of the front: a ROUTER socket taking msgpack questions, and the `ask` client for it.

Owns the message shapes. A client (DEALER) sends one msgpack map per question:
    {"question": str, "max_tokens": int?, "deadline_s": float?, "stream": str (of several)?, "key": str (when the
     server has keys)}
and receives, in order, maps {"id", "delta": str} as the answer's tokens are committed, then one final map
{"id", "done": true, "text", "finish_reason", "usage", "ringspec": {...}} or {"error": str, "code": int}.
Several clients and several questions per client may be in flight. Who asks is the key's operator, or the client's
socket when the server has no keys (a request's own fields never name it). Messages over serve.max_body_bytes are
not read: zmq drops the connection that sent one. Every other message gets a reply: 400 when it is not a readable
request, the front's 4xx/429/503 when refused, 500 naming the error's type when handling it failed (counted as
internal_errors); a reply msgpack cannot write is dropped and counted. Never touches a model or a channel.

`run_ask` is the `ask` verb: the client, the answer streamed to stdout as it comes, and `AskReport`.

Threads: the socket lives in one thread; each request's answer is read in a thread of its own that hands frames
back through a queue (zmq sockets are not thread-safe).
"""
from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass
from typing import ClassVar

import msgpack
import zmq

from pipeline.report import Report
from pipeline.serve.auth import Keys, env_key
from pipeline.serve.front import Front, RequestError

POLL_MS = 5


class ZmqFront:
    def __init__(self, front: Front, endpoint: str, keys: Keys = Keys()):
        self.front, self.endpoint, self.keys = front, endpoint, keys
        self._out: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="zmq")
        self._thread.start()
        self._ready.wait(5.0)
        if self.error:
            raise self.error

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)     # a reply to a client that left is dropped, not an error
        sock.setsockopt(zmq.MAXMSGSIZE, self.front.serve.max_body_bytes)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            self.error = OSError(f"zmq: cannot bind {self.endpoint}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                if sock.poll(POLL_MS, zmq.POLLIN):
                    frames = sock.recv_multipart()
                    try:
                        self._take(frames[0], frames[-1])
                    except Exception as exc:          # noqa: BLE001 -- one request fails, this thread goes on
                        self._failed(frames[0], None, exc)
                while True:
                    try:
                        who, reply = self._out.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        sock.send_multipart([who, msgpack.packb(reply)])
                    except (TypeError, ValueError, OverflowError, zmq.ZMQError) as exc:   # one reply lost, counted
                        self.front.counts["zmq_replies_dropped"] += 1
                        print(f"ringspec: zmq: reply to {who.hex()} dropped: {type(exc).__name__}: {exc}",
                              file=sys.stderr, flush=True)
        finally:
            sock.close()

    def _take(self, who: bytes, payload: bytes) -> None:
        """One message: a precise error reply (400 unreadable, 4xx/503 refused) or a relay thread for its answer;
        anything unexpected raised here is the caller's 500 (`_failed`)."""
        try:
            req = msgpack.unpackb(payload, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:    # bytes, UTF-8, depth, non-string map keys
            self._out.put((who, {"error": f"not a msgpack request: {type(exc).__name__}: {exc}", "code": 400}))
            return
        try:
            if not isinstance(req, dict) or not isinstance(req.get("question"), str) or not req["question"].strip():
                raise RequestError(400, "expected a msgpack map with a non-empty string \"question\"")
            client = self._operator(req, who)
            answer = self.front.ask(client, messages=[{"role": "user", "content": req["question"]}],
                                    max_tokens=req.get("max_tokens"), deadline_s=req.get("deadline_s"),
                                    stream=req.get("stream"))
        except RequestError as exc:
            self._out.put((who, {"error": str(exc), "code": exc.status}))
            return
        threading.Thread(target=self._relay_or_fail, args=(who, answer), daemon=True).start()

    def _failed(self, who: bytes, answer_id: str | None, exc: BaseException) -> None:
        """A request that failed unexpectedly (a bug, the archive locked): its asker gets a 500 naming the error's
        type, the failure is counted and logged, and every other request goes on."""
        self.front.counts["internal_errors"] += 1
        print(f"ringspec: zmq: request from {who.hex()}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        self._out.put((who, {**({"id": answer_id} if answer_id else {}),
                             "error": f"internal error: {type(exc).__name__}: {exc}", "code": 500}))

    def _relay_or_fail(self, who: bytes, answer) -> None:
        try:
            self._relay(who, answer)
        except Exception as exc:                      # noqa: BLE001 -- the asker hears why rather than nothing
            self._failed(who, answer.id, exc)

    def _operator(self, req: dict, who: bytes) -> str:
        if not self.keys.required:
            return f"zmq:{who.hex()}"
        name = self.keys.identify(req["key"]) if isinstance(req.get("key"), str) else None
        if name is None:
            raise RequestError(401, "missing or wrong API key (the request's \"key\")", "authentication_error")
        return name

    def _relay(self, who: bytes, answer) -> None:
        while True:
            try:
                what, data = answer.items.get(timeout=self.front.serve.deadline_s + 30.0)
            except queue.Empty:
                self.front.cancel(answer, "client_disconnects")
                self._out.put((who, {"id": answer.id, "error": "no answer in time", "code": 504}))
                return
            if what == "delta":
                self._out.put((who, {"id": answer.id, "delta": data}))
                continue
            if data["error"]:
                self._out.put((who, {"id": answer.id, "error": data["error"], "code": 504}))
            else:
                self._out.put((who, {"id": answer.id, "done": True, "text": answer.text,
                                     "finish_reason": data["finish_reason"],
                                     "usage": {"prompt_tokens": data["prompt_tokens"],
                                               "completion_tokens": data["completion_tokens"]},
                                     "ringspec": {**{k: data[k] for k in ("answer", "route", "citations", "nearest",
                                                                          "queued_ms", "ttft_ms", "total_ms")},
                                                  "model_call": data.get("model_call", True)}}))
            return


def ask(endpoint: str, question: str, max_tokens: int | None = None, timeout_s: float = 120.0, on_delta=None,
        key: str | None = None, log_stream: str | None = None) -> dict:
    """The client: send one question, hand each delta to on_delta(text), return the final map (or raise).
    key: the operator's (default RINGSPEC_API_KEY), for a server that has keys; log_stream: the stream asked, of a
    server that watches several."""

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        req = {"question": question}
        if max_tokens is not None:
            req["max_tokens"] = max_tokens
        if log_stream is not None:
            req["stream"] = log_stream
        key = key or env_key()
        if key:
            req["key"] = key
        sock.send(msgpack.packb(req))
        while True:
            if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
                raise TimeoutError(f"no reply from {endpoint} within {timeout_s:.0f} s (is `run.py serve` running "
                                   f"with --zmq {endpoint}?)")
            reply = msgpack.unpackb(sock.recv(), raw=False)
            if "error" in reply:
                raise RuntimeError(f"{endpoint}: {reply['error']} (code {reply.get('code')})")
            if "delta" in reply:
                if on_delta:
                    on_delta(reply["delta"])
                continue
            return reply
    finally:
        sock.close()


@dataclass
class AskReport(Report):
    """The final reply of `ask`; its text (streamed already) ends with a newline, the retrieved lines and timings go
    to stderr."""
    indent: ClassVar[int | None] = 2

    def text(self) -> str:
        return ""

    def notes(self) -> str:
        meta = self.data.get("ringspec", {})
        lines = [f"  [{meta.get('route', 'other')}: answer {meta.get('answer')!r}]"]
        lines += [f"  [cited: line #{line['seq']} at {line['time'] or '?'}] {line['text']}"
                  for line in meta.get("citations", [])]
        lines += [f"  [nearest: line #{line['seq']} at {line['time'] or '?'}] {line['text']}"
                  for line in meta.get("nearest", [])]
        ttft = meta.get("ttft_ms")
        lines.append(f"({self.data['usage']['completion_tokens']} tokens, {self.data['finish_reason']}, ttft "
                     f"{'-' if ttft is None else f'{ttft:.0f}'} ms, total {meta.get('total_ms', 0):.0f} ms)")
        return "\n".join(lines)


def run_ask(endpoint: str, question: str, max_tokens: int | None = None, timeout_s: float = 120.0,
            stream: bool = True, log_stream: str | None = None) -> AskReport:
    """Ask a running `serve` a question over zmq: the answer streams to stdout as it is decoded, then the retrieved
    older lines and the timings go to stderr.

    stream False: nothing is written while waiting (--json prints the final reply instead); log_stream: the stream
    asked (--stream NAME), of a server that watches several."""

    def show(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    return AskReport(ask(endpoint, question, max_tokens, timeout_s, on_delta=show if stream else None,
                         log_stream=log_stream))

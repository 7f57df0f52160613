"""The operators' front, inside the output actor: requests in flight and their answers.

Owns what the interfaces (HTTP in `pipeline/serve/http_api.py`, zmq in `pipeline/serve/zmq_api.py`) share: a question
becomes a request to the cache owner (admitted within serve.max_waiting and its operator's share of it, its slot held
from before the archive is read until its answer ends, an answer the archive gives alone included; framed within the
question's budget by pipeline/serve/framing.py, a deadline), and the owner's answer events become text deltas for
whoever asked. With serve.reader = "cited" (pipeline/serve/cited.py) a lookup or an aggregate is answered here from
the archive: directly, through the same deltas and end as a model's answer but without queueing on the owner, or,
when several spans of a line fit, by the model choosing one under an options rule (its pick is not streamed; the
reply written from it is). Every end carries `route`, `answer` and `citations`. Also keeps the request counts and
latencies /metrics shows; what it shows of each stream (its tail, analyses, the owner's latest status) and the
consoles' feed are pipeline/serve/views.py's. Never runs a model and never touches the cache: the owner decides when
a question is answered.

Several streams (one pipeline, one target: pipeline/launch/plan.py): each has its own owner, question channel and
archive, and its own view (`StreamView`); a request names its stream (the model `ringspec/NAME` over HTTP,
`stream` over zmq), and what the console and /metrics show is per stream. With one stream a request names none. At a
site (streams on several nodes) the front is in the site actor (actors/site.py), a stream's channel is its node's
link (pipeline/serve/site_link.py), and every series is labelled with the stream's node too.

Threads: the interfaces call `ask`/`cancel` from their own threads; the output actor's event loop calls `on_event`.
Each channel to an owner has one producer, so sends (`Question`, `Cancel`: pipeline/messages.py) go through a lock.
"""
from __future__ import annotations

import itertools
import os
import queue
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from models.tokenizer import StreamDecoder
from pipeline.messages import Answer as AnswerEvent  # `Answer` here is a request's answer as it arrives
from pipeline.messages import AnswerDelta, Cancel, Question, Status, send
from pipeline.decode.rules import options_spec
from pipeline.serve import cited
from pipeline.serve.framing import Direct, Framing, RequestError, Scoring
from pipeline.serve.views import Feed, StreamView, resident_bytes
from pipeline.stream.evidence import Budget

LATENCIES_KEPT = 1000       # recent requests whose latencies /metrics summarises


@dataclass
class Answer:
    """One request's answer as it arrives: `items` yields ("delta", text) and finally ("done", info)."""
    id: str
    client: str
    question: str
    prompt_tokens: int
    citations: list                                   # [{"seq", "time", "text"}]: the lines the answer stands on
    t_request: float                                  # monotonic, when the front took it
    stop_strings: tuple = ()
    frame_ms: float = 0.0                             # retrieval, framing and tokenizing before it was sent
    items: queue.Queue = field(default_factory=queue.Queue)
    decoder: object = None                            # a StreamDecoder: the answer's text, token by token
    decoded: str = ""                                 # everything decoded so far (before a stop string's cut)
    text: str = ""                                    # what was handed to the asker
    t_first: float | None = None
    finished: bool = False
    stopped_by_string: bool = False
    stream: str = ""                                  # the stream it was asked of ("" with one)
    route: str = "other"                              # lookup | aggregate | other (pipeline/serve/route.py)
    answer: str | None = None                         # the span copied or the value computed; None: not found/free
    nearest: list = field(default_factory=list)       # not found: the closest lines (not citations)
    choice: object = None                             # a cited.Choice the model is picking an option of


class Front:
    def __init__(self, cfg, tok, streams: list[tuple], pids_files: str | list[str] | None = None,
                 restarts: dict | None = None):
        """streams: (name, question channel, archive path[, node]) per stream, in the pipeline's order ("" for one);
        pids_files: where the launcher lists the actors' pids, one file per node group."""
        self.cfg, self.serve, self.tok = cfg, cfg.serve, tok
        self.views = {st[0]: StreamView(*st) for st in streams}
        self.pids_files = [pids_files] if isinstance(pids_files, str) else list(pids_files or ())
        self.restarts = dict(restarts or {})          # {actor: restarts of the pipeline after its death}, this run
        self.framing = Framing(cfg, tok)              # a question's words to what the owner is sent
        self.stops = set(tok.stop_ids)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.answers: dict[str, Answer] = {}
        self.gone: dict[str, Answer] = {}             # cancelled by their askers, until the owner's Answer for each
        self.direct: deque = deque()                  # (stream, record) of answers the archive gave alone, to journal
        self.reading: dict[int, str] = {}             # the clients of questions being framed or read from the archive
        self._tickets = itertools.count(1)            # (and answered directly), by ticket: each holds a slot
        self.counts: Counter = Counter()               # requests by (endpoint, code), disconnects, dropped events
        self.feed = Feed(self.counts)                 # the consoles following /v1/events
        self.ttft_ms: deque = deque(maxlen=LATENCIES_KEPT)
        self.total_ms: deque = deque(maxlen=LATENCIES_KEPT)
        self.tokens_per_s: deque = deque(maxlen=LATENCIES_KEPT)

    @property
    def several(self) -> bool:
        return len(self.views) > 1

    def view(self, stream: str | None = None) -> StreamView:
        """The stream a request names (None: the only one); RequestError when it names none of them."""
        if stream is None:
            if self.several:
                raise RequestError(400, f"this server watches {len(self.views)} streams: name one as the model "
                                        f"ringspec/NAME (\"stream\" over zmq), NAME one of {', '.join(self.views)}")
            return next(iter(self.views.values()))
        if not isinstance(stream, str) or stream not in self.views:
            raise RequestError(404 if isinstance(stream, str) else 400,
                               f"no stream {stream!r} here (streams: {', '.join(self.views) or 'the one unnamed'})",
                               "stream_not_found")
        return self.views[stream]

    # -- from the interfaces -----------------------------------------------------------------------------------------
    def ask(self, client: str, messages: list[dict] | None = None, prompt: str | None = None,
            max_tokens: int | None = None, deadline_s: float | None = None, stop=(), stream: str | None = None
            ) -> Answer:
        """Frame, bound and send a question (chat `messages`, or a raw `prompt` continuing the log) to `stream`'s
        owner (None: the only stream); RequestError when it cannot be taken."""
        s = self.serve
        view = self.view(stream)
        max_tokens = s.max_answer_tokens if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= \
                s.max_answer_tokens:
            raise RequestError(400, f"max_tokens must be an integer in 1..{s.max_answer_tokens}, got {max_tokens!r}")
        deadline_s = s.deadline_s if deadline_s is None else deadline_s
        if not isinstance(deadline_s, (int, float)) or isinstance(deadline_s, bool) or not 0 < deadline_s <= \
                s.deadline_s:
            raise RequestError(400, f"deadline_s must be a number in (0, {s.deadline_s:g}], got {deadline_s!r}")
        with self._lock:                              # a refusal costs no framing and no search
            self._admit(client)
            ticket = next(self._tickets)
            self.reading[ticket] = client             # its slot, held from here: the archive is read within it
        try:
            return self._ask(ticket, client, view, messages, prompt, max_tokens, deadline_s, stop)
        finally:
            with self._lock:                          # refused, or answered directly (finished): the slot is free
                self.reading.pop(ticket, None)

    def _ask(self, ticket: int, client: str, view: StreamView, messages, prompt, max_tokens: int, deadline_s: float,
             stop) -> Answer:
        """`ask` within the slot it holds: framing (the archive read within the question's budget), then a direct
        answer finished here, or the question sent."""
        s = self.serve
        t0 = time.perf_counter()
        framed = self.framing.frame(view, messages, prompt, max_tokens,
                                    Budget(s.question_budget_s, s.question_max_lines))   # the archive's reads, whole
        if isinstance(framed, Direct):
            return self._direct(client, framed.question, framed.reply, view, t0)
        if isinstance(framed, Scoring):
            return self._send_scoring(ticket, client, view, framed, deadline_s, t0)
        read = framed.read
        with self._lock:                              # the slot `ask` took is this answer's from here
            answer = Answer(f"q{os.getpid()}-{next(self._ids)}", client, framed.question, len(framed.span),
                            [_cited(h.seq, h.time, h.text) for h in framed.retrieved], time.monotonic(), tuple(stop),
                            frame_ms=(time.perf_counter() - t0) * 1e3, decoder=StreamDecoder(self.tok),
                            stream=view.name, choice=read)
            if read is not None:
                answer.route = read.routed.kind
            rule = None if read is None else options_spec(read.options, lead="", end="\n")
            self._hand_over(ticket, view, answer, Question(id=answer.id, client=client, max_tokens=framed.max_tokens,
                                                           deadline_s=float(deadline_s), rule=rule,
                                                           ids=np.asarray(framed.span, np.int32)))
        return answer

    def _hand_over(self, ticket: int, view: StreamView, answer: Answer, question: Question) -> None:
        """`question` sent to the stream's cache owner (503 when it takes none within 5 s); from here the slot
        `ask` took is `answer`'s (counted once). Called holding the lock."""
        try:
            send(view.asks, question, timeout=5.0)
        except TimeoutError as exc:
            why = str(exc) if view.node is not None else \
                "the cache owner takes no questions right now; retry shortly"
            raise RequestError(503, why, "server_busy") from None
        self.answers[answer.id] = answer
        self.reading.pop(ticket)

    def _send_scoring(self, ticket: int, client: str, view: StreamView, framed: Scoring, deadline_s: float,
                      t0: float) -> Answer:
        """The scoring question on its way to the cache owner (pipeline/serve/answers.py `_score`); its Answer event
        carries the scores, which `cited.scored` turns into the reply."""
        choice = framed.choice
        with self._lock:
            answer = Answer(f"q{os.getpid()}-{next(self._ids)}", client, framed.question, len(framed.ids), [],
                            time.monotonic(), frame_ms=(time.perf_counter() - t0) * 1e3,
                            decoder=StreamDecoder(self.tok), stream=view.name, choice=choice,
                            route=choice.routed.kind)
            self._hand_over(ticket, view, answer, Question(id=answer.id, client=client, max_tokens=1,
                                                           deadline_s=float(deadline_s), ids=framed.ids,
                                                           spans=framed.spans, span_ends=framed.ends))
        return answer

    def _direct(self, client: str, question: str, reply, view: StreamView, t0: float) -> Answer:
        """A reply the archive gave without the model: its text as deltas (word by word, as a model's would come),
        then its end, at once; nothing is queued on the owner."""
        now = time.monotonic()
        answer = Answer(f"q{os.getpid()}-{next(self._ids)}", client, question, 0, [], now,
                        frame_ms=(time.perf_counter() - t0) * 1e3, stream=view.name, t_first=now)
        self._finish(answer, reply)
        info = self._info(answer, error=None, finish_reason="stop", prompt_tokens=0, model_call=False,
                          completion_tokens=len(self.tok.encode(answer.text)), queued_ms=0.0, queued_blocks=0,
                          stats={}, now=time.monotonic())
        answer.finished = True
        answer.items.put(("done", info))
        self.direct.append((view.name, _record(AnswerEvent.kind, answer, info)))
        self.counts["answers_direct"] += 1
        self.ttft_ms.append(info["ttft_ms"])
        self.total_ms.append(info["total_ms"])
        return answer

    def take_direct(self) -> list[tuple[str, dict]]:
        """The (stream, record) of each answer the archive gave alone since the last call: the output actor (or the
        site) journals them as it journals the owner's answers (deque pops are atomic: the interfaces append)."""
        out = []
        while self.direct:
            out.append(self.direct.popleft())
        return out

    @staticmethod
    def _finish(answer: Answer, reply) -> None:
        """A cited reply becomes the answer's text (streamed as deltas) and its route, answer and citations."""
        answer.route, answer.answer = reply.route, reply.answer
        answer.citations = [_cited(c.seq, c.time, c.text) for c in reply.citations]
        answer.nearest = [_cited(c.seq, c.time, c.text) for c in reply.nearest]
        for piece in re.findall(r"\S+\s*|\s+", reply.text):
            answer.items.put(("delta", piece))
        answer.text = reply.text

    def _info(self, answer: Answer, now: float, **outcome) -> dict:
        """What an answer's end carries (the interfaces' final reply, the journal's record)."""
        return {**outcome, "ttft_ms": None if answer.t_first is None else (answer.t_first - answer.t_request) * 1e3,
                "total_ms": (now - answer.t_request) * 1e3, "route": answer.route, "answer": answer.answer,
                "citations": answer.citations, "nearest": answer.nearest, "frame_ms": answer.frame_ms}

    @property
    def per_operator(self) -> int:
        """Requests one operator may have waiting or being answered at once (serve.max_waiting_per_operator; 0: half
        of max_waiting where a key file names the operators, else all of it: one key, or none, serves one operator)."""
        s = self.serve
        return s.max_waiting_per_operator or (-(-s.max_waiting // 2) if s.api_keys_file else s.max_waiting)

    def _admit(self, client: str) -> None:
        """RequestError unless the server and `client` (the operator, the fair queue's identity) each have a slot
        free for one more request (under the lock): the answers not finished and the questions still being framed or
        read from the archive (`reading`) hold one each."""
        s = self.serve
        held = [a.client for a in self.answers.values() if not a.finished] + list(self.reading.values())
        if len(held) >= s.max_waiting:
            raise RequestError(503, f"{s.max_waiting} requests are already waiting or being answered; retry "
                                    f"shortly", "server_busy")
        if held.count(client) >= self.per_operator:
            raise RequestError(429, f"this operator already has {self.per_operator} requests waiting or being "
                                    f"answered (serve.max_waiting_per_operator); retry when one ends",
                               "rate_limit_exceeded")

    def cancel(self, answer: Answer, why: str) -> None:
        """The asker went away: the owner stops at its next block, and nobody waits for the rest."""
        self.counts[why] += 1
        with self._lock:
            if self.answers.pop(answer.id, None) is not None:
                self.gone[answer.id] = answer
                self._cancel(answer)
            answer.finished = True

    def _cancel(self, answer: Answer) -> None:
        """Tell the owner to stop `answer` (under the lock). A node gone from the site cannot hear it: nothing is
        answered there anyway (counted)."""
        try:
            send(self.views[answer.stream].asks, Cancel(id=answer.id), timeout=5.0)
        except TimeoutError:
            self.counts["cancels_undelivered"] += 1

    def lost(self, streams: set[str], why: str) -> int:
        """Requests to `streams` whose owner is gone (at a site: their node group started again) end now with `why`
        as their error; their askers stop waiting. Returns how many."""
        with self._lock:
            ended = [a for a in self.answers.values() if a.stream in streams]
            for answer in ended:
                del self.answers[answer.id]
                answer.finished = True
                answer.items.put(("done", self._info(answer, time.monotonic(), error=why, finish_reason=None,
                                                     prompt_tokens=answer.prompt_tokens, completion_tokens=0,
                                                     queued_ms=None, queued_blocks=None, stats={})))
            self.gone = {k: a for k, a in self.gone.items() if a.stream not in streams}
        self.counts["answers_lost"] += len(ended)
        return len(ended)

    # -- from the event loop -----------------------------------------------------------------------------------------
    def on_event(self, event, record: dict | None = None, stream: str = "") -> dict | None:
        """Route one event of `stream`'s owner (pipeline/messages.py); `record` is the journal record the output
        actor made of a Start, Line or Assessment (its decoded text, its time). Returns the finished answer's record
        (for the journal and PUB) on Answer."""
        view = self.views[stream]
        match event:
            case AnswerDelta():
                answer = self.answers.get(event.id)
                if answer is not None:
                    self._delta(answer, event.ids)
            case AnswerEvent():
                return self._done(event)
            case Status():
                view.take(event, record)
                self.feed.publish("status", self.gauges())
            case _:
                shown = view.take(event, record)
                if shown is not None:
                    self.feed.publish(*shown)
        return None

    def _delta(self, answer: Answer, ids) -> None:
        if answer.stopped_by_string:
            return
        if answer.t_first is None:
            answer.t_first = time.monotonic()
        # the decoder holds back a character split across tokens until the rest arrives
        answer.decoded += "".join(answer.decoder.push(int(t)) for t in ids if int(t) not in self.stops)
        if answer.choice is not None:                 # the model's pick: the reply written from it goes out at the end
            return
        text = answer.decoded
        cut = min((i for i in (text.find(s) for s in answer.stop_strings if s) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        if len(text) > len(answer.text):
            answer.items.put(("delta", text[len(answer.text):]))
            answer.text = text
        if cut >= 0:                                  # the owner stops; its Answer event still ends this one
            answer.stopped_by_string = True
            with self._lock:
                self._cancel(answer)

    def _done(self, event: AnswerEvent) -> dict | None:
        with self._lock:
            answer = self.answers.pop(event.id, None)
            gone = self.gone.pop(event.id, None) if answer is None else None
        if answer is None and gone is None:
            return None
        answer = answer or gone
        finish = "stop" if answer.stopped_by_string else event.finish
        if answer.choice is not None and event.error is None and gone is None:
            self._finish(answer, cited.scored(answer.choice, event.scores) if answer.choice.prior else
                         cited.chosen(answer.choice, answer.decoded))
            finish = "stop"
        info = self._info(answer, time.monotonic(), error=event.error, finish_reason=finish,
                          prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                          queued_ms=event.queued_ms, queued_blocks=event.queued_blocks, stats=event.stats)
        if gone is not None:                         # its asker went away: journaled, nobody waits for it
            return {**_record(event.kind, gone, info), "client_gone": True}
        answer.finished = True
        answer.items.put(("done", info))
        if info["error"] is None and info["ttft_ms"] is not None:
            self.ttft_ms.append(info["ttft_ms"])
            self.total_ms.append(info["total_ms"])
            self.tokens_per_s.append(info["stats"].get("tokens_per_s", 0.0))
        return _record(event.kind, answer, info)

    # -- what /metrics and the console's gauges show ------------------------------------------------------------------
    def gauges(self) -> dict:
        """The console's gauges: the one stream's at the top level; with several, each stream's under `streams`
        and the first's at the top level (a console made for one stream shows that one)."""
        per = {name: v.gauges() for name, v in self.views.items()}
        shared = {"resident_bytes": sum(resident_bytes(self.pids_files).values()),
                  "ttft_p50_ms": _quantile(self.ttft_ms, 0.5),
                  "in_flight": sum(not a.finished for a in list(self.answers.values())) + len(self.reading)}
        return {**next(iter(per.values())), **shared, **({"streams": per} if self.several else {})}

    def health(self) -> dict:
        """/healthz: the stream's position (each stream's, with several) and the target's batch invariance."""
        first = next(iter(self.views.values()))
        return {"status": "ok", **first.health(), "batch_invariant": first.start.get("exactness", {}).get("invariant"),
                **({"streams": {n: v.health() for n, v in self.views.items()}} if self.several else {})}


def _record(kind: str, answer: Answer, info: dict) -> dict:
    """An answer's journal record: who asked what, the text, and its end (`Front._info`)."""
    return {"kind": kind, "id": answer.id, "client": answer.client, "question": answer.question, "text": answer.text,
            **info}


def _cited(seq: int, time_: str, text: str) -> dict:
    """A citation as the replies carry it (the server writes it from the archive, never the model)."""
    return {"seq": int(seq), "time": time_, "text": text}


def _quantile(values, q: float) -> float | None:
    if not values:
        return None
    return float(np.quantile(np.fromiter(values, float), q))

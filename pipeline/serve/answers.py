"""Operators' questions on the cache owner's side: taken from the front's channel into the fair queue, answered in a
scratch span of the stream's engine that is rolled back, each with exactly one `Answer`.

Owns the queue (pipeline/serve/operators.py), the request being answered and whether its asker cancelled it, and how
many verify blocks each question waited for (counted in blocks, not seconds, so a loaded host does not change them).
When a question is answered is the cache owner's schedule; what its span holds is the front's (pipeline/serve/
front.py). Never touches the stream's lines or the session's state: the answer's span is rolled back.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from pipeline.answer.score import continuations
from pipeline.decode.rules import TokenTable, rule_from
from pipeline.messages import Answer, AnswerDelta, Cancel, Question, send
from pipeline.serve.operators import OperatorQueue, Request


class Answers:
    def __init__(self, engine, asks, out, params, stop_ids, counts: dict, tok=None):
        """engine: the stream's (a Decoder); asks: the front's question channel; out: the events channel; counts: the
        owner's, where answers, expired and cancelled requests are counted; tok: the tokenizer a question's rule is
        read with (its token table is built at the first question that carries one)."""
        self.engine, self.out, self.params, self.stop_ids, self.counts = engine, out, params, tuple(stop_ids), counts
        self.tok = tok
        self.queue = OperatorQueue()
        self.current: str | None = None               # the request being answered
        self.cancelled: set[str] = set()              # ... when its asker cancelled it
        self.sent: deque = deque(maxlen=256)          # (verify blocks sent, questions written by then), per block
        engine.on_block = lambda blocks: self.sent.append((blocks, asks.written()))

    def __len__(self) -> int:
        return len(self.queue)

    def blocks_before(self, seq: int) -> int:
        """Verify blocks already sent when question `seq` was written. Blocks sent after it, up to its answer's
        start, are blocks it waited for (at most the one being prepared as it came, since the owner asks before each
        block)."""
        before = [n for n, written in self.sent if written <= seq]
        return before[-1] if before else self.sent[0][0] - 1 if self.sent else self.engine.blocks

    def take(self, request: Question | Cancel, seq: int) -> None:
        """A question joins the queue; a cancel ends a queued request (its one Answer says so) or stops the one
        being answered at its next block."""
        blocks_before = self.blocks_before(seq)
        if isinstance(request, Cancel):
            queued = self.queue.cancel(request.id)
            if queued is not None:
                self.reply(queued, finish="cancelled", queued_ms=(time.monotonic() - queued.arrived) * 1e3,
                           queued_blocks=self.engine.blocks - queued.meta["blocks_before"])
            elif request.id == self.current:
                self.cancelled.add(request.id)
            self.counts["cancelled"] += 1
            return
        if not isinstance(request, Question):
            raise ValueError(f"cache owner: unexpected {request.kind!r} among the questions")
        now = time.monotonic()
        rule, stops = None, self.stop_ids
        if request.rule is not None:                 # a choice among options: it ends at a newline
            table = TokenTable.of(self.tok)
            rule, stops = rule_from(request.rule, table), (*self.stop_ids, *sorted(table.newline_ids))
        spans = () if request.spans is None else tuple(
            np.asarray(s, np.int64) for s in np.split(np.asarray(request.spans), np.asarray(request.span_ends)[:-1]))
        self.queue.push(Request(request.id, request.client, np.asarray(request.ids, np.int64), request.max_tokens,
                                now + float(request.deadline_s), now, stops,
                                {"deadline_s": float(request.deadline_s), "blocks_before": blocks_before,
                                 "rule": rule, "spans": spans}))

    def expire(self, now: float) -> None:
        """Requests whose deadline passed while queued: each answered with an error."""
        for req in self.queue.expired(now):
            self.counts["expired"] += 1
            self.reply(req, error=f"deadline of {req.meta['deadline_s']:.0f} s passed while queued "
                                  f"({len(self.queue)} still waiting)")

    def answer_next(self, between_blocks) -> None:
        """Answer the next request in a scratch span, rolled back after it. between_blocks(): what the owner does
        between two blocks (take waiting questions and lines)."""
        req = self.queue.pop()
        self.current, started, waited = req.id, time.monotonic(), self.engine.blocks - req.meta["blocks_before"]
        if req.meta["spans"]:
            return self._score(req, started, waited)

        def keep_going() -> bool:
            between_blocks()
            return req.id not in self.cancelled and time.monotonic() < req.deadline

        def on_tokens(ids) -> None:
            send(self.out, AnswerDelta(id=req.id, ids=np.asarray(ids, np.int32)), timeout=60.0)

        mark = self.engine.mark()
        res = self.engine.generate(req.ids, req.max_tokens, self.params, stop_ids=req.stop_ids,
                                   on_tokens=on_tokens, keep_going=keep_going, rule=req.meta.get("rule"))
        self.engine.rollback(mark)
        ids = res.token_ids
        finish = "stop" if ids and ids[-1] in req.stop_ids else "length" if len(ids) >= req.max_tokens else \
            "cancelled" if req.id in self.cancelled else "deadline"
        self.cancelled.discard(req.id)
        self.current = None
        self.counts["answers"] += 1
        self.reply(req, finish=finish, stats=res.stats.as_dict(), queued_ms=(started - req.arrived) * 1e3,
                   queued_blocks=waited, completion_tokens=len(ids))

    def _score(self, req: Request, started: float, waited: int) -> None:
        """A scoring question (pipeline/answer/score.py): its prompt fed in the scratch span but its last token, then
        each candidate after that token, teacher-forced and rolled back (no candidate sees another); the answer
        carries each one's sum of log p. Past the deadline between two candidates: an error, nothing scored."""
        mark = self.engine.mark()
        try:
            got = continuations(self.engine, req.ids, req.meta["spans"], lambda: time.monotonic() < req.deadline)
        finally:
            self.engine.rollback(mark)
            self.current = None
        self.counts["answers"] += 1
        if len(got) < len(req.meta["spans"]):
            return self.reply(req, error=f"deadline of {req.meta['deadline_s']:.0f} s passed while scoring "
                                         f"({len(got)} of {len(req.meta['spans'])} candidates scored)")
        self.reply(req, finish="stop", queued_ms=(started - req.arrived) * 1e3, queued_blocks=waited,
                   scores=np.array([s.sum() for s in got], np.float64))

    def reply(self, req: Request, error: str | None = None, **outcome) -> None:
        send(self.out, Answer(id=req.id, error=error, prompt_tokens=len(req.ids), **outcome), timeout=60.0)

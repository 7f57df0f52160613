"""Cache-owner actor: owns the sequence state and the schedule between operator questions, analyses and the stream.

Receives tokenized records from ingest (`Line`, then `Eof`) and, when serving, framed operator questions
(`Question`, `Cancel`) from the front; drives the target and draft actors through `DeferredEngine` (the only mover of
committed positions, for both rings); emits `Start` (the target's batch-invariance verdict and platform), `Line`,
`Assessment`, `AnswerDelta`, `Answer`, `Status`, `StreamEnd` and `Eof` events to output (pipeline/messages.py).
Never parses text and never renders any but the structured assessment's question (it quotes the latest line:
pipeline/stream/forms.py); never runs a model and never prints.

The schedule, highest first: operator questions (fair across operators, each with a deadline), then a due analysis,
then the stream's next line; but while lines wait and the stream has had less than `serve.stream_share` of the
target's recent time (pipeline/stream/capacity.py), the stream goes first. Lines waiting behind the next one go in
with it, up to the prefill grid (`waiting_behind`). The measured ingest capacity is in Status, and a Capacity event
says once when it is below the profile's `replay.line_rate`. A question arriving during an analysis preempts it
between two blocks (the analysis is rolled back and runs again later). Lines arriving while the model generates are
moved into a bounded backlog and prefilled afterwards, in order; when the backlog is full they wait in the channel,
and past that ingest drops and counts them. When serving, a periodic ("every N lines") analysis waits until no
stream line is waiting, so under load analyses thin out rather than ingestion falling behind; and a line feed is
sent only when the target has finished the previous one, so a question never queues behind a stack of line passes.

Durability (README, "Surviving faults"): the owner names what is committed. When no pass is in flight to the target
(so the lines' tokens are in its ring), at most every `supervise.checkpoint_s` and with every assessment, it sends a
`Checkpoint` listing the lines fed since the last one; output makes it durable. Started after a restart (`resume`:
the last durable checkpoint), it restores the trigger count, prefills the `recovery` lines ingest re-reads (the window,
not committed again), asks an assessment the crash interrupted, then journals `Recovery` and `Restarted` with the first
committed line.

What lives in the ring (DESIGN.md): the sinks hold the system prompt; the ring holds only the stream. An analysis or
an operator question is asked in a scratch span after the stream (retrieved older lines, the question, the answer)
that is rolled back when the answer is done, so questions never evict stream lines and never colour later analyses.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import fields, replace

import numpy as np

from actors.args import OwnerArgs
from models.convert import load_card
from models.registry import converted_dir, resolve_gguf
from models.runner import kv_bytes_per_slot
from pipeline.channel import Channel, Selector
from pipeline.decode.assemble import policy
from pipeline.decode.deferred import DeferredEngine
from pipeline.messages import (
    Answer,
    AnswerDelta,
    Assessment,
    Cancel,
    Capacity,
    Checkpoint,
    Eof,
    Line,
    Question,
    Recovery,
    Restarted,
    Start,
    Status,
    StreamEnd,
    copied,
    decode,
    send,
)
from pipeline.process import Figures, attach_when_ready, chaos, figures_on_request, pin
from pipeline.serve.operators import OperatorQueue, Request
from pipeline.stream.capacity import StreamClock
from pipeline.stream.replay import Analyst, replay_frame
from pipeline.stream.surprise import Scored, Surprise, record_of
from pipeline.stream.triggers import Triggers

STATUS_EVERY_S = 1.0


def run(args: OwnerArgs) -> None:
    """Create this stream's lines, from_target, from_draft (and, serving, questions) channels, attach to the
    target's, the draft's and output's, then run the schedule until the stream ends (serving: until the drain)."""
    stop = args.stop
    pin(args.cfg.actors.owner_cpus)
    with Channel.create(args.inbox) as inp, Channel.create(args.from_target) as from_target, \
            Channel.create(args.from_draft) as from_draft, \
            (Channel.create(args.questions) if args.questions else _Nothing()) as asks, \
            attach_when_ready(args.to_target, stop) as to_target, \
            attach_when_ready(args.to_draft, stop) as to_draft, \
            attach_when_ready(args.outbox, stop) as out:
        owner = Owner(args.cfg, args.spec, inp, asks if args.questions else None, out,
                      (to_target, from_target, to_draft, from_draft), stop, args.drain, args.source_id, args.resume,
                      args.restart)
        owner.loop()


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


class Owner:
    def __init__(self, cfg, spec, lines, asks, out, links, stop, drain, source_id: str = "",
                 resume: dict | None = None, restart: dict | None = None):
        self.cfg, self.spec, self.lines, self.asks, self.out, self.stop, self.drain = \
            cfg, spec, lines, asks, out, stop, drain
        self.figures = Figures("cache_owner")
        figures_on_request(self.figures)
        frame = replay_frame(cfg)
        self.stop_ids = tuple(frame.tok.stop_ids)
        card = load_card(converted_dir(resolve_gguf(cfg.model.gguf)))["config"]
        self.engine = DeferredEngine(spec, policy(cfg, card["vocab_size"], frame.tok), *links)
        send(self.out, Start(exactness=self.engine.exactness, platform=self.engine.platform, model=cfg.model.gguf,
                             draft=cfg.draft.kind, sink=spec.sink, window=spec.window, ring=spec.ring), timeout=60.0)
        self.engine.feed(frame.head)
        self.analyst = Analyst(self.engine, frame)
        self.triggers = Triggers(cfg.replay.every_lines, cfg.replay.trigger_pattern, cfg.replay.idle_s,
                                 cfg.replay.surprise_above)
        self.surprise = Surprise(cfg.replay.surprise_above) if cfg.replay.scored else None   # rebuilt on restart
        self.queue = OperatorQueue()
        self.selector = Selector([lines] + ([asks] if asks is not None else []))
        self.asks_only = Selector([asks]) if asks is not None else None
        self.backlog: deque = deque()                 # lines (and the Eof) read while the model generated
        self.backlog_max = cfg.serve.backlog_lines
        self.seen: deque = deque()          # (last position, offset, tags, seq, loop) of the lines in the ring
        self.due: str | None = None                   # an analysis to run when no question waits
        self.latest = ""                              # the text of the last line in the ring
        self.cancelled: set[str] = set()              # the request being answered, when its asker cancelled it
        self.current: str | None = None
        self.serving, self.stream_ended = asks is not None, False
        self.counts = dict(lines=0, stream_tokens=0, packed_feeds=0, answers=0, expired=0, cancelled=0, preempted=0,
                           backlog_max_depth=0)
        self.sent: deque = deque(maxlen=256)          # (verify blocks sent, questions written by then), per block
        if asks is not None:
            self.engine.on_block = self.block_sent
        self.first_line, self.last_line, self.last_status, self.analysing = None, time.monotonic(), 0.0, False
        self.clock = StreamClock()                    # the stream's share of the target, its measured capacity
        self.streaming: tuple | None = None           # (since, tokens, lines) of stream passes still in flight
        self.share_min, self.line_rate, self.warned = cfg.serve.stream_share, cfg.replay.line_rate, False
        self.kv_pool_bytes = kv_bytes_per_slot(card) * spec.stored_slots
        # durability: the lines fed since the last checkpoint, the last one checkpointed, a restart to journal
        self.source_id, self.fresh, self.last_checkpoint = source_id, [], time.monotonic()
        self.committed = (resume.offset, resume.loop, resume.seq) if resume else None
        self.restart, self.resume, self.recovered, self.resumed_due = restart, resume, [], None
        if resume:
            self.counts["lines"], self.triggers.since = resume.lines, resume.since
            self.resumed_due = resume.due            # asked once the window is refilled, before any new line

    # -- the schedule ------------------------------------------------------------------------------------------------
    def loop(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stream_done()
            owed = self.stream_owed()
            if self.queue and not owed:
                with self.figures.busy(), self.other_work():
                    self.answer(self.queue.pop())
            elif self.due and not owed and not self.waits(self.due):
                with self.figures.busy(), self.other_work():
                    self.assess(self.due)
            elif self.serving and self.engine.to_target.in_flight():
                self.asks_only.wait(0.005)   # serving: one line pass at a time, so a question never queues behind many
            elif self.backlog:
                with self.figures.busy():
                    if self.take_line(self.backlog.popleft()):
                        return
            elif self.stream_ended:
                if self.drain is None or self.drain.is_set():
                    return self.close()
                self.selector.wait(0.2)
            elif self.lines in self.selector.wait(0.2):
                with self.lines.recv(timeout=1.0) as received:
                    line = copied(decode(received))
                with self.figures.busy():
                    if self.take_line(line):
                        return
            else:
                self.due = self.due or self.triggers.on_quiet(time.monotonic() - self.last_line)
            self.status()
            if self.fresh and time.monotonic() - self.last_checkpoint >= self.cfg.supervise.checkpoint_s and \
                    not self.engine.to_target.in_flight():
                send(self.out, Checkpoint(**self.commit_point()), timeout=60.0)

    def stream_owed(self) -> bool:
        """Serving: lines wait and the stream had less than its share of the target's recent time."""
        return self.serving and self.share_min > 0 and (bool(self.backlog) or self.lines.ready()) and \
            self.clock.share < self.share_min

    def stream_done(self, now: float | None = None) -> None:
        """The target has run every stream pass sent (or a question comes next: the rest counts as its time): the
        stream's seconds, tokens and lines go to the clock; the capacity is checked against the profile's rate."""
        if self.streaming is None or (now is None and self.engine.to_target.in_flight()):
            return
        now = time.monotonic() if now is None else now
        since, tokens, lines = self.streaming
        self.streaming = None
        self.clock.stream(now - since, tokens, lines, now)
        got = self.clock.capacity()
        if self.line_rate and got and got[1] < self.line_rate and not self.warned:
            self.warned = True
            send(self.out, Capacity(line_rate=self.line_rate, lines_per_s=got[1], tokens_per_s=got[0],
                                    stream_share=self.clock.share), timeout=60.0)

    @contextmanager
    def other_work(self):
        """A question or an analysis: its seconds are the target's, not the stream's."""
        t0 = time.monotonic()
        self.stream_done(t0)
        try:
            yield
        finally:
            self.clock.other(time.monotonic() - t0, time.monotonic())

    def waits(self, reason: str) -> bool:
        """Serving, a periodic analysis waits while stream lines are waiting: the ring is kept current first, and
        analyses thin out under load instead of making ingestion fall behind (a matching alarm's still runs)."""
        return self.serving and reason == "every" and (bool(self.backlog) or self.lines.ready())

    def poll(self, lines_too: bool = False) -> bool:
        """Take waiting questions and cancels into the queue (and, while generating, waiting lines into the
        backlog); drop the requests whose deadline passed. True when a question waits."""
        while self.asks is not None and self.asks.ready():
            with self.asks.recv(timeout=1.0) as received:
                request, seq = copied(decode(received)), received.seq
            self.take_request(request, self.blocks_before(seq))
        while lines_too and len(self.backlog) < self.backlog_max and self.lines.ready():
            with self.lines.recv(timeout=1.0) as received:
                self.backlog.append(copied(decode(received)))
            self.counts["backlog_max_depth"] = max(self.counts["backlog_max_depth"], len(self.backlog))
        for req in self.queue.expired(time.monotonic()):
            self.counts["expired"] += 1
            self.send_answer(req, error=f"deadline of {req.meta['deadline_s']:.0f} s passed while queued "
                                        f"({len(self.queue)} still waiting)")
        return bool(self.queue)

    def block_sent(self, blocks: int) -> None:
        self.sent.append((blocks, self.asks.written()))

    def blocks_before(self, seq: int) -> int:
        """Verify blocks already sent when question `seq` was written. Blocks sent after it, up to its answer's
        start, are blocks it waited for (at most the one being prepared as it came, since the owner asks before each
        block): counted in blocks, not seconds, so a loaded host does not change them."""
        before = [n for n, written in self.sent if written <= seq]
        return before[-1] if before else self.sent[0][0] - 1 if self.sent else self.engine.blocks

    def take_request(self, request: Question | Cancel, blocks_before: int) -> None:

        if isinstance(request, Cancel):
            queued = self.queue.cancel(request.id)
            if queued is not None:                     # never started: its one Answer says so
                self.send_answer(queued, finish="cancelled", queued_ms=(time.monotonic() - queued.arrived) * 1e3,
                                 queued_blocks=self.engine.blocks - queued.meta["blocks_before"])
            elif request.id == self.current:
                self.cancelled.add(request.id)          # being answered: stops at the next block
            self.counts["cancelled"] += 1
            return
        if not isinstance(request, Question):
            raise ValueError(f"cache owner: unexpected {request.kind!r} among the questions")
        now = time.monotonic()
        self.queue.push(Request(request.id, request.client, np.asarray(request.ids, np.int64), request.max_tokens,
                                now + float(request.deadline_s), now, self.stop_ids,
                                {"deadline_s": float(request.deadline_s), "blocks_before": blocks_before}))

    # -- the three kinds of work -------------------------------------------------------------------------------------
    def answer(self, req) -> None:
        self.current, started, waited = req.id, time.monotonic(), self.engine.blocks - req.meta["blocks_before"]

        def keep_going() -> bool:
            self.poll(lines_too=True)
            return req.id not in self.cancelled and time.monotonic() < req.deadline

        def on_tokens(ids) -> None:
            send(self.out, AnswerDelta(id=req.id, ids=np.asarray(ids, np.int32)), timeout=60.0)

        mark = self.engine.mark()
        res = self.engine.generate(req.ids, req.max_tokens, self.analyst.frame.params, stop_ids=req.stop_ids,
                                   on_tokens=on_tokens, keep_going=keep_going)
        self.engine.rollback(mark)
        ids = res.token_ids
        finish = "stop" if ids and ids[-1] in req.stop_ids else "length" if len(ids) >= req.max_tokens else \
            "cancelled" if req.id in self.cancelled else "deadline"
        self.cancelled.discard(req.id)
        self.current = None
        self.counts["answers"] += 1
        self.send_answer(req, finish=finish, stats=res.stats.as_dict(), queued_ms=(started - req.arrived) * 1e3,
                         queued_blocks=waited, completion_tokens=len(ids))
        self.last_status = 0.0                           # the gauges show this answer at the next turn of the loop

    def send_answer(self, req, error: str | None = None, **outcome) -> None:
        send(self.out, Answer(id=req.id, error=error, prompt_tokens=len(req.ids), **outcome), timeout=60.0)

    def assess(self, reason: str) -> None:
        t0 = time.perf_counter()
        self.status(analysing=True)
        try:
            written, tags = self.analyst.assess(self.latest, keep_going=lambda: not self.poll(lines_too=True))
        finally:
            self.status(analysing=False)
        if written.cut:
            self.counts["preempted"] += 1               # a question came first: asked again after it
            return
        self.due = None
        seen = self.seen
        send(self.out, Assessment(trigger=reason, offsets=[seen[0][1], seen[-1][1]] if seen else [],
                                  lines=self.counts["lines"], window_lines=len(seen), window_tags=tags,
                                  latency_ms=(time.perf_counter() - t0) * 1000.0, stats=written.stats.as_dict(),
                                  checkpoint=self.commit_point(), fields=written.fields,
                                  ids=np.asarray(written.ids, np.int32)), timeout=60.0)

    def take_line(self, line: Line | Eof) -> bool:
        """Prefill one stream line (or end the stream); True when this actor is done."""
        if isinstance(line, Eof):
            self.ask_interrupted()
            self.eof = line
            self.stream_ended = True
            if self.restart is not None and self.committed is not None:
                self.restarted()                       # no new line came after the restart: journal it now
            if not self.serving:
                self.close()
                return True
            send(self.out, StreamEnd(**{f.name: getattr(line, f.name) for f in fields(StreamEnd)}), timeout=60.0)
            return False
        if not isinstance(line, Line):
            raise ValueError(f"cache owner: unexpected {line.kind!r} among the stream's lines")
        engine = self.engine
        if line.recovery:                              # committed before a restart: refills the window only
            chaos("owner.recovery")
            engine.feed(line.ids)
            self.in_window(line, engine.index.n - 1)
            self.recovered.append(line.offset)
            return False
        self.ask_interrupted()
        self.first_line = self.first_line or time.perf_counter()
        self.last_line = time.monotonic()
        first = engine.index.n + (engine.pending is not None)
        # a surprise trigger fires on a line's score, known once it is in: one line per feed then, so the assessment
        # comes right after that line, as in the serial replay (scoring alone keeps packing: `waiting_behind`)
        group = [line] if self.triggers.surprise_above > 0 else self.waiting_behind(line, first)
        lengths = [len(g.ids) for g in group]
        since, tokens, lines = self.streaming or (time.monotonic(), 0, 0)
        self.streaming = (since, tokens + sum(lengths), lines + len(group))
        nll = engine.feed(np.concatenate([g.ids for g in group]) if len(group) > 1 else line.ids,
                          score=self.surprise is not None)
        cuts = np.cumsum(lengths)
        for g, end, cut in zip(group, first + cuts - 1, cuts):
            scored = None if self.surprise is None else self.surprise.line(g.text, nll[cut - len(g.ids):cut])
            self.line_fed(g, int(end), scored)
            reason = self.triggers.after_line(g.text, scored and scored.surprise)   # only the last may fire
        self.counts["packed_feeds"] += len(group) > 1
        self.due = self.due or reason
        if self.restart is not None:
            self.restarted()
        return False

    def waiting_behind(self, line: Line, first: int) -> list[Line]:
        """`line` (its first token at position `first`) and the lines waiting behind it (backlog, then channel) up
        to the next multiple of the prefill grid, so the stream goes in full passes when it runs ahead
        (`Decoder.feed`: how text is cut into feeds leaves its K/V unchanged). Stops after a line that fires a
        trigger (assessed right after it) and before an Eof or a recovery line."""
        grid = self.engine.policy.prefill
        room, group = grid - first % grid, [line]
        tokens = len(line.ids)
        while tokens < room and not self.triggers.would_fire(group[-1].text, len(group) - 1):
            if self.backlog:
                nxt = self.backlog.popleft()
            elif self.lines.ready():
                with self.lines.recv(timeout=1.0) as received:
                    nxt = copied(decode(received))
            else:
                break
            if not isinstance(nxt, Line) or nxt.recovery:
                self.backlog.appendleft(nxt)
                break
            group.append(nxt)
            tokens += len(nxt.ids)
        return group

    def line_fed(self, line: Line, end: int, scored: Scored | None = None) -> None:
        """A stream line is in the ring, its last token at position `end`: count it, note it, send it on (with its
        surprisal, when scored)."""
        self.counts["lines"] += 1
        self.counts["stream_tokens"] += len(line.ids)
        self.in_window(line, end)
        self.fresh.append(line.offset)
        self.committed = (line.offset, line.loop, line.seq)
        send(self.out, replace(line, ids=None, window_from_seq=self.seen[0][3], backlog=len(self.backlog),
                               **record_of(scored)), timeout=60.0)

    def ask_interrupted(self) -> None:
        """The assessment a crash interrupted (the checkpoint's `due`), once the window is refilled: at the first new
        line or the stream's end, over the same lines as before the crash."""
        if self.resumed_due is not None:
            self.due, self.resumed_due = self.resumed_due, None
            self.assess(self.due)

    def in_window(self, line: Line, end: int) -> None:
        """Note the line whose last token is at `end`; forget the lines no query at `end` can see."""
        self.seen.append((end, line.offset, line.tags, line.seq, line.loop))
        self.latest = line.text                         # quoted by the structured form's question
        self.analyst.saw(end + 1 - len(line.ids), line.tags)
        while self.seen and self.seen[0][0] < end + 1 - self.engine.spec.window:
            self.seen.popleft()

    # -- durability --------------------------------------------------------------------------------------------------
    def commit_point(self) -> dict:
        """A Checkpoint's fields for the lines fed so far, once the target has run every pass sent to it (their
        tokens are then in its ring); the lines since the last one are its `offsets`."""
        while self.engine.to_target.in_flight():
            time.sleep(0.001)
        offset, loop, seq = self.committed or (-1, 0, 0)
        first = self.seen[0] if self.seen else (0, offset, (), seq, loop)
        point = dict(source=self.source_id, offset=offset, loop=loop, seq=seq, offsets=self.fresh,
                     position=int(self.engine.index.n), window_offset=first[1], window_loop=first[4],
                     window_seq=first[3], lines=self.counts["lines"], since=self.triggers.since, due=self.due)
        self.fresh, self.last_checkpoint = [], time.monotonic()
        return point

    def restarted(self) -> None:
        """The first line after a restart is in the ring: make it committed, then journal the recovery and the
        restart (its recovery time: from the death to this commit)."""
        r, self.restart = self.restart, None
        send(self.out, Checkpoint(**self.commit_point()), timeout=60.0)
        send(self.out, Recovery(lines=len(self.recovered), offsets=self.recovered[:1] + self.recovered[-1:],
                                position=int(self.engine.index.n)), timeout=60.0)
        died = r.died_at
        send(self.out, Restarted(actor=r.actor, cause=r.cause, restarts=r.restarts,
                                 recovery_s=None if died is None else time.time() - died,
                                 resumed_after=self.resume.offset if self.resume else None), timeout=60.0)
        self.recovered = []

    # -- reporting ---------------------------------------------------------------------------------------------------
    def status(self, analysing: bool | None = None) -> None:
        """A few figures for the front's gauges and /metrics, about once a second while serving, and whenever an
        analysis starts or ends (`analysing`)."""
        now = time.monotonic()
        if not self.serving or analysing is None and now - self.last_status < STATUS_EVERY_S:
            return
        self.analysing = self.analysing if analysing is None else analysing
        self.last_status = now
        totals = self.engine.totals.as_dict()
        got = self.clock.capacity()
        send(self.out, Status(queue=len(self.queue), backlog=len(self.backlog), lines_inbox=self.lines.depth(),
                              kv_pool_bytes=self.kv_pool_bytes, position=int(self.engine.index.n), **self.counts,
                              analysing=self.analysing,
                              stream_share=self.clock.share, capacity_lines_per_s=got[1] if got else 0.0,
                              **{k: totals[k] for k in ("tokens_per_s", "generated", "accepted_per_verify",
                                                        "acceptance_rate", "verify_calls")}), timeout=60.0)

    def close(self) -> None:
        if self.fresh:
            send(self.out, Checkpoint(**self.commit_point()), timeout=60.0)
        model_figures = self.engine.close()
        self.figures.extra.update(stream_wall_s=time.perf_counter() - (self.first_line or 0.0),
                                  inbox_max_depth=self.lines.max_depth, **self.counts,
                                  **{k: v for k, v in self.engine.totals.as_dict().items() if k in _TOTALS})
        send(self.out, replace(self.eof, figures=self.eof.figures + [self.figures.snapshot()] + model_figures),
             timeout=60.0)


_TOTALS = ("tokens_per_s", "generated", "decode_s", "verify_calls", "accepted_per_verify", "acceptance_rate",
           "draft_s", "overlap_s", "overlap_share", "wasted_draft_s", "verify_s", "target_idle_s", "verify_forward_s",
           "decode_overhead_share")

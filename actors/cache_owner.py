"""Cache-owner actor: owns the schedule between operator questions, analyses and the stream, and the channels to
the target and draft actors; what happens to a stream line is its `StreamSession`'s (pipeline/stream/session.py).

Receives tokenized records from ingest (`Line`, then `Eof`) and, when serving, framed operator questions
(`Question`, `Cancel`) from the front; drives the target and draft actors through `DeferredEngine` (the only mover of
committed positions, for both rings); emits `Start`, `Line`, `Assessment`, `Checkpoint`, `AnswerDelta`, `Answer`,
`Status`, `Capacity`, `StreamEnd`, `Recovery`, `Restarted` and `Eof` events to output (pipeline/messages.py). Never
parses text, never runs a model and never prints.

The schedule (what runs next: questions, a due analysis or the stream's next line) is pipeline/stream/schedule.py's,
decided from the owner's state each turn. Lines waiting behind the next one go in with it, up to the prefill grid
(`waiting_behind`). A question arriving during an analysis preempts it between two blocks (the analysis is asked
again later). Lines arriving while the model generates are moved into a bounded backlog and prefilled afterwards, in
order; when the backlog is full they wait in the channel, and past that ingest drops and counts them.

Durability (README, "Surviving faults"): when no pass is in flight to the target, at most every
`supervise.checkpoint_s` and with every assessment, the session's `Checkpoint` goes to output, which makes it
durable. Started after a restart (`resume`), the session takes the checkpoint back, the `recovery` lines ingest
re-reads refill the window, an assessment the crash interrupted is asked again, then `Recovery` and `Restarted` are
journaled with the first committed line.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import fields, replace

from actors.args import OwnerArgs
from models.runner import kv_bytes_per_slot
from pipeline.channel import Channel, Selector
from pipeline.decode.assemble import policy
from pipeline.decode.deferred import DeferredEngine
from pipeline.messages import (
    Capacity,
    Eof,
    Line,
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
from pipeline.serve.answers import Answers
from pipeline.stream.capacity import StreamClock
from pipeline.stream.frame import replay_frame
from pipeline.stream.schedule import Turn, Work, next_work
from pipeline.stream.session import StreamSession

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
        owner = Owner(args, inp, asks if args.questions else None, out, (to_target, from_target, to_draft, from_draft))
        owner.loop()


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


class Owner:
    def __init__(self, args: OwnerArgs, lines, asks, out, links):
        """lines, asks (serving, else None), out: this stream's channels; links: (to_target, from_target, to_draft,
        from_draft)."""
        cfg, spec = args.cfg, args.spec
        self.cfg, self.lines, self.asks, self.out, self.stop, self.drain = cfg, lines, asks, out, args.stop, args.drain
        self.figures = Figures("cache_owner")
        figures_on_request(self.figures)
        frame = replay_frame(cfg)
        card = cfg.target.config
        self.engine = DeferredEngine(spec, policy(cfg, card["vocab_size"], frame.tok), *links)
        send(self.out, Start(exactness=self.engine.exactness, platform=self.engine.platform, model=cfg.model.gguf,
                             draft=cfg.draft.kind, sink=spec.sink, window=spec.window, ring=spec.ring), timeout=60.0)
        self.engine.feed(frame.head)
        self.session = StreamSession(self.engine, frame, cfg.replay, args.source_id, settle=self.settle)
        if args.resume is not None:
            self.session.restore(args.resume)
        self.restart = args.restart                   # why this start is a restart: journaled with its first line
        self.counts = dict(packed_feeds=0, answers=0, expired=0, cancelled=0, preempted=0, backlog_max_depth=0)
        self.answers = None if asks is None else Answers(self.engine, asks, out, frame.params, frame.tok.stop_ids,
                                                         self.counts, tok=frame.tok)
        self.selector = Selector([lines] + ([asks] if asks is not None else []))
        self.asks_only = Selector([asks]) if asks is not None else None
        self.backlog: deque = deque()                 # lines (and the Eof) read while the model generated
        self.clock = StreamClock()                    # the stream's share of the target, its measured capacity
        self.eof: Eof | None = None                   # the stream ended (serving goes on answering)
        self.first_line, self.last_line, self.last_checkpoint = None, time.monotonic(), time.monotonic()
        self.last_status, self.analysing = 0.0, False
        self.kv_pool_bytes = kv_bytes_per_slot(card, cfg.model.resolved(cfg.target.card).pool_dtype) * spec.stored_slots

    @property
    def serving(self) -> bool:
        return self.asks is not None

    # -- the schedule ------------------------------------------------------------------------------------------------
    def loop(self) -> None:
        """Each turn: take what came in, decide what runs next (pipeline/stream/schedule.py), run it."""
        while not self.stop.is_set():
            self.poll()
            self.stream_ran()
            work = next_work(self.turn())
            if work is Work.ANSWER:
                with self.figures.busy(), self.other_work():
                    self.answers.answer_next(lambda: self.poll(lines_too=True))
                self.last_status = 0.0                   # the gauges show this answer at the next turn of the loop
            elif work is Work.ASSESS:
                with self.figures.busy(), self.other_work():
                    self.assess()
            elif work is Work.WAIT_TARGET:
                self.asks_only.wait(0.005)
            elif work is Work.BACKLOG:
                with self.figures.busy():
                    if self.take_line(self.backlog.popleft()):
                        return
            elif work is Work.CLOSE:
                return self.close()
            elif work is Work.WAIT_DRAIN:
                self.selector.wait(0.2)
            elif self.lines in self.selector.wait(0.2):
                with self.lines.recv(timeout=1.0) as received:
                    line = copied(decode(received))
                with self.figures.busy():
                    if self.take_line(line):
                        return
            else:
                self.session.quiet(time.monotonic() - self.last_line)
            self.status()
            if self.session.since_checkpoint and not self.engine.to_target.in_flight() and \
                    time.monotonic() - self.last_checkpoint >= self.cfg.supervise.checkpoint_s:
                self.send_checkpoint()

    def turn(self) -> Turn:
        """This turn's snapshot for the schedule."""
        backlog = bool(self.backlog)
        return Turn(serving=self.serving, question_waits=bool(self.answers), lines_wait=backlog or self.lines.ready(),
                    backlog=backlog, stream_share=self.clock.share, share_min=self.cfg.serve.stream_share,
                    due=self.session.due or "", target_busy=self.serving and self.engine.to_target.in_flight(),
                    ended=self.eof is not None, drain=self.drain is None or self.drain.is_set())

    def stream_ran(self, now: float | None = None) -> None:
        """The target has run every stream pass sent (or a question comes next: the rest counts as its time): the
        stream's seconds, tokens and lines go to the clock; the capacity is checked against the profile's rate."""
        if self.clock.in_flight is None or (now is None and self.engine.to_target.in_flight()):
            return
        self.clock.ran(time.monotonic() if now is None else now)
        got = self.clock.short_of(self.cfg.replay.line_rate)
        if got is not None:
            send(self.out, Capacity(line_rate=self.cfg.replay.line_rate, lines_per_s=got[1], tokens_per_s=got[0],
                                    stream_share=self.clock.share), timeout=60.0)

    @contextmanager
    def other_work(self):
        """A question or an analysis: its seconds are the target's, not the stream's."""
        t0 = time.monotonic()
        self.stream_ran(t0)
        try:
            yield
        finally:
            self.clock.other(time.monotonic() - t0, time.monotonic())

    def poll(self, lines_too: bool = False) -> bool:
        """Take waiting questions and cancels into the queue (and, while generating, waiting lines into the
        backlog); drop the requests whose deadline passed. True when a question waits."""
        if self.answers is None:
            return False
        while self.asks.ready():
            with self.asks.recv(timeout=1.0) as received:
                request, seq = copied(decode(received)), received.seq
            self.answers.take(request, seq)
        while lines_too and len(self.backlog) < self.cfg.serve.backlog_lines and self.lines.ready():
            with self.lines.recv(timeout=1.0) as received:
                self.backlog.append(copied(decode(received)))
            self.counts["backlog_max_depth"] = max(self.counts["backlog_max_depth"], len(self.backlog))
        self.answers.expire(time.monotonic())
        return bool(self.answers)

    # -- the stream --------------------------------------------------------------------------------------------------
    def assess(self) -> None:
        self.status(analysing=True)
        try:
            assessment = self.session.assess(keep_going=lambda: not self.poll(lines_too=True))
        finally:
            self.status(analysing=False)
        if assessment is None:
            self.counts["preempted"] += 1               # a question came first: asked again after it
            return
        self.last_checkpoint = time.monotonic()
        send(self.out, assessment, timeout=60.0)

    def take_line(self, line: Line | Eof) -> bool:
        """Prefill one stream line (or end the stream); True when this actor is done."""
        if isinstance(line, Eof):
            self.ask_interrupted()
            self.eof = line
            if self.restart is not None and self.session.committed is not None:
                self.restarted()                       # no new line came after the restart: journal it now
            if not self.serving:
                self.close()
                return True
            send(self.out, StreamEnd(**{f.name: getattr(line, f.name) for f in fields(StreamEnd)}), timeout=60.0)
            return False
        if not isinstance(line, Line):
            raise ValueError(f"cache owner: unexpected {line.kind!r} among the stream's lines")
        if line.recovery:                              # committed before a restart: refills the window only
            chaos("owner.recovery")
            self.session.recover(line)
            return False
        self.ask_interrupted()
        self.first_line = self.first_line or time.perf_counter()
        self.last_line = time.monotonic()
        # a surprise trigger fires on a line's score, known once it is in: one line per feed then, so the assessment
        # comes right after that line, as in the serial replay (scoring alone keeps packing: `waiting_behind`)
        group = [line] if self.session.triggers.surprise_above > 0 else self.waiting_behind(line)
        self.clock.sent(sum(len(g.ids) for g in group), len(group), time.monotonic())
        for event in self.session.feed(group):
            send(self.out, replace(event, backlog=len(self.backlog)), timeout=60.0)
        self.counts["packed_feeds"] += len(group) > 1
        if self.restart is not None:
            self.restarted()
        return False

    def waiting_behind(self, line: Line) -> list[Line]:
        """`line` and the lines waiting behind it (backlog, then channel) up to the next multiple of the prefill
        grid, so the stream goes in full passes when it runs ahead (`Decoder.feed`: how text is cut into feeds
        leaves its K/V unchanged). Stops after a line that fires a trigger (assessed right after it) and before an
        Eof or a recovery line."""
        grid = self.engine.policy.prefill
        room, group = grid - self.session.next_position() % grid, [line]
        tokens = len(line.ids)
        while tokens < room and not self.session.would_fire(group[-1].text, len(group) - 1):
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

    def ask_interrupted(self) -> None:
        """The assessment a crash interrupted (the checkpoint's `due`), once the window is refilled: at the first new
        line or the stream's end, over the same lines as before the crash."""
        if self.session.take_interrupted():
            self.assess()

    # -- durability --------------------------------------------------------------------------------------------------
    def settle(self) -> None:
        """Wait until the target has run every pass sent to it: the fed lines' tokens are then in its ring."""
        while self.engine.to_target.in_flight():
            time.sleep(0.001)

    def send_checkpoint(self) -> None:
        send(self.out, self.session.checkpoint(), timeout=60.0)
        self.last_checkpoint = time.monotonic()

    def restarted(self) -> None:
        """The first line after a restart is in the ring: make it committed, then journal the recovery and the
        restart (its recovery time: from the death to this commit)."""
        r, self.restart = self.restart, None
        self.send_checkpoint()
        recovered, self.session.recovered = self.session.recovered, []
        send(self.out, Recovery(lines=len(recovered), offsets=recovered[:1] + recovered[-1:],
                                position=int(self.engine.index.n)), timeout=60.0)
        died = r.died_at
        send(self.out, Restarted(actor=r.actor, cause=r.cause, restarts=r.restarts,
                                 recovery_s=None if died is None else time.time() - died,
                                 resumed_after=self.session.resumed_after), timeout=60.0)

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
        send(self.out, Status(queue=len(self.answers), backlog=len(self.backlog), lines_inbox=self.lines.depth(),
                              kv_pool_bytes=self.kv_pool_bytes, position=int(self.engine.index.n), **self.counts,
                              lines=self.session.lines, stream_tokens=self.session.stream_tokens,
                              analysing=self.analysing,
                              stream_share=self.clock.share, capacity_lines_per_s=got[1] if got else 0.0,
                              **{k: totals[k] for k in ("tokens_per_s", "generated", "accepted_per_verify",
                                                        "acceptance_rate", "verify_calls")}), timeout=60.0)

    def close(self) -> None:
        if self.session.since_checkpoint:
            self.send_checkpoint()
        model_figures = self.engine.close()
        self.figures.extra.update(stream_wall_s=time.perf_counter() - (self.first_line or 0.0),
                                  inbox_max_depth=self.lines.max_depth, lines=self.session.lines,
                                  stream_tokens=self.session.stream_tokens, **self.counts,
                                  **{k: v for k, v in self.engine.totals.as_dict().items() if k in _TOTALS})
        send(self.out, replace(self.eof, figures=self.eof.figures + [self.figures.snapshot()] + model_figures),
             timeout=60.0)


_TOTALS = ("tokens_per_s", "generated", "decode_s", "verify_calls", "accepted_per_verify", "acceptance_rate",
           "draft_s", "overlap_s", "overlap_share", "wasted_draft_s", "verify_s", "target_idle_s", "verify_forward_s",
           "decode_overhead_share")

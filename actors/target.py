"""Target actor: owns the target model's session and its KV pools (one ring per stream), and judges blocks.

Starts by probing its graph's batch invariance (pipeline/decode/exactness.py) and telling each stream's cache owner
the verdict (`Ready`). Receives from each owner, on that stream's own inbox, fully specified passes
(pipeline/messages.py): a stream or prompt chunk to prefill (`Prefill`), or a block to verify (`Verify`: rows,
positions, the mask, a tree's root paths, the recent section's positions, the slots committed rows go to). Runs and
judges them with the serial engine's verifier (pipeline/decode/local.py), one per stream, which stores the K/V the
owner said to keep, and for a block answers on the stream's outbox with a `Verdict` (rows accepted, next token);
`Close` gets that stream the figures (`Closed`); the actor ends when every stream has closed.

Several streams: the passes waiting in the inboxes run together, at most one per stream, `model.pass_streams` streams
and SOFTMAX_ROWS rows in all, in one pass of the smallest several-stream graph that holds them (models/streams.py: the
single-stream graph or the one with `pass_streams` slots; more streams take turns), each stream's rows seeing only
its own ring; a stream's answers are the bits it gets alone (tests/models/test_streams.py). Messages of one stream
are handled in the order they came; a `Constrain` or `Close` waits for the passes before it.

Never decides positions, slots or what is committed: the owner does, from its ring index; this actor's only state is
the pools' contents and the samplers.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import ExitStack

from actors.args import TargetArgs
from kernels.ring import RingSpec
from models.platform import facts
from models.runner import Runner
from models.streams import Streams, pack
from pipeline.channel import Channel, Selector
from pipeline.config import Config
from pipeline.decode.blocks import Block
from pipeline.decode.exactness import check
from pipeline.decode.local import LocalVerifier
from pipeline.decode.rules import TokenTable, rule_from
from pipeline.messages import Close, Closed, Constrain, Picked, Prefill, Ready, Scored, Verdict, Verify, decode, send
from pipeline.process import Figures, attach_when_ready, chaos, figures_on_request, pin
from pipeline.stream.surprise import unscored_tokens

PASSES = (Prefill, Verify)
ANSWER_FIRST = 4          # passes the longest waiting feed chunk may be passed over for other streams' answers


def run(args: TargetArgs) -> None:
    """Stream n's passes arrive on inboxes[n] (created here) and its answers go to outboxes[n] (its owner's)."""
    pin(args.cfg.actors.target_cpus)
    figures = Figures("target")
    figures_on_request(figures)
    judge = _Judge(args.cfg, args.spec, len(args.inboxes))
    with ExitStack() as channels:
        inps = [channels.enter_context(Channel.create(spec_n)) for spec_n in args.inboxes]
        outs = [channels.enter_context(attach_when_ready(name, args.stop)) for name in args.outboxes]
        for out in outs:
            send(out, Ready(exactness=judge.exactness.as_dict(), platform=facts()), timeout=60.0)
        inbox, turns = _Inboxes(inps), _Turns(judge.widest)
        open_ = set(range(len(inps)))             # streams not yet closed
        waiting: deque = deque()                  # (received, stream, message) taken, not yet handled
        while open_ and not args.stop.is_set():
            if not inbox.take(waiting, 2 * len(inps)):
                continue
            with figures.busy():
                received, n, msg = waiting[0]
                if isinstance(msg, Close):        # its passes are done: the figures, and the stream ends
                    figures.extra.update(judge.figures(), inbox_max_depth=max(i.max_depth for i in inps))
                    send(outs[n], Closed(figures=figures.snapshot()), timeout=60.0)
                    open_.discard(n)
                    done = [waiting[0]]
                elif isinstance(msg, Constrain):  # the rule the stream's next passes pick under
                    judge.constrain(n, msg.rule)
                    done = [waiting[0]]
                elif isinstance(msg, PASSES):
                    done = turns.choose(waiting)
                    for (_, m, pass_), got in zip(done, judge.run([(m, pass_) for _, m, pass_ in done])):
                        _answer(outs[m], pass_, got)
                else:
                    raise ValueError(f"target: unexpected message {msg.kind!r}")
                for item in done:
                    waiting.remove(item)
                    item[0].release()


class _Judge:
    """The target model and what it holds per stream: its runner (pools), its verifier (sampler, rule), and for
    several streams the batch that runs their passes together (models/streams.py)."""

    def __init__(self, cfg: Config, spec: RingSpec, streams: int):
        opts = cfg.model.runner_options(trees=cfg.draft.siblings > 0)
        runner = Runner(cfg.target.dir, spec, opts)
        self.exactness = check(runner)            # the single-stream graph: a stream's attention nodes in any pass
        if streams > 1:
            del runner                            # its session and pools: each stream has its own pools below
            self.batch = Streams(cfg.target.dir, spec, streams, opts, cfg.model.graph_sizes(streams))
            self.runners = self.batch.runners
        else:
            runner.reserve()                      # the arena at its high-water mark before the first line
            self.batch, self.runners = None, [runner]
        self.params = cfg.sampling.params()
        # each stream's sampler is consumed in the serial engine's order: pick, judge
        self.verifiers = [LocalVerifier(r, cfg.sampling.seed) for r in self.runners]
        if cfg.replay.scored:                     # the stream's scored passes leave these tokens' rows off the head
            unscored = unscored_tokens(cfg.target.tokenizer, cfg.replay.score_every_token)
            for verifier in self.verifiers:
                verifier.unscored = unscored
        self.model = cfg.target
        self.table = None                         # the vocabulary's token texts, read at the first rule

    @property
    def widest(self) -> int:
        """Streams one pass can carry."""
        return 1 if self.batch is None else self.batch.widest

    def constrain(self, n: int, rule) -> None:
        if self.table is None and rule is not None:
            self.table = TokenTable.of(self.model.tokenizer)
        self.verifiers[n].constrain(rule_from(rule, self.table))

    def run(self, passes: list[tuple[int, Prefill | Verify]]) -> list:
        """Each (stream, pass)'s result, the passes run together (one per stream)."""
        if self.batch is None:
            (n, msg), = passes
            return [self.verifiers[n].drive(self._coroutine(n, msg))]
        slots = [None] * len(self.runners)
        for n, msg in passes:
            slots[n] = self._coroutine(n, msg)
        by_stream = self.batch.run(slots)
        return [by_stream[n] for n, _ in passes]

    def _coroutine(self, n: int, msg):
        """The pass a message of stream n asks for, as its verifier's coroutine."""
        verifier = self.verifiers[n]
        if isinstance(msg, Prefill):
            chaos("target.prefill")              # armed just after a restart, it hits during the window's refill
            return verifier.prefill_pass(msg.ids, msg.pos, msg.mask, msg.slots, self.params if msg.pick else None,
                                         msg.score, recent=msg.recent, ring_from=msg.ring_from,
                                         rule_state=msg.rule_state)
        blk = Block(msg.ids, msg.parent, msg.q, msg.pos, None, msg.recent, msg.slots, msg.path, msg.ring_from)
        return verifier.verify_pass(blk, msg.mask, self.params, msg.rule_state)

    def figures(self) -> dict:
        runners, batch = self.runners, self.batch
        return dict(forward_s=sum(r.forward_s for r in runners), forward_calls=sum(r.forward_calls for r in runners),
                    forward_rows=sum(r.forward_rows for r in runners),
                    passes=runners[0].forward_calls if batch is None else batch.passes,
                    passes_by_graph={} if batch is None else batch.passes_by_size,
                    kv_pool_mb=sum(r.pool_bytes for r in runners) / 2**20)


def _answer(out: Channel, msg: Prefill | Verify, got) -> None:
    """A pass's result to its stream's owner: a prefill's scores and picked token (each when asked), a block's
    verdict."""
    if isinstance(msg, Prefill):
        if msg.score:
            send(out, Scored(nll=got.nll), timeout=60.0)
        if msg.pick:
            send(out, Picked(next=got.next), timeout=60.0)
        return
    chaos("target.verified")                     # fault injection, test-only: K/V stored, the verdict not sent
    send(out, Verdict(epoch=msg.epoch, block=msg.block, rows=got.rows.tolist(), next=got.next,
                      t0=got.t0, t1=time.perf_counter(), forward_s=got.forward_s), timeout=60.0)


class _Turns:
    """Which waiting passes run next (`_one_pass`), keeping count of the passes the front was passed over for."""

    def __init__(self, widest: int):
        self.widest = widest
        self.skipped = (None, 0)                  # (the front of `waiting`, passes it was passed over for, so far)

    def choose(self, waiting: deque) -> list:
        front = waiting[0]
        passed_over = self.skipped[1] if self.skipped[0] is front else 0
        chosen = _one_pass(waiting, self.widest, passed_over)
        self.skipped = (None, 0) if any(item is front for item in chosen) else (front, passed_over + 1)
        return chosen


class _Inboxes:
    """The streams' inboxes, heard at once: stream n's messages come on inbox n, in their order."""

    def __init__(self, inps: list[Channel]):
        self.inps = inps
        self.selector = Selector(inps)

    def take(self, waiting: deque, most: int) -> bool:
        """Top up `waiting` with (received, stream, message): wait up to 0.2 s for a first message, then take what
        is there without waiting (at most `most` held). False: nothing to handle yet (a stop is seen within 0.2 s)."""
        if not waiting and not self.selector.wait(0.2):
            return False
        for n, inp in enumerate(self.inps):
            while len(waiting) < most and inp.ready():
                received = inp.recv(timeout=1.0)
                waiting.append((received, n, decode(received)))
        return bool(waiting)


def _one_pass(waiting: deque, slots: int, passed_over: int = 0) -> list:
    """The passes that run together: each stream's first waiting pass (a stream's later pass waits for its earlier
    one), up to the first message that is not a pass (it must see the passes before it done), in arrival order while
    a slot of the widest graph is free and the rows fit (models/streams.py `pack`: SOFTMAX_ROWS in all, an idle slot
    as 2 rows, a 1-row pass as 2).

    Answers first: while some stream's pass answers (a verify block, or a chunk whose next token is picked), other
    streams' feed chunks wait, so an answer's step costs a few rows (often in the single-stream graph), not a 32-row
    chunk beside it; the longest waiting pass (the front) is passed over at most ANSWER_FIRST times (`passed_over`:
    so far), so feeding goes on while answers are made."""
    firsts, seen = [], set()
    for item in waiting:
        _, n, msg = item
        if not isinstance(msg, PASSES):
            break
        if n not in seen:
            seen.add(n)
            firsts.append(item)
    answers = [item for item in firsts if _answers(item[2])]
    if answers and passed_over < ANSWER_FIRST:
        firsts = answers
    return [firsts[i] for i in pack([len(item[2].ids) for item in firsts], slots)]


def _answers(msg) -> bool:
    """A pass someone waits on: a verify block, or a chunk whose next token is picked (an answer's first)."""
    return isinstance(msg, Verify) or msg.pick

"""Several streams in one pass (models/streams.py): a stream's logits, surprisal and K/V in a pass it shares with
other streams are the bits it gets alone through the single-stream graph, whatever else rides along (issue 21's
exactness). Each stream is decoded alone first, every pass recorded (arguments, outputs, stores); the passes are then
replayed together, pass i of every stream in one pass, each stream's pools in its own pools-only runner."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import actors.target as target_actor
from actors.args import TargetArgs
from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.graph import SOFTMAX_ROWS
from models.runner import Runner, RunnerOptions
from models.streams import Rows, Streams
from pipeline.decode.blocks import Block
from pipeline.decode.drafts.suffix import SuffixDraft
from pipeline.decode.engine import Engine
from pipeline.decode.local import LocalVerifier
from pipeline.messages import Constrain, Prefill, Verify
from tests import procs
from tests.tiny_gguf import converted_tiny

SPEC = RingSpec(sink=4, window=32, ring=48)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return converted_tiny(tmp_path_factory.mktemp("streams"), weight_type="Q4_1", tied=False, seed=5)


class Recording(Runner):
    """A runner that keeps a copy of every pass: its arguments, its outputs and the stores after it."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.passes: list[dict] = []

    def forward(self, tokens, positions, mask, logit_rows=None, recent_slots=None, path=None, ring_from=0,
                targets=None):
        logits = super().forward(tokens, positions, mask, logit_rows, recent_slots, path, ring_from, targets)
        copy = (lambda a: None if a is None else np.array(a, copy=True))
        self.passes.append({"rows": Rows(copy(tokens), copy(positions), copy(mask), copy(logit_rows),
                                         copy(recent_slots), copy(path), ring_from, copy(targets)),
                            "logits": logits.copy(), "nll": self.nll.copy(), "k": self.new_k.copy(),
                            "v": self.new_v.copy(), "stores": []})
        return logits

    def store(self, rows, slots):
        super().store(rows, slots)
        self.passes[-1]["stores"].append((np.array(rows), np.array(slots)))


def decode_alone(model_dir: Path, opts: RunnerOptions, text: np.ndarray, question: np.ndarray, tokens: int,
                 score: bool) -> list[dict]:
    """One stream alone: its text fed (scored or not), then a question answered greedily with the stream's own
    suffix draft proposing (multi-row verify blocks); every target pass recorded."""
    runner = Recording(model_dir, SPEC, opts)
    engine = Engine(runner, None, draft=SuffixDraft())
    engine.feed(text, score=score)
    engine.generate(question, tokens)
    return runner.passes


def replay_together(streams: Streams, recorded: list[list[dict]], delays: list[int]) -> int:
    """Replays every stream's passes in shared passes: stream n joins at shared pass delays[n], and each shared pass
    takes the next pass of every waiting stream while the rows fit (SOFTMAX_ROWS, an idle stream counting 2; the
    first stream asked turns round; at most the widest graph's slots of streams). Asserts every stream's outputs are
    its recorded ones, bit for bit. Returns the number of shared passes that carried two or more streams."""
    n_streams, done, shared, i = len(recorded), [0] * len(recorded), 0, 0
    rows = (lambda p: max(len(p["rows"].tokens), 2))
    while any(d < len(r) for d, r in zip(done, recorded)):
        now, budget, free = [None] * n_streams, SOFTMAX_ROWS - 2 * streams.widest, streams.widest
        for n in ((i + k) % n_streams for k in range(n_streams)):
            if i >= delays[n] and done[n] < len(recorded[n]) and rows(recorded[n][done[n]]) - 2 <= budget and free:
                now[n] = recorded[n][done[n]]
                budget, free = budget - (rows(now[n]) - 2), free - 1
        got = streams.forward([None if p is None else p["rows"] for p in now])
        shared += sum(p is not None for p in now) >= 2
        for n, (p, logits, runner) in enumerate(zip(now, got, streams.runners)):
            if p is None:
                assert logits is None
                continue
            where = f"stream {n}, its pass {done[n]}"
            assert np.array_equal(logits, p["logits"]), where + ": logits"
            assert np.array_equal(runner.nll, p["nll"]), where + ": surprisal"
            assert np.array_equal(runner.new_k, p["k"]) and np.array_equal(runner.new_v, p["v"]), where + ": K/V"
            for stored_rows, slots in p["stores"]:
                runner.store(stored_rows, slots)
            done[n] += 1
        i += 1
    return shared


def texts(n: int, length: int) -> list[np.ndarray]:
    """Different token streams, of different lengths (the first wraps the ring)."""
    rng = np.random.default_rng(11)
    return [rng.integers(3, 200, length + 37 * i) for i in range(n)]


@pytest.mark.parametrize("trees", [False, True])
def test_each_of_three_streams_gets_its_alone_bits_in_shared_passes(tiny, trees):
    opts = RunnerOptions(threads=2, max_rows=16, kernel="nbits", trees=trees)
    recorded = [decode_alone(tiny, opts, text, np.array([5, 6, 7]), 24, score=n == 1)
                for n, text in enumerate(texts(3, 90))]
    streams = Streams(tiny, SPEC, 3, opts, sizes=(1, 2, 3))
    shared = replay_together(streams, recorded, delays=[0, 1, 3])
    assert shared >= 8                                    # the replay did share passes (not one stream at a time)
    assert all(len(r) > 5 for r in recorded)
    # every graph ran passes, so streams moved between graphs and slots (stream 1: slot 1 beside stream 0, slot 0
    # once stream 0 is done), each pass binding the pools of the stream now in a slot
    assert all(passes > 0 for passes in streams.passes_by_size.values()), streams.passes_by_size


def test_four_streams_taking_turns_in_a_two_slot_graph_get_their_alone_bits(tiny):
    """More streams than the widest graph has slots (`model.pass_streams`): a slot carries one stream's rows, then
    another's (its pools bound in their place), and each stream still gets its alone bits."""
    opts = RunnerOptions(threads=2, max_rows=16, kernel="nbits")
    recorded = [decode_alone(tiny, opts, text, np.array([5, 6, 7]), 16, score=False) for text in texts(4, 70)]
    streams = Streams(tiny, SPEC, 4, opts, sizes=(1, 2))
    assert streams.widest == 2
    shared = replay_together(streams, recorded, delays=[0, 0, 1, 2])
    assert shared >= 8
    assert set(streams.passes_by_size) == {"1", "2"}


def test_a_pass_never_carries_more_rows_than_the_batch_invariant_range(tiny):
    streams = Streams(tiny, SPEC, 3, RunnerOptions(threads=1, max_rows=32, kernel="nbits"))
    full = np.zeros((32, SPEC.sink + 1 + 32), np.float32)
    rows = Rows(np.arange(32), np.arange(32), full)
    with pytest.raises(ValueError, match="at most 64"):
        streams.forward([rows, rows, None])              # 32 + 32 + 2 idle rows
    with pytest.raises(ValueError, match="3 streams"):
        streams.forward([rows, None])
    two = Rows(np.arange(2), np.arange(2), full[:2, :SPEC.sink + 1 + 2])
    narrow = Streams(tiny, SPEC, 3, RunnerOptions(threads=1, max_rows=32, kernel="nbits"), sizes=(2,))
    with pytest.raises(ValueError, match="widest graph has 2 slots"):
        narrow.forward([two, two, two])                  # more streams than slots


LOGS = ("tep_alarms/filter/text_alarms_filter_2.csv", "loghub/BGL_2k.log", "loghub/Zookeeper_2k.log")


def test_three_logs_on_the_real_model_get_their_alone_bits_in_shared_passes(default_gguf, monkeypatch):
    """The default profile (its draft proposing, so verify blocks of several rows), three different logs, each fed
    and then asked a question alone, then replayed together."""
    import pipeline.decode.assemble as assemble
    from models.tokenizer import Tokenizer
    from pipeline import config
    from tests.paths import SHARED

    monkeypatch.setattr(assemble, "Runner", Recording)
    tok = Tokenizer.from_gguf(default_gguf)
    question = tok.encode("\nQuestion: what is the latest alarm?\nAnswer:")
    recorded, cfg = [], config.parse({})
    for log in LOGS:
        engine = assemble.make_engine(cfg, check_rows=False)
        lines = (SHARED / "data" / log).read_text(errors="replace").splitlines()[1:40]
        engine.feed(tok.encode("\n".join(lines))[:500])
        engine.generate(question, 24)
        recorded.append(engine.runner.passes)
    runner = engine.runner
    streams = Streams(runner.model_dir, runner.spec, 3, runner.opts)     # the target's graphs: 1 and 3 slots
    shared = replay_together(streams, recorded, delays=[0, 2, 5])
    assert shared >= 10
    assert streams.passes_by_size["1"] > 0 and streams.passes_by_size["3"] > 0


class RecordingVerifier(LocalVerifier):
    """The serial engine's verifier, keeping every call (arguments copied) and its result."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls: list[tuple[str, tuple, dict, object]] = []

    def prefill(self, *args, **kw):
        got = super().prefill(*args, **kw)
        self.calls.append(("prefill_pass", _copied(args), _copied(kw), dataclasses.replace(
            got, nll=_copied(got.nll), logits=_copied(got.logits))))
        return got

    def verify(self, *args, **kw):
        got = super().verify(*args, **kw)
        self.calls.append(("verify_pass", _copied(args), _copied(kw), dataclasses.replace(got, rows=got.rows.copy())))
        return got


def _copied(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, tuple):
        return tuple(_copied(a) for a in x)
    if isinstance(x, dict):
        return {k: _copied(v) for k, v in x.items()}
    if isinstance(x, Block):
        return Block(*(_copied(getattr(x, f.name)) for f in dataclasses.fields(x)))
    return x


def test_three_streams_verifiers_judge_and_pick_in_shared_passes_as_alone(tiny):
    """What the target actor does with several streams: each stream's verifier (its own sampler) runs its prefill
    and verify passes as coroutines, several streams' in one pass (`Streams.run`); the verdicts, picks and
    surprisal are the ones each stream got alone, sampling included."""
    opts = RunnerOptions(threads=2, max_rows=16, kernel="nbits")
    params = SamplingParams(temperature=0.9, top_k=40, seed=4)
    recorded = []
    for n, text in enumerate(texts(3, 70)):
        engine = Engine(Runner(tiny, SPEC, opts), None, draft=SuffixDraft(), seed=n)
        engine.verifier = RecordingVerifier(engine.runner, n)        # as built, recording
        engine.feed(text, score=n != 1)
        engine.generate(np.array([5, 6, 7]), 20, params)
        recorded.append(engine.verifier.calls)
    streams = Streams(tiny, SPEC, 3, opts)
    verifiers = [LocalVerifier(runner, n) for n, runner in enumerate(streams.runners)]
    done, shared, turn = [0, 0, 0], 0, 0
    while any(d < len(r) for d, r in zip(done, recorded)):
        calls = [r[d] if d < len(r) and (turn >= 2 * n) else None for n, (r, d) in enumerate(zip(recorded, done))]
        passes = [None if c is None else getattr(v, c[0])(*c[1], **c[2]) for v, c in zip(verifiers, calls)]
        shared += sum(c is not None for c in calls) >= 2
        for n, (c, got) in enumerate(zip(calls, streams.run(passes))):
            if c is None:
                continue
            want, where = c[3], f"stream {n}, call {done[n]} ({c[0]})"
            if c[0] == "verify_pass":
                assert (got.rows.tolist(), got.next) == (want.rows.tolist(), want.next), where
            else:
                assert got.next == want.next and np.array_equal(got.logits, want.logits), where
                assert (got.nll is None) == (want.nll is None), where
                assert got.nll is None or np.array_equal(got.nll, want.nll, equal_nan=True), where
            done[n] += 1
        turn += 1
    assert shared >= 8 and sum(c[0] == "verify_pass" for r in recorded for c in r) >= 6


def _as_message(n: int, block: int, call: tuple):
    """A recorded verifier call as the cache owner's message for stream n."""
    kind, args, kw = call[:3]
    if kind == "prefill_pass":
        ids, pos, mask, slots = args
        recent = kw.get("recent")
        return Prefill(pick=kw.get("pick") is not None, score=bool(kw.get("score")),
                       ring_from=kw.get("ring_from", 0), rule_state=kw.get("rule_state"), ids=ids, pos=pos,
                       mask=mask, recent=np.zeros(0, np.int64) if recent is None else recent, slots=slots)
    blk, mask = args[0], args[1]
    return Verify(epoch=0, block=block, ring_from=blk.ring_from, rule_state=args[3] if len(args) > 3 else
                  None, ids=blk.tokens, pos=blk.pos, mask=mask, parent=blk.parent, recent=blk.recent,
                  slots=blk.slots, q=blk.q, path=blk.path)


def _replies(call: tuple) -> list[tuple]:
    """What the target actor answers a recorded call with: a prefill Scored and/or Picked (or nothing), a block its
    Verdict."""
    kind, _, kw, got = call
    if kind == "verify_pass":
        return [("Verdict", got.rows.tolist(), got.next)]
    return ([("Scored", got.nll)] if kw.get("score") else []) + ([("Picked", got.next)] if kw.get("pick") else [])


def test_the_target_actor_answers_three_streams_passes_as_each_got_alone(default_gguf, tmp_path):
    """The target actor, a real process on shared-memory channels, with three streams: a stand-in owner sends the
    three logs' passes (recorded alone through the serial engine) interleaved without waiting, so the actor batches
    what waits; every Scored, Picked and Verdict is what the stream got alone."""
    import pipeline.decode.assemble as assemble
    from models.tokenizer import Tokenizer
    from pipeline import config
    from pipeline.channel import Channel, ChannelSpec, Selector
    from pipeline.config import ring_spec
    from pipeline.messages import Close, Closed, Ready, Scored, Verdict, decode, send
    from pipeline.process import StopFlag
    from tests.paths import SHARED

    cfg = config.parse({})
    tok = Tokenizer.from_gguf(default_gguf)
    question = tok.encode("\nQuestion: what is the latest alarm?\nAnswer:")
    recorded = []
    for n, log in enumerate(LOGS):
        engine = assemble.make_engine(cfg, check_rows=False)
        engine.verifier = RecordingVerifier(engine.runner, cfg.sampling.seed)
        lines = (SHARED / "data" / log).read_text(errors="replace").splitlines()[1:40]
        engine.feed(tok.encode("\n".join(lines))[:300], score=n == 2)
        engine.generate(question, 16)
        recorded.append(engine.verifier.calls)
    tag = f"t{os.getpid()}"
    inboxes = [ChannelSpec(f"{tag}_to_target{n}", slots=8, payload_bytes=8 << 20) for n in range(3)]
    replies = [ChannelSpec(f"{tag}_from_target{n}", slots=64, payload_bytes=1 << 20) for n in range(3)]
    stop = StopFlag(str(tmp_path / "stop"))
    with contextlib.ExitStack() as held:
        backs = [held.enter_context(Channel.create(r)) for r in replies]
        actor = held.enter_context(procs.actor(target_actor.run, TargetArgs(
            inboxes=tuple(inboxes), outboxes=tuple(r.name for r in replies), cfg=cfg, spec=ring_spec(cfg), stop=stop)))
        for back in backs:
            assert isinstance(decode(back.recv(timeout=300)), Ready)
        tos = [Channel.attach(i.name, timeout=60) for i in inboxes]
        order = [(n, i) for i in range(max(map(len, recorded))) for n in range(3) if i < len(recorded[n])]
        sender = threading.Thread(target=lambda: [send(tos[n], _as_message(n, i, recorded[n][i]), timeout=60)
                                                  for n, i in order], daemon=True)
        sender.start()
        expected = [[reply for call in calls for reply in _replies(call)] for calls in recorded]
        selector = Selector(backs)
        done = [0, 0, 0]
        while sum(done) < sum(map(len, expected)):
            ready = selector.wait(120)
            assert ready, f"no answer within 120 s; {done} of {list(map(len, expected))}"
            n = backs.index(ready[0])
            with ready[0].recv(timeout=1) as received:
                msg = decode(received)
                want, where = expected[n][done[n]], f"stream {n}, reply {done[n]}"
                assert type(msg).__name__ == want[0], where
                if isinstance(msg, Verdict):
                    assert (msg.rows, msg.next) == want[1:], where
                elif isinstance(msg, Scored):
                    assert np.array_equal(msg.nll, want[1], equal_nan=True), where
                else:
                    assert msg.next == want[1], where
                done[n] += 1
        sender.join(timeout=60)
        for n in (1, 0, 2):                   # the actor ends once every stream has closed
            assert actor.is_alive()
            send(tos[n], Close(), timeout=60)
            closed = decode(backs[n].recv(timeout=60))
            assert isinstance(closed, Closed) and closed.figures["forward_calls"] >= sum(map(len, recorded))
        assert closed.figures["kv_pool_mb"] > 0 and closed.figures["passes"] <= closed.figures["forward_calls"]
        actor.join(timeout=30)
        assert actor.exitcode == 0


def _waiting(*items):
    """Stand-in inbox contents for `_one_pass`: ("p", stream, rows) a feed chunk, ("a", stream, rows) a pass that
    answers (a chunk whose next token is picked), ("c", stream) a Constrain."""
    out = []
    for item in items:
        if item[0] in "pa":
            msg = Prefill(pick=item[0] == "a", score=False, ring_from=0, ids=np.zeros(item[2], np.int64),
                          pos=np.zeros(0, np.int64), mask=np.zeros((0, 0), np.float32), recent=np.zeros(0, np.int64),
                          slots=np.zeros(0, np.int64))
        else:
            msg = Constrain(rule=None)
        out.append((object(), item[1], msg))
    return out


def test_a_pass_takes_each_streams_first_waiting_pass_in_order_within_the_rows():
    pick = (lambda waiting, streams: [(n, len(m.ids)) for _, n, m in target_actor._one_pass(waiting, streams)])
    # one per stream, the earliest; a stream's second pass waits even if another stream's comes after it
    assert pick(_waiting(("p", 0, 7), ("p", 0, 7), ("p", 1, 1), ("p", 2, 32)), 3) == [(0, 7), (1, 1), (2, 32)]
    # a Constrain ends the pass's choice: the passes after it must see it applied
    assert pick(_waiting(("p", 1, 7), ("c", 0), ("p", 0, 7)), 3) == [(1, 7)]
    # 64 rows in all, an idle stream riding as 2: 32 + 32 + 2 idle > 64, so stream 2's pass waits; stream 3's fits
    assert pick(_waiting(("p", 0, 32), ("p", 2, 32), ("p", 1, 20), ("p", 3, 2)), 4) == [(0, 32), (1, 20), (3, 2)]
    # one stream: one pass at a time
    assert pick(_waiting(("p", 0, 7), ("p", 0, 7)), 1) == [(0, 7)]
    # a graph of two streams' slots (`model.pass_streams`): two streams' passes, the third's next time
    assert pick(_waiting(("p", 0, 2), ("p", 1, 2), ("p", 2, 2)), 2) == [(0, 2), (1, 2)]


def test_answers_go_first_and_the_longest_waiting_feed_chunk_is_passed_over_at_most_answer_first_times():
    pick = (lambda waiting, over: [(n, len(m.ids)) for _, n, m in target_actor._one_pass(waiting, 3, over)])
    waiting = _waiting(("p", 0, 32), ("a", 1, 7), ("p", 2, 32), ("a", 2, 1))
    # stream 1 answers: the feed chunks of streams 0 and 2 wait (stream 2's answer waits behind its own chunk)
    assert pick(waiting, 0) == [(1, 7)]
    assert pick(waiting, target_actor.ANSWER_FIRST - 1) == [(1, 7)]
    # the front has been passed over ANSWER_FIRST times: everything that fits rides, in arrival order
    assert pick(waiting, target_actor.ANSWER_FIRST) == [(0, 32), (1, 7)]
    # no answer waiting: feed chunks ride together
    assert pick(_waiting(("p", 0, 16), ("p", 1, 16)), 0) == [(0, 16), (1, 16)]

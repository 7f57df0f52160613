"""One draft actor serves every stream of a node (actors/draft.py): a real process on shared-memory channels, three
streams' messages sent interleaved, a draft model on one session for all of them; each stream's proposals are what
the same actor sends it when it serves that stream alone."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

from actors import draft as draft_actor
from actors.args import DraftArgs
from pipeline import config
from pipeline.channel import Channel, ChannelSpec
from pipeline.config import ring_spec
from pipeline.decode.drafts.model import speaks
from pipeline.messages import Close, Closed, Commit, Observe, Proposal, Restart, decode, send
from pipeline.process import StopFlag
from tests import procs
from tests.tiny_gguf import write_tiny_gguf

TEXTS = [np.random.default_rng(seed).integers(3, 200, 40) for seed in (1, 2, 3)]   # wraps the 16-slot ring


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft_streams")
    write_tiny_gguf(root / "target.gguf", seed=11, tied=False)
    write_tiny_gguf(root / "draft.gguf", seed=11, tied=False, rms_eps=2.0)
    return config.load(None, {"model.gguf": str(root / "target.gguf"), "model.max_rows": 16, "cache.sink": 4,
                              "cache.window": 16, "draft.kind": "model", "draft.model": str(root / "draft.gguf"),
                              "draft.length": 4, "draft.threads": 1, "sampling.temperature": 0.0})


def _serve(cfg, streams: list[int], tmp_path) -> dict[int, list[tuple]]:
    """Start the draft actor for `streams` (indices into TEXTS), play each one generation (its text observed, a
    restart, two blocks out, the first committed whole, a third block) with the streams' messages interleaved, and
    return each stream's proposals as (epoch, block, n, pending, tokens, parent)."""
    vocab = speaks(cfg.draft_model.card)
    tag = f"d{os.getpid()}_{''.join(map(str, streams))}"
    inboxes = [ChannelSpec(f"{tag}_to_draft{n}", slots=64, payload_bytes=64 << 10) for n in streams]
    replies = [ChannelSpec(f"{tag}_from_draft{n}", slots=16, payload_bytes=64 << 10) for n in streams]
    stop = StopFlag(str(tmp_path / f"stop{tag}"))
    got: dict[int, list[tuple]] = {n: [] for n in streams}
    with contextlib.ExitStack() as held:
        backs = [held.enter_context(Channel.create(r)) for r in replies]
        actor = held.enter_context(procs.actor(draft_actor.run, DraftArgs(
            inboxes=tuple(inboxes), outboxes=tuple(r.name for r in replies), cfg=cfg, spec=ring_spec(cfg), vocab=vocab,
            stop=stop)))
        tos = [held.enter_context(Channel.attach(i.name, timeout=120)) for i in inboxes]

        def proposal(i: int) -> Proposal:
            with backs[i].recv(timeout=60) as received:
                msg = decode(received)
            assert isinstance(msg, Proposal), msg
            got[streams[i]].append((msg.epoch, msg.block, msg.n, msg.pending, msg.tokens.tolist(),
                                    msg.parent.tolist()))
            return msg

        for i, n in enumerate(streams):
            send(tos[i], Observe(ids=TEXTS[n][:-1]), timeout=10)
        for i, n in enumerate(streams):
            send(tos[i], Restart(epoch=1, n=len(TEXTS[n]) - 1, pending=int(TEXTS[n][-1]), budget=24, length=-1,
                                 ids=np.zeros(0, np.int64)), timeout=10)
        firsts = [[proposal(i), proposal(i)][0] for i in range(len(streams))]     # AHEAD blocks each
        for i, first in enumerate(firsts):
            send(tos[i], Commit(epoch=1, length=-1, ids=np.array([first.pending, *first.tokens], np.int64)),
                 timeout=10)
        for i in range(len(streams)):
            proposal(i)
        for i in range(len(streams)):
            assert actor.is_alive()                       # it ends once every stream has closed
            send(tos[i], Close(), timeout=10)
            with backs[i].recv(timeout=60) as received:
                closed = decode(received)
            assert isinstance(closed, Closed) and closed.figures["proposals"] == 3
        actor.join(timeout=30)
        assert actor.exitcode == 0
    return got


def test_one_draft_actor_proposes_to_each_of_three_streams_what_it_proposes_to_that_stream_alone(cfg, tmp_path):
    alone = {n: _serve(cfg, [n], tmp_path)[n] for n in range(len(TEXTS))}
    shared = _serve(cfg, list(range(len(TEXTS))), tmp_path)
    for n in range(len(TEXTS)):
        assert len(alone[n]) == 3 and any(p[4] for p in alone[n]), f"stream {n} drafted nothing"
        assert shared[n] == alone[n], f"stream {n}"
    assert len({str(p) for p in alone.values()}) == len(TEXTS)      # three texts, three different drafts

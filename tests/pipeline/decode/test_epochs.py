"""Epochs between the step and the draft actor (pipeline/decode/deferred.py `DraftLink`): the step takes only the
current epoch's proposal for the block it is at, and only if it assumed the step's position and pending token; any
other is dropped and counted stale, and a restart opens a new epoch. The test stands where the draft actor stands,
over real channels in this process.
"""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from pipeline.channel import Channel, ChannelSpec
from pipeline.decode.deferred import DraftLink, Links
from pipeline.decode.step import Stats
from pipeline.messages import Commit, Proposal, Restart, decode, send


class DraftEnd:
    """The draft actor's end: what the step sent, and proposals sent back."""

    def __init__(self):
        tag = uuid.uuid4().hex[:8]
        # a channel is created by its reader and attached by its writer
        self.to_draft = Channel.create(ChannelSpec(f"test_ep_to_{tag}", slots=8, payload_bytes=4096))
        self.link_to_draft = Channel.attach(self.to_draft.spec.name)
        self.link_from_draft = Channel.create(ChannelSpec(f"test_ep_from_{tag}", slots=8, payload_bytes=4096))
        self.from_draft = Channel.attach(self.link_from_draft.spec.name)
        self.from_target = Channel.create(ChannelSpec(f"test_ep_tgt_{tag}", slots=2, payload_bytes=1024))

    def received(self):
        with self.to_draft.recv(timeout=5.0) as got:
            return decode(got)

    def propose(self, epoch: int, block: int, n: int, pending: int, tokens=(7, 8)) -> None:
        send(self.from_draft, Proposal(epoch=epoch, block=block, n=n, pending=pending, t0=0.0, t1=0.25,
                                       tokens=np.array(tokens, np.int64), parent=np.arange(len(tokens)) - 1, q=None),
             timeout=5.0)

    def close(self) -> None:
        for ch in (self.link_to_draft, self.from_draft, self.to_draft, self.link_from_draft, self.from_target):
            ch.__exit__(None, None, None)


@pytest.fixture
def draft():
    end = DraftEnd()
    link = DraftLink(Links(None, end.from_target, end.link_to_draft, end.link_from_draft))
    yield end, link
    end.close()


def test_a_proposal_of_an_old_epoch_or_another_position_is_dropped_and_the_draft_restarted_there(draft):
    end, link = draft
    link.start(pending=5, n=10, budget=20)
    first = end.received()
    assert isinstance(first, Restart) and (first.epoch, first.n, first.pending) == (1, 10, 5)
    end.propose(epoch=0, block=0, n=10, pending=5)          # from before the restart: stale however it fits
    end.propose(epoch=1, block=0, n=9, pending=5)           # this epoch, but it assumed another position
    stats = Stats()
    # the second is taken from the channel, found not to fit: a restart at (10, 5) under epoch 2, then the answer
    end.propose(epoch=2, block=0, n=10, pending=5, tokens=(3, 4, 6))
    got = link.propose(pending=5, n=10, k=3, room=31, budget=20, stats=stats)
    again = end.received()
    assert isinstance(again, Restart) and (again.epoch, again.n, again.pending) == (2, 10, 5)
    assert list(got.prop.tokens) == [3, 4, 6] and not got.ahead
    assert stats.stale == 2 and stats.wasted_draft_s == pytest.approx(0.5)


def test_after_a_whole_block_the_next_is_taken_from_the_same_epoch_and_a_rejection_opens_a_new_one(draft):
    end, link = draft
    link.start(pending=5, n=10, budget=20)
    end.received()
    end.propose(epoch=1, block=0, n=10, pending=5)
    link.propose(pending=5, n=10, k=2, room=31, budget=20, stats=Stats())
    link.verdict(np.array([5, 7, 8]), n=13, nxt=9, whole=True, budget=17)
    commit = end.received()
    assert isinstance(commit, Commit) and commit.epoch == 1 and list(commit.ids) == [5, 7, 8]
    end.propose(epoch=1, block=0, n=10, pending=5, tokens=(1,))     # a duplicate of block 0: not what is asked for
    end.propose(epoch=1, block=1, n=13, pending=9)                  # drafted ahead on its guess 9: taken
    stats = Stats()
    got = link.propose(pending=9, n=13, k=2, room=31, budget=17, stats=stats)
    assert got.ahead and list(got.prop.tokens) == [7, 8] and stats.stale == 0
    link.verdict(np.array([9]), n=14, nxt=4, whole=False, budget=16)   # rejected: restart at the correction
    restart = end.received()
    assert isinstance(restart, Restart) and (restart.epoch, restart.n, restart.pending) == (2, 14, 4)
    assert list(restart.ids) == [9]
    end.propose(epoch=1, block=2, n=16, pending=0)                  # ran ahead under epoch 1: stale
    end.propose(epoch=2, block=0, n=14, pending=4, tokens=(2,))
    stats = Stats()
    got = link.propose(pending=4, n=14, k=2, room=31, budget=16, stats=stats)
    assert list(got.prop.tokens) == [2] and stats.stale == 2        # the epoch-1 block 2 and block 0 duplicate

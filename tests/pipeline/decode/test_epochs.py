"""Epochs between the step and the draft actor, each side over real channels in this process, the test standing in
for the other side.

The step's side (pipeline/decode/deferred.py `DraftLink`): it takes only the current epoch's proposal for the block it
is at, and only if it assumed the step's position and pending token; any other is dropped and counted stale, and a
restart opens a new epoch. The draft actor's side (actors/draft.py `Drafter`): every block carries the epoch of the
restart that began its run, at most two blocks are out at once, a commit of the block it assumed lets it run on, and
a commit of anything else stops it until the next restart, which drops its speculation.
"""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from pipeline.channel import Channel, ChannelSpec
from pipeline.decode.deferred import DraftLink, Links
from pipeline.decode.step import Stats
from pipeline.messages import Commit, Halt, Proposal, Restart, decode, send


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


class DraftActor:
    """actors/draft.py's Drafter with the stream proposer on a text that repeats 1..6, sending into a real channel."""

    def __init__(self):
        from actors.draft import Drafter
        from pipeline.decode.drafts.suffix import SuffixDraft
        from pipeline.decode.step import Policy
        from pipeline.process import Figures

        self.end = DraftEnd()
        class Draft(SuffixDraft):
            def __init__(self):
                super().__init__()
                self.rolled_back_to = []

            def rollback(self, position: int) -> None:
                self.rolled_back_to.append(position)
                super().rollback(position)

        self.draft = Draft()
        self.draft.observe(np.array([1, 2, 3, 4, 5, 6] * 6))         # 36 committed tokens
        self.drafter = Drafter(self.draft, Policy(length=3, max_rows=32), self.end.from_draft, Figures("draft"),
                               sink=4, window=256)

    def restart(self, epoch: int, n: int, pending: int, budget: int = 40) -> None:
        self.drafter.handle(Restart(epoch=epoch, n=n, pending=pending, budget=budget, length=-1,
                                    ids=np.zeros(0, np.int64)))

    def commit(self, epoch: int, ids) -> None:
        self.drafter.handle(Commit(epoch=epoch, length=-1, ids=np.array(ids, np.int64)))

    def drafted(self) -> Proposal:
        """Draft one block (the actor's loop does so while `busy`) and read what it sent."""
        assert self.drafter.busy
        self.drafter.draft_block()
        with self.end.link_from_draft.recv(timeout=5.0) as got:
            return decode(got)


@pytest.fixture
def actor():
    a = DraftActor()
    yield a
    a.end.close()


def test_the_draft_actor_tags_every_block_with_its_restarts_epoch_and_runs_at_most_two_ahead(actor):
    actor.restart(epoch=1, n=36, pending=1)
    first, second = actor.drafted(), actor.drafted()
    assert (first.epoch, first.block, first.n, first.pending, list(first.tokens)) == (1, 0, 36, 1, [2, 3, 4])
    # block 1 assumes block 0 accepted whole: it starts at 40 from the draft's own guess of the token after it
    assert (second.epoch, second.block, second.n, second.pending, list(second.tokens)) == (1, 1, 40, 5, [6, 1, 2])
    assert not actor.drafter.busy                                   # two blocks out: it waits for a verdict
    actor.commit(epoch=1, ids=[1, 2, 3, 4])                         # block 0 whole, as assumed: one more may go
    third = actor.drafted()
    assert (third.epoch, third.block, third.n, third.pending) == (1, 2, 44, 3)
    assert actor.draft.committed == 40 and not actor.drafter.busy


def test_a_commit_the_draft_did_not_assume_stops_it_until_a_restart_drops_its_speculation(actor):
    actor.restart(epoch=1, n=36, pending=1)
    actor.drafted()                                                 # one block out: it could draft another
    actor.commit(epoch=1, ids=[1, 2, 9])                            # block 0 rejected at its third row
    assert actor.draft.committed == 39 and not actor.drafter.busy   # nothing more under epoch 1
    with pytest.raises(RuntimeError, match="out of lockstep"):
        actor.restart(epoch=2, n=40, pending=5)                     # the owner must restart where the text ends
    actor.draft.rolled_back_to.clear()
    actor.restart(epoch=2, n=39, pending=1)
    assert actor.draft.rolled_back_to == [39]                       # a model draft's speculative rows are dropped
    got = actor.drafted()
    assert (got.epoch, got.block, got.n, got.pending) == (2, 0, 39, 1)
    actor.drafter.handle(Halt())                                    # the generation ended
    assert not actor.drafter.busy

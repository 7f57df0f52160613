"""RingIndex against a naive reference written straight from the cache policy, with a fake K/V pool.

The fake pool stores, per slot, (position, write id) of the K/V last written there, exactly where the host would
copy it. The reference knows which write each committed position's K/V came from; a state is correct when every
slot a row may see holds exactly the K/V the reference says that row attends to.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels.ring import NEG, RingIndex, RingSpec, mask_padding, passes, slot_of, visible_mask


class Naive:
    """Reference policy: a query at u sees committed positions in [0, S) or in [max(u-W+1, ring_start), u]."""

    def __init__(self, S, W, R):
        self.S, self.W, self.R = S, W, R
        self.n = 0
        self.ring_start = 0
        self.truth = {}  # committed position -> id of the write holding its K/V
        self.pending = {}  # written, uncommitted position -> write id
        self.pool = {}  # slot -> (position, write id): what the K/V pool physically holds
        self.next_id = 0

    def slot(self, u):
        return u if u < self.S else self.S + (u - self.S) % self.R

    def sees(self, u, truth=None):
        truth = self.truth if truth is None else truth
        lo = max(u - self.W + 1, self.ring_start)
        return sorted(v for v in truth if v <= u and (v < self.S or v >= lo))

    def intact(self, n, truth, pool):
        """Every committed position a query at n (or later) sees is physically in its slot."""
        return all(pool.get(self.slot(v)) == (v, truth[v]) for v in self.sees(n, truth))

    def write_ok(self, positions):
        slots = [self.slot(p) for p in positions]
        if len(set(slots)) < len(slots) or any(p < self.n for p in positions):
            return False
        pool = dict(self.pool)
        for s, p in zip(slots, positions):
            pool[s] = (p, -1)
        return self.intact(self.n, self.truth, pool)

    def write(self, positions, slots):
        assert list(slots) == [self.slot(p) for p in positions]
        for s, p in zip(slots, positions):  # the host copies the new rows' K/V into the returned slots
            self.pool[s] = (p, self.next_id)
            self.pending[p] = self.next_id
            self.next_id += 1

    def commit_ok(self, count):
        return count >= 0 and all(p in self.pending and self.pool.get(self.slot(p)) == (p, self.pending[p])
                                  for p in range(self.n, self.n + count))

    def commit(self, count):
        for p in range(self.n, self.n + count):
            self.truth[p] = self.pending.pop(p)
        self.n += count

    def rollback_ok(self, n_new):
        truth = {v: i for v, i in self.truth.items() if v < n_new}
        return self.ring_start <= n_new <= self.n and self.intact(n_new, truth, self.pool)

    def rollback(self, n_new):
        self.truth = {v: i for v, i in self.truth.items() if v < n_new}
        self.pending = {}
        self.n = n_new

    def evict_to_ok(self, position):
        return position >= self.n >= self.S

    def evict_to(self, position):
        self.truth = {v: i for v, i in self.truth.items() if v < self.S}
        self.pending = {}
        self.n = self.ring_start = position


def apply(index, naive, op, arg):
    """Run op on both; the index must refuse exactly what the reference says would break the cache."""
    before = (index.n, index.ring_start, index.slot_pos.copy())
    if not getattr(naive, op + "_ok")(arg):
        with pytest.raises(ValueError):
            getattr(index, op)(arg)
        assert (index.n, index.ring_start) == before[:2] and np.array_equal(index.slot_pos, before[2])
        return False
    result = getattr(index, op)(arg)
    if op == "write":
        naive.write(arg, result)
    else:
        getattr(naive, op)(arg)
    return True


def tree_ancestors(parents):
    """ancestors[r, j]: node j is on the path from node r to the root (r included)."""
    t = len(parents)
    anc = np.eye(t, dtype=bool)
    for r in range(t):
        j = parents[r]
        while j >= 0:
            anc[r, j] = True
            j = parents[j]
    return anc


def check(index, naive, row_pos, ancestors):
    """The mask shows each row exactly the K/V the reference says, and new rows by ancestry and window."""
    assert (index.n, index.ring_start) == (naive.n, naive.ring_start)
    P, t = index.pool_columns(index.n), len(row_pos)        # slots outside the view hold nothing a row sees
    mask = index.visible_mask(np.array(row_pos, dtype=np.int64), ancestors)
    assert mask.shape == (t, P + t) and mask.dtype == np.float32
    assert np.isfinite(mask).all() and np.isin(mask, [0.0, NEG]).all()
    anc = np.tri(t, dtype=bool) if ancestors is None else ancestors
    first = index.pool_view(index.n)[0]           # column S + k reads ring slot (first + k) mod R
    slot = [c if c < naive.S else naive.S + (first + c - naive.S) % index.spec.ring for c in range(P)]
    for r, u in enumerate(row_pos):
        shown = sorted(naive.pool.get(slot[c], (None, None)) for c in np.flatnonzero(mask[r, :P] == 0))
        assert shown == [(v, naive.truth[v]) for v in naive.sees(u)], (r, u)
        want = [bool(anc[r, j]) and (pj >= u - naive.W + 1 or pj < naive.S) for j, pj in enumerate(row_pos)]
        assert (mask[r, P:] == 0).tolist() == want


def advance(index, naive, count, chunk):
    """Write and commit `count` positions, `chunk` at a time (how a host prefills)."""
    while count > 0:
        k = min(chunk, count)
        assert apply(index, naive, "write", list(range(naive.n, naive.n + k)))
        assert apply(index, naive, "commit", k)
        count -= k


def make(S, W, R):
    return RingIndex(RingSpec(S, W, R)), Naive(S, W, R)


OPS = st.one_of(
    st.tuples(st.just("block"), st.integers(1, 6), st.integers(0, 6)),  # speculate k, accept a, discard the rest
    st.tuples(st.just("write"), st.integers(-3, 8), st.integers(1, 5)),  # write count positions from n + offset
    st.tuples(st.just("commit"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("rollback"), st.integers(0, 12), st.just(0)),  # back to n - back
    st.tuples(st.just("evict_to"), st.sampled_from([0, 3, 10_000_000, 2**31 - 2, 2**31 + 7, 2**40]),
              st.integers(0, 9)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S=st.integers(0, 3), W=st.integers(1, 6), slack=st.integers(0, 4),
       ops=st.lists(OPS, max_size=30), step=st.integers(1, 3), data=st.data())
def test_visible_mask_matches_naive_reference_under_random_operations(S, W, slack, ops, step, data):
    index, naive = make(S, W, W + slack)
    index.column_step = step                                # pool reads cut at a multiple of `step` ring slots
    for op, x, y in ops:
        n = naive.n
        if op == "block":
            if apply(index, naive, "write", list(range(n, n + x))):
                check(index, naive, list(range(n, n + x)), None)
                if apply(index, naive, "commit", min(x, y)):
                    apply(index, naive, "rollback", naive.n)
        elif op == "write":
            apply(index, naive, "write", list(range(n + x, n + x + y)))
        elif op == "commit":
            apply(index, naive, "commit", x)
        elif op == "rollback":
            apply(index, naive, "rollback", n - x)
        else:
            apply(index, naive, "evict_to", (n + x) if x < 100 else x + y)
        t = data.draw(st.integers(1, 5), label="rows")
        check(index, naive, list(range(naive.n, naive.n + t)), None)
        parents = [-1] + [data.draw(st.integers(0, j - 1), label="parent") for j in range(1, t)]
        depth = [0] * t
        for j in range(1, t):
            depth[j] = depth[parents[j]] + 1
        check(index, naive, [naive.n + d for d in depth], tree_ancestors(parents))


def test_rollback_after_wrap_keeps_window_intact():
    S, W, R = 2, 4, 7  # slack 3: blocks of up to 4 speculative positions
    index, naive = make(S, W, R)
    advance(index, naive, 15, chunk=4)
    block = [15, 16, 17]  # slots 8, 2, 3: the block wraps, overwriting positions 8, 9, 10
    assert index.write(block).tolist() == [8, 2, 3]
    naive.write(block, [8, 2, 3])
    assert apply(index, naive, "commit", 1)  # one accepted; 16 and 17 rejected
    assert apply(index, naive, "rollback", 16)
    assert index.slot_pos[[2, 3]].tolist() == [-1, -1]  # the rejected rows' slots are stale
    check(index, naive, [16, 17, 18], None)
    mask = index.visible_mask(np.array([16], dtype=np.int64))
    columns = index.column_positions(16)
    assert sorted(columns[mask[0, :len(columns)] == 0].tolist()) == [0, 1, 13, 14, 15]
    # the correction at 16 is rewritten over the stale slot: the next row sees the new K/V, not the rejected one
    assert apply(index, naive, "write", [16]) and apply(index, naive, "commit", 1)
    assert naive.pool[2] == (16, naive.truth[16]) and naive.truth[16] == naive.next_id - 1
    check(index, naive, [17, 18], None)


def test_ring_without_slack_corrupts_window_under_speculation():
    S, W = 1, 4
    index, naive = make(S, W, W)  # R == W: enough for one token at a time only
    advance(index, naive, 9, chunk=1)
    # two speculative positions: 10 would land on the slot of 6, which the query at 9 still sees ([6, 9])
    assert not naive.write_ok([9, 10])
    with pytest.raises(ValueError, match="slack"):
        index.write([9, 10])
    # what an unchecked host would do: write both, then both rejected -> roll back to 9
    pool = dict(naive.pool)
    for s, p in zip(slot_of([9, 10], S, W).tolist(), [9, 10]):
        pool[s] = (p, -1)
    assert pool[naive.slot(6)][0] == 10 and not naive.intact(9, naive.truth, pool)
    # one slack slot per extra speculative position fixes it
    index, naive = make(S, W, W + 1)
    advance(index, naive, 9, chunk=2)
    assert apply(index, naive, "write", [9, 10]) and apply(index, naive, "rollback", 9)
    check(index, naive, [9], None)


def test_rollback_refused_when_a_committed_span_overwrote_its_window():
    index, naive = make(1, 4, 6)  # slack 2
    advance(index, naive, 20, chunk=3)
    advance(index, naive, 5, chunk=3)  # a committed scratch span of 5 > slack overwrote 17, 18 (the window of 20)
    with pytest.raises(ValueError, match="overwritten"):
        index.rollback(20)
    assert index.n == 25
    assert apply(index, naive, "rollback", 22)  # window [19, 21] of 22 is intact
    check(index, naive, [22], None)


def test_write_refuses_committed_positions_and_shared_slots():
    index = RingIndex(RingSpec(2, 4, 6))
    index.write([0, 1, 2])
    index.commit(3)
    with pytest.raises(ValueError, match="committed"):
        index.write([2, 3])
    with pytest.raises(ValueError, match="share a slot"):
        index.write([3, 9])
    assert index.slot_pos.tolist() == [0, 1, 2, -1, -1, -1, -1, -1]
    for start in (3, 6, 9):
        index.write(range(start, start + 3))
        index.commit(3)  # n = 12: ring slots hold 6..11; 6 is outside every future window but still committed
    with pytest.raises(ValueError, match="committed"):
        index.write([6])


def test_commit_requires_written_positions_and_stale_slots_do_not_count():
    index = RingIndex(RingSpec(0, 3, 5))
    with pytest.raises(ValueError, match="written"):
        index.commit(1)
    index.write([0, 1])
    index.rollback(0)  # rejected: their K/V must not be committed later without a rewrite
    with pytest.raises(ValueError, match="written"):
        index.commit(1)
    index.write([0])
    index.commit(1)
    assert index.n == 1


@pytest.mark.parametrize("jump", [10_000_000, 2**31 + 5, 2**40])
def test_evict_to_jumps_forward_keeps_sinks_and_empties_ring(jump):
    S, W, R = 2, 3, 5
    index, naive = make(S, W, R)
    advance(index, naive, 9, chunk=3)
    assert apply(index, naive, "evict_to", jump)
    assert index.slot_pos.tolist() == [0, 1] + [-1] * R
    assert apply(index, naive, "write", [jump, jump + 1]) and apply(index, naive, "commit", 2)
    assert index.slot_pos[slot_of([jump, jump + 1], S, R)].tolist() == [jump, jump + 1]
    check(index, naive, [jump + 2, jump + 3], None)
    with pytest.raises(ValueError):
        index.rollback(jump - 1)  # nothing before the jump is left to roll back to
    with pytest.raises(ValueError):
        index.evict_to(jump)  # backwards from n = jump + 2


def test_slot_of_matches_definition_past_int32():
    u = np.array([0, 3, 4, 10, 2**31 - 1, 2**31, 2**31 + 1, 2**40 + 3], dtype=np.int64)
    S, R = 4, 7
    assert slot_of(u, S, R).tolist() == [x if x < S else S + (x - S) % R for x in u.tolist()]
    assert slot_of(u, S, R).dtype == np.int64


def test_tree_rows_see_their_ancestors_but_not_siblings():
    index = RingIndex(RingSpec(1, 8, 12))
    index.write(range(5))
    index.commit(5)
    parents = [-1, 0, 0, 1]  # root at 5; two children at 6; a grandchild at 7 under the first child
    mask = index.visible_mask(np.array([5, 6, 6, 7], dtype=np.int64), tree_ancestors(parents))
    P = index.spec.pool_slots
    assert (mask[:, P:] == 0).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert ((mask[:, :P] == 0).sum(axis=1) == 5).all()  # every node sees the committed 0..4


def test_padding_rows_see_only_themselves_and_softmax_stays_finite():
    index = RingIndex(RingSpec(2, 4, 6))
    rows = np.array([0, 1, 2, 0, 0, 0], dtype=np.int64)  # 3 real rows in a bucket of 6; padding positions arbitrary
    mask = mask_padding(index.visible_mask(rows), 3)  # an empty pool: the real rows see only new rows
    P = index.spec.pool_slots
    assert (mask[3:] == 0).tolist() == [[j == P + r for j in range(P + 6)] for r in range(3, 6)]
    assert (mask[:3, P + 3:] == NEG).all()
    e = np.exp(mask - mask.max(axis=1, keepdims=True))
    assert np.isfinite(e / e.sum(axis=1, keepdims=True)).all()


def test_pure_visible_mask_writes_into_the_given_buffer():
    index = RingIndex(RingSpec(1, 3, 4))
    index.write([0, 1, 2])
    index.commit(3)
    out = np.full((2, 7), 7.0, dtype=np.float32)
    got = visible_mask(np.array([3, 4]), None, index.slot_pos, index.n, index.ring_start, 1, 3, out)
    assert got is out
    # row 3 sees sink 0 and 1, 2 (window [1, 3]); row 4 sees sink 0, 2 (window [2, 4]) and row 3
    assert (out == 0).tolist() == [[1, 1, 1, 0, 0, 1, 0], [1, 0, 1, 0, 0, 1, 1]]


def test_pure_visible_mask_hides_positions_before_ring_start_and_always_shows_self():
    slot_pos = np.array([0, 5, 6, 7], dtype=np.int64)  # a stale index that kept ring slots across a jump to 6
    out = np.empty((2, 6), dtype=np.float32)
    no_ancestry = np.zeros((2, 2), dtype=bool)
    visible_mask(np.array([8, 9]), no_ancestry, slot_pos, 8, 6, 1, 4, out)
    assert (out == 0).tolist() == [[1, 0, 1, 1, 1, 0], [1, 0, 1, 1, 0, 1]]


def test_ring_spec_validates_and_exposes_slack():
    spec = RingSpec(4, 8, 12)
    assert (spec.slack, spec.pool_slots) == (4, 16)
    for bad in [(0, 0, 4), (-1, 4, 4), (2, 4, 3)]:
        with pytest.raises(ValueError):
            RingSpec(*bad)


@given(n=st.integers(0, 80), count=st.integers(0, 80), max_rows=st.integers(1, 40), sink=st.integers(0, 12),
       window=st.integers(1, 40))
def test_passes_cover_the_tokens_in_order_and_a_pass_holding_a_sink_has_no_row_past_the_window_edge(
        n, count, max_rows, sink, window):
    got = list(passes(n, count, max_rows, sink, window))
    assert [a for a, _ in got] == [b for _, b in [(0, 0)] + got[:-1]][:len(got)]      # each starts at the last stop
    assert (got[-1][1] if got else 0) == count
    for a, b in got:
        assert 0 < b - a <= max_rows
        assert n + a >= sink or n + b - 1 <= sink + window - 1     # rows with a sink in their pass: u <= S+W-1
        if n + a < sink and n + b < min(n + count, sink + window):
            assert b - a == max_rows                                # cut only where the rule or max_rows says


def test_after_the_wrap_a_pass_reads_the_window_not_the_ring():
    """Serving's ring carries a large slack (a question span and its answer): a pass's pool view must cover the
    window, each visible position once, and not the whole ring (issue: ingest read ~1,700 slots for a 1,024 window)."""
    S, W, R = 4, 64, 200
    index, naive = make(S, W, R)
    for n in range(S, 1400, 29):
        advance(index, naive, n - index.n, chunk=7)
        first, width = index.pool_view(n)
        assert width <= W - 1 + index.column_step - 1 and first + width <= R + index.spec.mirror
        columns = index.column_positions(n)
        live = [v for v in range(max(n - W + 1, S), n)]
        assert sorted(v for v in columns[S:] if v in set(live)) == live, n
    assert index.n // R >= 6                               # wrapped many times

"""Ring KV pool index: which logical position each slot holds, and which slots each query row may see.

The pool has S sink slots (positions 0..S-1, never evicted) and R ring slots; a position u >= S lives in ring slot
S + ((u - S) mod R). The cache policy is StreamingLLM's: a query at u attends to the sinks [0, S) and to the W most
recent positions [u-W+1, u]. Positions [0, n) are committed; the host writes speculative K/V at positions >= n into
their slots before it knows whether they will be accepted, so the ring carries R - W slack slots for them.

The index holds no K/V: the model returns the new rows' K/V and the host copies rows into the slots `write` returns.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY = -1
COLUMN_STEP = 32        # pool reads are widened to a multiple of this many ring slots
NEG = np.float32(-1e30)  # finite on purpose: a fully masked -inf row is NaN after softmax, and -inf - -inf is NaN


@dataclass(frozen=True)
class RingSpec:
    """S sink slots plus a ring of R slots serving a window of W positions.

    Rule: R >= W + K_max, K_max the largest number of uncommitted positions written into the ring at once (every
    written node of a tree; two blocks when the draft runs a block ahead). A query at u >= n needs the committed
    positions [u-W+1, n-1], at most W-1 of them, so W + K_max - 1 slots are the tight minimum and the rule keeps one
    spare. `RingIndex.write` enforces the exact condition, not the rule.
    """

    sink: int
    window: int
    ring: int

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.sink < 0:
            raise ValueError(f"sink must be >= 0, got {self.sink}")
        if self.ring < self.window:
            raise ValueError(f"ring ({self.ring}) must be >= window ({self.window})")

    @property
    def slack(self) -> int:
        return self.ring - self.window

    @property
    def pool_slots(self) -> int:
        return self.sink + self.ring

    @property
    def mirror(self) -> int:
        """Ring slots a runner stores twice, after the ring's end, so a pass's view of the ring (`pool_view`: at
        most W - 1 positions, rounded up) is one contiguous slice wherever it starts."""
        return min(self.ring, self.window + COLUMN_STEP)

    @property
    def stored_slots(self) -> int:
        """Slots of K/V a runner holds: the sinks, the ring and its mirror (the memory formula)."""
        return self.pool_slots + self.mirror


def slot_of(positions, sink: int, ring: int) -> np.ndarray:
    """Slot of each position (int64 >= 0): u if u < S else S + ((u - S) mod R).

    Invariant: positions u and u + R (both >= S) share a slot; nothing else collides.
    """
    u = np.asarray(positions, dtype=np.int64)
    return np.where(u < sink, u, sink + (u - sink) % ring)


def passes(n: int, count: int, max_rows: int, sink: int, window: int, grid: int = 0):
    """(start, stop) offsets of the passes that run `count` tokens at positions n, n+1, ...: at most max_rows rows
    each, none crossing a multiple of `grid` (0: no grid), and a pass holding sink positions holds no row past S+W-1
    (past it a row scores the sinks with their own query, from the sink pool, not at their distance in its section:
    models/graph.py, pipeline/decode/blocks.py)."""
    start = 0
    while start < count:
        stop = min(count, start + max_rows)
        if grid:
            stop = min(stop, start + grid - (n + start) % grid)
        if n + start < sink:
            stop = min(stop, sink + window - n)
        yield start, stop
        start = stop


def visible_mask(row_pos, ancestors, slot_pos, n: int, ring_start: int, sink: int, window: int, out,
                 recent_pos=None) -> np.ndarray:
    """Fill the additive mask out[T, P+m+T] (keys: P pool slots, m recent positions, then the T new rows): 0.0
    visible, NEG masked.

    Row r is the query at u = row_pos[r] (rows are at positions >= n). It sees
      - a pool slot holding a committed position v (0 <= v < n, v <= u) that is a sink (v < S) or lies in its
        window and was not evicted: v >= max(u - W + 1, ring_start);
      - recent position recent_pos[j] (committed positions handed to the pass as their own section, see
        `RingIndex.visible_mask`) under the same window rule;
      - new row j if ancestors[r, j] (None: the causal chain j <= r) and row j's position is in the window of u
        (>= u - W + 1) or a sink (< S). A row always sees itself, so every row's softmax is finite.
    Slots holding positions >= n (speculative writes, rolled-back rows) and empty slots are never visible.
    Padding rows of a static-size bucket: call `mask_padding` afterwards.
    """
    row_pos = np.asarray(row_pos, dtype=np.int64)
    t, p = row_pos.shape[0], slot_pos.shape[0]
    recent = np.zeros(0, np.int64) if recent_pos is None else np.asarray(recent_pos, dtype=np.int64)
    m = recent.shape[0]
    u = row_pos[:, None]
    first = u - (window - 1)  # first position of each row's window
    pos = slot_pos[None, :]
    seen = (pos >= 0) & (pos < n) & (pos <= u) & ((pos < sink) | (pos >= np.maximum(first, ring_start)))
    rec = recent[None, :]
    seen_recent = (rec <= u) & ((rec < sink) | (rec >= np.maximum(first, ring_start)))
    rows = row_pos[None, :]
    seen_rows = (rows >= first) | (rows < sink)
    seen_rows &= np.tri(t, dtype=bool) if ancestors is None else ancestors
    np.fill_diagonal(seen_rows, True)
    out.fill(NEG)
    np.copyto(out[:, :p], 0.0, where=seen)
    np.copyto(out[:, p:p + m], 0.0, where=seen_recent)
    np.copyto(out[:, p + m:], 0.0, where=seen_rows)
    return out


def mask_padding(out: np.ndarray, rows: int) -> np.ndarray:
    """Mask the padding rows r >= rows of a static-size bucket in out[T, P+T], in place.

    A padding row sees only itself (a row that sees nothing has softmax 0/0 = NaN, which can poison a fused
    kernel); its output is discarded. No row sees a padding row.
    """
    t = out.shape[0]
    p = out.shape[1] - t
    out[rows:, :] = NEG
    out[:, p + rows:] = NEG
    np.fill_diagonal(out[rows:, p + rows:], 0.0)
    return out


class RingIndex:
    """Host-side index of one KV pool: slot_pos[s] is the position whose K/V slot s holds (EMPTY = -1).

    n: positions [0, n) are committed (n is the next position). ring_start: the first position that may be in the
    ring (raised by `evict_to`). Invariant, kept by `write` and `rollback`: every committed position a query at any
    u >= n may see (the sinks, and [max(u-W+1, ring_start), n-1]) is held by its slot.
    """

    def __init__(self, spec: RingSpec):
        self.spec = spec
        self.n = 0
        self.ring_start = 0
        self.slot_pos = np.full(spec.pool_slots, EMPTY, dtype=np.int64)
        self.column_step = COLUMN_STEP  # pool_view's rounding (tests lower it to exercise the cut)
        self._columns = np.empty(spec.pool_slots, np.int64)   # column_positions' buffer for visible_mask

    def _protected_from(self, n: int) -> int:
        """First ring position a query at any u >= n can still see."""
        return max(n - self.spec.window + 1, self.ring_start, self.spec.sink)

    def _held(self, positions: np.ndarray) -> bool:
        return bool(np.array_equal(self.slot_pos[slot_of(positions, self.spec.sink, self.spec.ring)], positions))

    def write(self, positions) -> np.ndarray:
        """Record that the K/V of `positions` (distinct, >= n, possibly speculative) now sit in their slots.

        Refuses (ValueError, index unchanged) a write that would overwrite a committed position still inside the
        window of a query at some u >= n: the slack rule R >= W + K_max, checked exactly.
        """
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        slots = slot_of(pos, self.spec.sink, self.spec.ring)
        if pos.size and pos.min() < self.n:
            raise ValueError(f"position {pos.min()} is committed (n={self.n}); roll back before rewriting it")
        if np.unique(slots).size != slots.size:
            raise ValueError("two written positions share a slot (more than R at once)")
        old = self.slot_pos[slots]
        lost = (old >= self._protected_from(self.n)) & (old < self.n)
        if lost.any():
            raise ValueError(f"writing position {pos[lost][0]} would overwrite committed position {old[lost][0]}, "
                             f"still in the window (n={self.n}, slack {self.spec.slack} too small)")
        self.slot_pos[slots] = pos
        return slots

    def commit(self, count: int) -> None:
        """Commit positions [n, n + count); each must have been written since the last rollback or eviction."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if count > self.spec.pool_slots:
            raise ValueError(f"commit of {count} positions: more than the pool holds")
        if not self._held(np.arange(self.n, self.n + count, dtype=np.int64)):
            raise ValueError(f"commit of [{self.n}, {self.n + count}): not every position is written")
        self.n += int(count)

    def rollback(self, n_new: int) -> None:
        """Make positions >= n_new uncommitted (ring_start <= n_new <= n); their slots become EMPTY.

        Rolling back to n discards the uncommitted speculative writes. Refuses (ValueError, index unchanged) when a
        position in the window of n_new was overwritten while it lay outside the window (a committed span longer
        than the slack): the window must come back intact or not at all.
        """
        if not self.ring_start <= n_new <= self.n:
            raise ValueError(f"rollback to {n_new} outside [ring_start={self.ring_start}, n={self.n}]")
        if not self._held(np.arange(self._protected_from(n_new), n_new, dtype=np.int64)):
            raise ValueError(f"rollback to {n_new}: part of its window was overwritten (span exceeded the slack)")
        self.slot_pos[self.slot_pos >= n_new] = EMPTY
        self.n = int(n_new)

    def evict_to(self, position: int) -> None:
        """Jump forward: ring_start = n = position (>= n), ring slots emptied, sinks kept (they must be full)."""
        if position < self.n:
            raise ValueError(f"evict_to({position}) would move backwards from n={self.n}")
        if self.n < self.spec.sink:
            raise ValueError(f"evict_to before the {self.spec.sink} sinks are committed (n={self.n})")
        self.slot_pos[self.spec.sink:] = EMPTY
        self.n = self.ring_start = int(position)

    def pool_view(self, before: int) -> tuple[int, int]:
        """(first, width): the ring slots [first, first + width) a pass reads when every pool position it may see is
        below `before` (slot first + k is ring slot (first + k) mod R: the runner keeps a mirrored copy of the
        ring's first slots after its end, so the view is contiguous memory).

        The view starts at the oldest position a row at u >= before can see, max(before - W + 1, ring_start, S), and
        holds the positions up to `before`, rounded up to `column_step` slots so widths repeat: after the first wrap
        a pass reads about W slots, not the whole ring with its slack. Depends only on (`before`, ring_start): every
        pass holding a row at u reads the same columns (before is the row's aligned block start), so its attention
        sums the same terms.
        """
        S, R, W = self.spec.sink, self.spec.ring, self.spec.window
        lo = max(before - W + 1, self.ring_start, S)
        width = min(R, -(-max(before - lo, 1) // self.column_step) * self.column_step)
        return (lo - S) % R, width

    def pool_columns(self, before: int) -> int:
        """How many pool columns (sinks, then the view's ring slots) a pass reads below `before` (`pool_view`)."""
        return self.spec.sink + self.pool_view(before)[1]

    def column_positions(self, before: int, out: np.ndarray | None = None) -> np.ndarray:
        """The position each pool column holds (EMPTY for none) for a pass reading below `before`: the sinks, then
        the view's ring slots in order."""
        S = self.spec.sink
        first, width = self.pool_view(before)
        out = np.empty(S + width, np.int64) if out is None else out[:S + width]
        out[:S] = self.slot_pos[:S]
        np.take(self.slot_pos[S:], np.arange(first, first + width), mode="wrap", out=out[S:])
        return out

    def visible_mask(self, row_pos, ancestors=None, out=None, recent_from: int | None = None) -> np.ndarray:
        """The mask [T, P+m+T] for rows at `row_pos`, P = pool_columns(recent_from), the pool columns in
        `column_positions` order (see `visible_mask`); the runner reads them at `pool_view(recent_from)[0]`.

        out: a flat float32 buffer with room for it (its leading elements are used), or None.

        recent_from = s (<= n): the committed positions [s, n) are not read from their slots but handed to the pass
        as a separate "recent" section (m = n - s columns) placed just before the new rows. A row at u then sums
        exactly the same terms in the same columns whether u's predecessors in [s, u) are committed or new rows of
        the same pass, so a block verify reproduces token-by-token decoding bit for bit (`Engine`'s aligned blocks).
        """
        t = len(row_pos)
        s = self.n if recent_from is None else int(recent_from)
        recent = np.arange(s, self.n, dtype=np.int64)
        columns = self.column_positions(s, self._columns)
        size = t * (len(columns) + len(recent) + t)
        out = np.empty(size, np.float32) if out is None else out.reshape(-1)[:size]
        return visible_mask(row_pos, ancestors, columns, s, self.ring_start,
                            self.spec.sink, self.spec.window, out.reshape(t, -1), recent)

"""Model-free drafting from the stream itself: continue the current suffix the way it continued last time.

Logs repeat heavily (prompt lookup, SuffixDecoding). `SuffixIndex` keeps the last C tokens in a ring and, per n-gram
length g, a fixed-size hash table from the hash of a g-gram to the position where it most recently ended. Memory is
constant however long the stream runs. Never consults a model; proposals are deterministic (q is a point mass).
"""
from __future__ import annotations

import numpy as np

_MULT = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class SuffixIndex:
    def __init__(self, capacity: int = 16384, grams: tuple[int, ...] = (8, 4, 2), table_bits: int = 16):
        self.capacity, self.grams = capacity, tuple(sorted(grams, reverse=True))
        self.tokens = np.zeros(capacity, np.int64)       # ring of the last `capacity` tokens
        self.total = 0                                   # tokens ever appended; token t lives at t % capacity
        self.mask = (1 << table_bits) - 1
        self.tables = {g: np.full(1 << table_bits, -1, np.int64) for g in self.grams}

    def _hash(self, end: int, g: int) -> int:
        """Hash of the g tokens ending at absolute index end (inclusive)."""
        h = g
        for t in range(end - g + 1, end + 1):
            h = ((h ^ int(self.tokens[t % self.capacity])) * _MULT) & _MASK64
        return (h >> 40) & self.mask

    def append(self, tokens) -> None:
        for tok in np.asarray(tokens, np.int64).reshape(-1):
            end = self.total
            self.tokens[end % self.capacity] = tok
            self.total += 1
            for g in self.grams:
                if end + 1 >= g:
                    self.tables[g][self._hash(end, g)] = end

    def _matches(self, a_end: int, b_end: int, g: int) -> bool:
        return all(self.tokens[(a_end - i) % self.capacity] == self.tokens[(b_end - i) % self.capacity]
                   for i in range(g))

    def propose(self, pending, k: int, min_gram: int = 1) -> np.ndarray:
        """Up to k tokens that followed the longest recent match of (stream + pending)'s suffix (a match of at least
        `min_gram` tokens); may be empty.

        `pending` is one token or a sequence (uncommitted tokens assumed to follow the stream, the last one pending):
        it is appended temporarily so the match ends at its last token; the tables are not updated with it.
        """
        tail = np.atleast_1d(np.asarray(pending, np.int64))
        if k <= 0 or self.total == 0 or len(tail) >= self.capacity // 2:
            return np.zeros(0, np.int64)
        where = (self.total + np.arange(len(tail))) % self.capacity
        saved = self.tokens[where]                    # the oldest tokens; put back below
        self.tokens[where] = tail
        try:
            return self._continuation(self.total + len(tail) - 1, k, min_gram)
        finally:
            self.tokens[where] = saved

    def _continuation(self, end: int, k: int, min_gram: int) -> np.ndarray:
        oldest = max(0, end + 1 - self.capacity)
        for g in self.grams:
            if end + 1 < g or g < min_gram:
                continue
            prev = int(self.tables[g][self._hash(end, g)])
            if prev < 0 or prev - g + 1 < oldest or not self._matches(prev, end, g):
                continue
            n = min(k, end - prev)            # the continuation may run up to (not past) the last pending token
            idx = (np.arange(prev + 1, prev + 1 + n)) % self.capacity
            return self.tokens[idx].copy()
        return np.zeros(0, np.int64)

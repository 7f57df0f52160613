"""Model-free drafting from the stream itself: continue the current suffix the way it continued last time.

Logs repeat heavily (prompt lookup, SuffixDecoding). `SuffixIndex` keeps the last C tokens in a ring and, per n-gram
length g, a fixed-size hash table from the hash of a g-gram to the position where it most recently ended. Memory is
constant however long the stream runs. Never consults a model; proposals are deterministic (q is a point mass).
"""
from __future__ import annotations

import numpy as np

FOLLOWERS = 3          # frequent-follower counters per token
_MULT = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class SuffixIndex:
    def __init__(self, capacity: int = 16384, grams: tuple[int, ...] = (8, 4, 2), table_bits: int = 16):
        self.capacity, self.grams = capacity, tuple(sorted(grams, reverse=True))
        self.tokens = np.zeros(capacity, np.int64)       # ring of the last `capacity` tokens
        self.total = 0                                   # tokens ever appended; token t lives at t % capacity
        self.mask = (1 << table_bits) - 1
        self.tables = {g: np.full(1 << table_bits, -1, np.int64) for g in self.grams}
        # The domain prior: each token's frequent followers over the whole stream (Misra-Gries with FOLLOWERS
        # counters per hashed token: a follower seen more than 1/(FOLLOWERS+1) of the time keeps its counter).
        self.follower = np.full((1 << table_bits, FOLLOWERS), -1, np.int32)      # token ids
        self.follower_count = np.zeros((1 << table_bits, FOLLOWERS), np.int64)

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
            if end:
                self._count_follower(int(self.tokens[(end - 1) % self.capacity]), int(tok))

    def _count_follower(self, prev: int, tok: int) -> None:
        ids, counts = self.follower[prev & self.mask], self.follower_count[prev & self.mask]
        hit = np.flatnonzero(ids == tok)
        if hit.size:
            counts[hit[0]] += 1
        elif (free := np.flatnonzero(counts == 0)).size:
            ids[free[0]], counts[free[0]] = tok, 1
        else:
            counts -= 1                                  # Misra-Gries: every counter pays for the newcomer

    def followers(self, token: int) -> np.ndarray:
        """The token's most frequent followers in the stream so far, most frequent first (a hashed estimate)."""
        ids, counts = self.follower[int(token) & self.mask], self.follower_count[int(token) & self.mask]
        order = np.argsort(-counts, kind="stable")
        return ids[order][counts[order] > 0]

    def _matches(self, a_end: int, b_end: int, g: int) -> bool:
        return all(self.tokens[(a_end - i) % self.capacity] == self.tokens[(b_end - i) % self.capacity]
                   for i in range(g))

    def propose(self, pending, k: int, min_gram: int = 1) -> np.ndarray:
        """Up to k tokens that followed the longest recent match of (stream + pending)'s suffix (a match of at least
        `min_gram` tokens); may be empty.

        `pending` is one token or a sequence (uncommitted tokens assumed to follow the stream, the last one pending):
        it is appended temporarily so the match ends at its last token; the tables are not updated with it.
        """
        found = self.branches(pending, k, min_gram, most=1)
        return found[0] if found else np.zeros(0, np.int64)

    def branches(self, pending, k: int, min_gram: int = 1, most: int | None = None) -> list[np.ndarray]:
        """What followed the most recent match of each n-gram length (longest first), one continuation of up to k
        tokens per distinct first token: the longest match's is `propose`'s, the others are a tree's siblings."""
        tail = np.atleast_1d(np.asarray(pending, np.int64))
        if k <= 0 or self.total == 0 or len(tail) >= self.capacity // 2:
            return []
        where = (self.total + np.arange(len(tail))) % self.capacity
        saved = self.tokens[where]                    # the oldest tokens; put back below
        self.tokens[where] = tail
        try:
            return self._continuations(self.total + len(tail) - 1, k, min_gram, most or len(self.grams))
        finally:
            self.tokens[where] = saved

    def _continuations(self, end: int, k: int, min_gram: int, most: int) -> list[np.ndarray]:
        oldest = max(0, end + 1 - self.capacity)
        found, firsts = [], set()
        for g in self.grams:
            if end + 1 < g or g < min_gram:
                continue
            prev = int(self.tables[g][self._hash(end, g)])
            if prev < 0 or prev - g + 1 < oldest or not self._matches(prev, end, g):
                continue
            n = min(k, end - prev)            # the continuation may run up to (not past) the last pending token
            if n <= 0:                        # the match is the query itself (nothing pending): nothing follows it
                continue
            idx = (np.arange(prev + 1, prev + 1 + n)) % self.capacity
            if int(self.tokens[idx[0]]) not in firsts:
                firsts.add(int(self.tokens[idx[0]]))
                found.append(self.tokens[idx].copy())
                if len(found) == most:
                    break
        return found

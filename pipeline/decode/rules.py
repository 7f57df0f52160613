"""Rules on what an answer may write: a token-level constraint applied to the target's distribution.

Owns the rules (`IdentifierRule`: an identifier written must be one of the allowed ones; `OptionsRule`: a field is
one option, or a list of them), their state as the answer grows (`advance`), the tokens a state forbids
(`forbidden`), and masking a pass's rows (`constrain_rows`). Never chooses what is allowed (the caller does: the
identifiers of the lines in view) and never samples.

Invariant (the constrained target): with a rule, the target's distribution after a prefix is the sampling transform
of its logits with the forbidden tokens set to -inf. A rule's state is a function of the answer's text alone, so a
verify pass's row r is masked by the state after the tokens on its root path, and speculation judges proposals
against exactly that distribution (kernels/accept.py is unchanged: a forbidden proposal has p = 0 and is rejected).
A state always allows some token (a rule never dead-ends), and no sequence of allowed tokens writes what the rule
forbids, whatever the logits.

Identifiers (the TEP tag class: letters, then digits, then an optional `_n` suffix). An answer writes an identifier
when a word (a run of ASCII letters, digits and `_`) starts with 1-4 letters and has reached two digits after them,
or when a word of 1-4 upper-case letters is followed by one space or hyphen and two digits ("FIR 12", "FIR-12"). From
then on the word must stay a prefix of an allowed identifier (compared upper-case, without the separator), and it
may end only where an allowed identifier ends. Words with one digit ("CO2") and every other word are free.
"""
from __future__ import annotations

import bisect
import re
import threading
import weakref

import numpy as np

_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DIGITS = frozenset(b"0123456789")
_FUSED = re.compile(r"([A-Za-z]{1,4})(\d+)(_\d*)?", re.ASCII)      # a word that writes letters then digits
_SPACED = re.compile(r"([A-Z]{1,4})([ -])(\d+)(_\d*)?", re.ASCII)  # upper-case letters, a separator, digits
_LETTERS = re.compile(r"[A-Za-z]{1,4}", re.ASCII)
_UPPER = re.compile(r"[A-Z]{1,4}", re.ASCII)
_DEAD = "~"                    # the state of a word that can no longer become an identifier
_MAX_CACHED = 4096


class TokenTable:
    """A vocabulary's token texts as bytes, and the token classes rules look at. Built once per tokenizer."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.vocab = len(pieces)
        self.by_bytes: dict[bytes, list[int]] = {}
        for i, piece in enumerate(pieces):
            self.by_bytes.setdefault(piece, []).append(i)
        has_digit = [any(b in _DIGITS for b in p) for p in pieces]
        # a word's state moves only through these: digit tokens (checked one by one, 10 of them in SmolLM2's
        # vocabulary, which writes digits alone), tokens starting with "_" (checked), the rest by their first byte
        self.digit_ids = np.flatnonzero(has_digit).astype(np.int64)
        self.underscore_ids = np.array([i for i, p in enumerate(pieces) if p[:1] == b"_" and not has_digit[i]],
                                       np.int64)
        self.closer_ids = np.array([i for i, p in enumerate(pieces) if p and p[0] not in _WORD and not has_digit[i]],
                                   np.int64)
        self._sorted = sorted(set(pieces))    # is some token's text prefixed by these bytes? (bisect)
        self.newline_ids = frozenset(i for i, p in enumerate(pieces) if b"\n" in p)

    def starts_some(self, prefix: bytes) -> bool:
        i = bisect.bisect_left(self._sorted, prefix)
        return i < len(self._sorted) and self._sorted[i].startswith(prefix)

    @classmethod
    def of(cls, tok) -> "TokenTable":
        """The table of a tokenizer's vocabulary, built once per tokenizer (read-only: a process's streams share
        it, as they share the tokenizer)."""
        with _TABLES_LOCK:
            if tok not in _TABLES:
                _TABLES[tok] = cls([tok.token_bytes(i) for i in range(tok.vocab_size)])
            return _TABLES[tok]


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # tokenizer -> its TokenTable
_TABLES_LOCK = threading.Lock()


class IdentifierRule:
    """Identifiers may be written only as one of `allowed` (the module docstring). States are short strings: "" at
    a word boundary, the current word (with the upper-case word and separator before it, when that can still make
    an identifier), or "~" for a word that cannot."""

    def __init__(self, allowed, table: TokenTable, banned=()):
        """banned: tokens never written (a form's field ends at a newline, not at a stop token)."""
        self.table = table
        self.allowed = frozenset(normal(a) for a in allowed)
        self.prefixes = frozenset(a[:i] for a in self.allowed for i in range(1, len(a) + 1))
        self.banned = np.array(sorted(set(int(t) for t in banned)), np.int64)
        self.spec = {"kind": "identifiers", "allowed": sorted(self.allowed), "banned": self.banned.tolist()}
        self._forbidden: dict[str, np.ndarray | None] = {}

    def advance(self, state: str, token: int) -> str | None:
        """The state after `token`, or None when the token writes what the rule forbids."""
        for b in self.table.pieces[token]:
            state = self._step(state, b)
            if state is None:
                return None
        return state

    def closable(self, state: str) -> bool:
        """May the answer end here (cut by its token limit)?"""
        got = _candidate(state)
        return got is None or got[1] < 2 or got[0] in self.allowed

    def forbidden(self, state: str) -> np.ndarray | None:
        """Bool [V]: the tokens this state forbids; None when it forbids none (most states: no mask at all)."""
        if state in self._forbidden:
            return self._forbidden[state]
        t = self.table
        got = _candidate(state)
        if got is not None and got[1] >= 2:            # inside an identifier: only its allowed continuations
            out = np.ones(t.vocab, bool)
            if self.closable(state):
                out[t.closer_ids] = False
            for i in (*t.digit_ids, *t.underscore_ids):
                if self.advance(state, int(i)) is not None:
                    out[i] = False
        else:                                          # only a digit can start an identifier's second digit
            bad = [int(i) for i in t.digit_ids if self.advance(state, int(i)) is None]
            out = None
            if bad or len(self.banned):
                out = np.zeros(t.vocab, bool)
                out[bad] = True
        if out is not None:
            out[self.banned] = True
        if len(self._forbidden) >= _MAX_CACHED:
            self._forbidden.clear()
        self._forbidden[state] = out
        return out

    def _step(self, state: str, b: int) -> str | None:
        got = _candidate(state)
        inside = got is not None and got[1] >= 2
        if b in _WORD:
            if state == _DEAD:
                return _DEAD
            new = state + chr(b)
            grown = _candidate(new)
            if grown is not None and grown[1] >= 2:    # writing an identifier: only on the way to an allowed one
                return new if grown[0] in self.prefixes else None
            if inside:
                return None                            # an identifier written on with a letter: not allowed
            if grown is not None:
                return new                             # letters and one digit: free
            word = new.split(" ")[-1].split("-")[-1]   # a separator's word is done: only this word matters now
            return word if _LETTERS.fullmatch(word) else _DEAD
        if not self.closable(state):
            return None                                # an identifier may end only where an allowed one does
        if b in b" -" and _UPPER.fullmatch(state):
            return state + chr(b)                      # "FIR " may go on as "FIR 123"
        return ""


def _candidate(state: str) -> tuple[str, int] | None:
    """(the identifier being written, upper-case without separator; its digits before the suffix) or None."""
    m = _FUSED.fullmatch(state)
    if m is not None:
        return m[1].upper() + m[2] + (m[3] or ""), len(m[2])
    m = _SPACED.fullmatch(state)
    if m is not None:
        return m[1] + m[3] + (m[4] or ""), len(m[3])
    return None


def normal(identifier: str) -> str:
    """An identifier as rules compare them: upper case, no separator between its letters and digits."""
    m = re.fullmatch(r"([A-Za-z]+)[ -]?(\d.*)", identifier, re.ASCII)
    return (m[1] + m[2] if m else identifier).upper()


class OptionsRule:
    """The field is `lead`, then one of `options` (or up to `max_items` distinct ones joined by `sep`), then `end`.
    States are the field's text so far (bytes as latin-1)."""

    def __init__(self, options, table: TokenTable, sep: str | None = None, max_items: int = 1, lead: str = " ",
                 end: str = "\n"):
        if not options:
            raise ValueError("an options rule needs at least one option")
        self.table = table
        self.options = tuple(o.encode() for o in options)
        self.sep, self.lead, self.end = (s.encode() if s else b"" for s in (sep, lead, end))
        self.max_items = max_items if sep else 1
        self.spec = options_spec(options, sep, max_items, lead, end)
        self._forbidden: dict[str, np.ndarray] = {}

    def advance(self, state: str, token: int) -> str | None:
        new = state + self.table.pieces[token].decode("latin-1")
        return new if self._next(new.encode("latin-1")) is not None else None

    def closable(self, state: str) -> bool:
        """Complete, or complete but for its end (a list cut by its token limit after a whole option)."""
        nxt = self._next(state.encode("latin-1"))
        return nxt is not None and (not nxt or self.end[0] in nxt)

    def forbidden(self, state: str) -> np.ndarray:
        if state not in self._forbidden:
            out = np.ones(self.table.vocab, bool)
            for piece in self._continuations(state.encode("latin-1")):
                out[self.table.by_bytes.get(piece, [])] = False
            if len(self._forbidden) >= _MAX_CACHED:
                self._forbidden.clear()
            self._forbidden[state] = out
        return self._forbidden[state]

    def _continuations(self, text: bytes):
        """Every token text the field's text may go on with: the field's continuations that some token starts."""
        stack = [b""]
        while stack:
            piece = stack.pop()
            if piece:
                yield piece
            stack.extend(longer for b in self._next(text + piece) or ()
                         if self.table.starts_some(longer := piece + bytes([b])))

    def _next(self, text: bytes) -> set[int] | None:
        """The bytes that may follow `text`: empty once the field is complete, None when `text` is not allowed."""
        lead = self.lead
        if len(text) < len(lead):
            return {lead[len(text)]} if lead.startswith(text) else None
        if not text.startswith(lead):
            return None
        body = text[len(lead):]
        if self.end in body:
            return set() if body.endswith(self.end) and body.count(self.end) == 1 and \
                self._items_done(body[:-len(self.end)]) else None
        items = body.split(self.sep) if self.sep else [body]
        done, cur = items[:-1], items[-1]
        if any(item not in self.options for item in done) or len(set(done)) < len(done):
            return None                        # a list names each option once
        left = [o for o in self.options if o not in done]
        nxt = {o[len(cur)] for o in left if o.startswith(cur) and len(o) > len(cur)}
        for o in left:                         # an option, then part of the separator
            if cur.startswith(o) and len(cur) > len(o) and self.sep.startswith(cur[len(o):]) and \
                    len(items) < self.max_items and len(left) > 1:
                nxt.add(self.sep[len(cur) - len(o)])
        if cur in left:
            nxt.add(self.end[0])
            if self.sep and len(items) < self.max_items and len(left) > 1:
                nxt.add(self.sep[0])
        return nxt or None

    def _items_done(self, body: bytes) -> bool:
        items = body.split(self.sep) if self.sep else [body]
        return len(items) <= self.max_items and len(set(items)) == len(items) and \
            all(item in self.options for item in items)


def options_spec(options, sep: str | None = None, max_items: int = 1, lead: str = " ", end: str = "\n") -> dict:
    """An `OptionsRule`'s spec, made without a token table (what a question carries to the cache owner)."""
    return {"kind": "options", "options": list(options), "sep": sep, "max_items": max_items, "lead": lead, "end": end}


def rule_from(spec: dict | None, table: TokenTable):
    """A rule from its `spec` (what crosses to the target actor), or None."""
    if spec is None:
        return None
    if spec.get("kind") == "identifiers":
        return IdentifierRule(spec["allowed"], table, spec["banned"])
    if spec.get("kind") == "options":
        return OptionsRule(spec["options"], table, spec["sep"], spec["max_items"], spec["lead"], spec["end"])
    raise ValueError(f"unknown rule {spec!r}")


def row_states(rule, state: str, tokens: np.ndarray, parent: np.ndarray) -> list[str | None]:
    """The rule's state after each row's root path: row 0 the pending token after `state`, row r the proposal whose
    parent is parent[r - 1] (-1: the pending token; blocks.Block); None past a token the rule forbids (such a row is
    never accepted: its token has p = 0)."""
    states: list[str | None] = []
    for r, token in enumerate(tokens):
        before = state if r == 0 else states[parent[r - 1] + 1]
        states.append(None if before is None else rule.advance(before, int(token)))
    return states


def constrain_rows(logits: np.ndarray, rule, states) -> None:
    """Set each row's forbidden tokens to -inf, in place; rows whose state forbids nothing are not touched."""
    for r, state in enumerate(states):
        if state is not None and (f := rule.forbidden(state)) is not None:
            np.putmask(logits[r], f, -np.inf)


def trim(rule, state: str, ids: list[int]) -> list[int]:
    """An answer cut by its token limit, without the tokens of an identifier (or field) left unfinished."""
    states = [state]
    for t in ids:
        states.append(rule.advance(states[-1], t) if states[-1] is not None else None)
    keep = len(ids)
    while keep > 0 and (states[keep] is None or not rule.closable(states[keep])):
        keep -= 1
    return ids[:keep]

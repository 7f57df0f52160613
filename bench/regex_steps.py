"""A regex's work counted in steps, never timed: a backtracking matcher over the parsed pattern.

Owns `steps`, `search`, `finditer`, `match` and `fullmatch`: each runs a compiled `re.Pattern` over a string the
way Python's `re` (sre) does it (greedy, lazy and possessive repeats, alternation in order, atomic groups, character
classes and categories, IGNORECASE, anchors, word boundaries, lookahead and fixed-width lookbehind; `search` tries
every start position from `pos`, leftmost first) and counts a step for every attempt to match one node at one
position (a single-character repeat counts each character it takes, as sre's REPEAT_ONE does). sre has no step
counter, so a pattern's growth (linear or not) is read here, on any machine, at any load. An opcode it does not model
(a group back-reference, a conditional) raises `Unsupported` naming it: such a pattern needs a length cap before
matching, or support here. `limit` stops a run that passes that many steps (`TooManySteps`): a super-linear pattern
on a long input would otherwise take minutes to count. Group spans are not tracked: the match's span is what is
compared with `re` (tests/pipeline/test_patterns_linear.py). `counting(modules)` counts a whole call's steps: every
module-level pattern of the modules (and `re.search`/`finditer`/`findall` called inline there) answers as `re` does
while the instrument counts its steps. After an empty match the next search starts one character on (re may find a
non-empty match at the same place: none of the patterns checked can, the agreement test shows it). Nothing at run
time imports this (it is measurement, bench/).
"""
from __future__ import annotations

import contextlib
import re
import sys
import threading
from re import _constants as C
from re import _parser

_STACK = 512 * 1024 * 1024          # a general repeat recurses once per iteration: a deep stack, in a thread of its own


class Unsupported(ValueError):
    """The pattern holds an opcode this matcher does not model."""


class TooManySteps(RuntimeError):
    """The run passed its step limit (the pattern's work grew past what the caller allows)."""


class _Run:
    def __init__(self, text: str, flags: int, limit: int | None):
        self.text, self.n, self.limit, self.steps = text, len(text), limit, 0
        self.unicode = not flags & re.ASCII
        self.multiline = bool(flags & re.MULTILINE)
        self.dotall = bool(flags & re.DOTALL)

    def step(self) -> None:
        self.steps += 1
        if self.limit is not None and self.steps > self.limit:
            raise TooManySteps(f"more than {self.limit} steps")

    # -- one character ----------------------------------------------------------------------------------------------
    def _word(self, ch: str) -> bool:
        return (ch.isalnum() or ch == "_") if self.unicode else (ch.isascii() and (ch.isalnum() or ch == "_"))

    def _category(self, cat, ch: str) -> bool:
        if cat is C.CATEGORY_DIGIT:
            return ch.isdecimal() if self.unicode else "0" <= ch <= "9"
        if cat is C.CATEGORY_NOT_DIGIT:
            return not self._category(C.CATEGORY_DIGIT, ch)
        if cat is C.CATEGORY_SPACE:
            return ch.isspace() if self.unicode else ch in " \t\n\r\f\v"
        if cat is C.CATEGORY_NOT_SPACE:
            return not self._category(C.CATEGORY_SPACE, ch)
        if cat is C.CATEGORY_WORD:
            return self._word(ch)
        if cat is C.CATEGORY_NOT_WORD:
            return not self._word(ch)
        raise Unsupported(f"category {cat}")

    def _in(self, items, ch: str) -> bool:
        negate = False
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL and ch == chr(av) or op is C.RANGE and av[0] <= ord(ch) <= av[1] or \
                    op is C.CATEGORY and self._category(av, ch):
                return not negate
            elif op not in (C.LITERAL, C.RANGE, C.CATEGORY):
                raise Unsupported(f"class item {op}")
        return negate

    def one(self, op, av, ch: str, ic: bool) -> bool:
        """Whether the single-character node (op, av) takes `ch`."""
        if op is C.LITERAL:
            return ch == chr(av) or ic and (ch.lower() == chr(av).lower() or ch.upper() == chr(av).upper())
        if op is C.NOT_LITERAL:
            return not self.one(C.LITERAL, av, ch, ic)
        if op is C.ANY:
            return self.dotall or ch != "\n"
        if op is C.IN:
            return self._in(av, ch) or ic and (self._in(av, ch.lower()) or self._in(av, ch.upper())) \
                if not (av and av[0][0] is C.NEGATE) else \
                self._in(av, ch) and (not ic or self._in(av, ch.lower()) and self._in(av, ch.upper()))
        raise Unsupported(f"opcode {op}")

    # -- anchors -----------------------------------------------------------------------------------------------------
    def at(self, where, pos: int) -> bool:
        t, n = self.text, self.n
        if where is C.AT_BEGINNING:
            return pos == 0 or self.multiline and t[pos - 1] == "\n"
        if where is C.AT_BEGINNING_STRING:
            return pos == 0
        if where is C.AT_END:
            return pos == n or pos == n - 1 and t[pos] == "\n" or self.multiline and pos < n and t[pos] == "\n"
        if where is C.AT_END_STRING:
            return pos == n
        if where in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY):
            before = pos > 0 and self._word(t[pos - 1])
            after = pos < n and self._word(t[pos])
            return (before != after) == (where is C.AT_BOUNDARY)
        raise Unsupported(f"anchor {where}")

    # -- sequences, in continuation-passing style: k(pos) is the rest of the match ----------------------------------
    def seq(self, nodes, i: int, pos: int, ic: bool, k) -> bool:
        if i == len(nodes):
            return k(pos)
        op, av = nodes[i]
        rest = lambda p: self.seq(nodes, i + 1, p, ic, k)         # noqa: E731
        self.step()
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return pos < self.n and self.one(op, av, self.text[pos], ic) and rest(pos + 1)
        if op is C.AT:
            return self.at(av, pos) and rest(pos)
        if op is C.BRANCH:
            return any(self.seq(list(alt), 0, pos, ic, rest) for alt in av[1])
        if op is C.SUBPATTERN:
            _, add, drop, sub = av
            inner = (ic or bool(add & re.IGNORECASE)) and not drop & re.IGNORECASE
            return self.seq(list(sub), 0, pos, inner, rest)
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return self.repeat(op, av, pos, ic, rest)
        if op is C.POSSESSIVE_REPEAT:
            return self.atomic([(C.MAX_REPEAT, av)], pos, ic, rest)
        if op is C.ATOMIC_GROUP:
            return self.atomic(list(av), pos, ic, rest)
        if op in (C.ASSERT, C.ASSERT_NOT):
            direction, sub = av
            sub = list(sub)
            if direction == 1:
                held = self.seq(sub, 0, pos, ic, lambda p: True)
            else:                                      # a lookbehind is of fixed width in Python
                lo, hi = _parser.SubPattern(_parser.State(), sub).getwidth()
                if lo != hi:
                    raise Unsupported("a lookbehind of variable width")
                held = pos - lo >= 0 and self.seq(sub, 0, pos - lo, ic, lambda p: p == pos)
            return held == (op is C.ASSERT) and rest(pos)
        raise Unsupported(f"opcode {op}")

    def atomic(self, nodes, pos: int, ic: bool, k) -> bool:
        """The first way `nodes` match at `pos`, kept: no backtracking into it."""
        ends: list[int] = []
        if not self.seq(nodes, 0, pos, ic, lambda p: ends.append(p) or True):
            return False
        return k(ends[0])

    def repeat(self, op, av, pos: int, ic: bool, k) -> bool:
        lo, hi, body = av
        body = list(body)
        hi = self.n + 1 if hi is C.MAXREPEAT else hi
        if len(body) == 1 and body[0][0] in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):   # sre's REPEAT_ONE
            b_op, b_av = body[0]
            if op is C.MAX_REPEAT:
                end = pos
                while end - pos < hi and end < self.n:
                    self.step()
                    if not self.one(b_op, b_av, self.text[end], ic):
                        break
                    end += 1
                for at in range(end, pos + lo - 1, -1):     # longest first, giving back one at a time
                    self.step()
                    if k(at):
                        return True
                return False
            at = pos                                        # lazy: the fewest first, one more at a time
            while True:
                if at - pos >= lo:
                    self.step()
                    if k(at):
                        return True
                if at - pos >= hi or at >= self.n:
                    return False
                self.step()
                if not self.one(b_op, b_av, self.text[at], ic):
                    return False
                at += 1

        def more(count: int, at: int) -> bool:
            # an iteration matching nothing once the minimum is met ends the repeat (sre's guard against looping)
            again = lambda p: (p != at or count < lo) and more(count + 1, p)      # noqa: E731
            if op is C.MAX_REPEAT:
                return count < hi and self.seq(body, 0, at, ic, again) or count >= lo and k(at)
            return count >= lo and k(at) or count < hi and self.seq(body, 0, at, ic, again)
        return more(0, pos)


def _nodes(pattern: re.Pattern):
    if not isinstance(pattern.pattern, str):
        raise Unsupported("a bytes pattern")
    return list(_parser.parse(pattern.pattern, pattern.flags & ~re.UNICODE))


def _deep(fn):
    """Run fn() on a thread with a deep stack (a general repeat recurses per iteration); its result or its error."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as e:                     # handed back to the caller's thread
            out["error"] = e
    old_limit, old_stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(max(old_limit, 1_000_000))
    threading.stack_size(_STACK)
    try:
        t = threading.Thread(target=body)
        t.start()
        t.join()
    finally:
        threading.stack_size(old_stack)
        sys.setrecursionlimit(old_limit)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _at(run: _Run, nodes, ic: bool, start: int, whole: bool = False) -> int | None:
    ends: list[int] = []
    if run.seq(nodes, 0, start, ic, lambda p: (not whole or p == run.n) and (ends.append(p) or True)):
        return ends[0]
    return None


def search(pattern: re.Pattern, text: str, pos: int = 0, endpos: int | None = None,
           limit: int | None = None) -> tuple[tuple[int, int] | None, int]:
    """(the span `pattern.search(text, pos, endpos)` finds or None, the steps it took)."""
    spans, steps = _scan(pattern, text, pos, endpos, limit, every=False)
    return (spans[0] if spans else None), steps


def finditer(pattern: re.Pattern, text: str, pos: int = 0, endpos: int | None = None,
             limit: int | None = None) -> tuple[list[tuple[int, int]], int]:
    """(the spans of `pattern.finditer(text, pos, endpos)`, the steps all of them took)."""
    return _scan(pattern, text, pos, endpos, limit, every=True)


def fullmatch(pattern: re.Pattern, text: str, pos: int = 0, endpos: int | None = None,
              limit: int | None = None) -> tuple[tuple[int, int] | None, int]:
    """(the span of `pattern.fullmatch(text, pos, endpos)` or None, the steps it took)."""
    return _anchored(pattern, text, pos, endpos, limit, whole=True)


def match(pattern: re.Pattern, text: str, pos: int = 0, endpos: int | None = None,
          limit: int | None = None) -> tuple[tuple[int, int] | None, int]:
    """(the span of `pattern.match(text, pos, endpos)` or None, the steps it took)."""
    return _anchored(pattern, text, pos, endpos, limit, whole=False)


def _anchored(pattern, text, pos, endpos, limit, whole):
    nodes = _nodes(pattern)
    text = text if endpos is None else text[:endpos]
    run = _Run(text, pattern.flags, limit)
    end = _deep(lambda: _at(run, nodes, bool(pattern.flags & re.IGNORECASE), pos, whole=whole))
    return ((pos, end) if end is not None else None), run.steps


def _scan(pattern, text, pos, endpos, limit, every):
    nodes = _nodes(pattern)
    text = text if endpos is None else text[:endpos]  # as if the string were endpos long (re's documented rule)
    run = _Run(text, pattern.flags, limit)
    ic = bool(pattern.flags & re.IGNORECASE)

    def go():
        spans, at = [], pos
        while at <= run.n:
            end = _at(run, nodes, ic, at)
            if end is None:
                at += 1
                continue
            spans.append((at, end))
            if not every:
                break
            at = end if end > at else at + 1        # an empty match: the next search starts one further (re does)
        return spans
    return _deep(go), run.steps


def steps(pattern: re.Pattern, text: str, limit: int | None = None) -> int:
    """The steps `pattern.search(text)` takes (every start position tried until one matches)."""
    return search(pattern, text, limit=limit)[1]


class Tally:
    """The steps of every pattern call made while `counting` holds (each call stopped past `per_char` steps a
    character of the text it searched, plus 1,000: TooManySteps)."""

    def __init__(self, per_char: int | None):
        self.steps, self.calls, self.per_char = 0, 0, per_char

    def add(self, fn, pattern: re.Pattern, text: str, pos: int, endpos: int) -> None:
        endpos = min(endpos, len(text))
        limit = None if self.per_char is None else self.per_char * max(endpos - pos, 1) + 1000
        self.steps += fn(pattern, text, pos, endpos, limit=limit)[1]
        self.calls += 1


class Counted:
    """A compiled pattern's stand-in: re's own answer, the instrument's steps added to a Tally."""

    def __init__(self, pattern: re.Pattern, tally: Tally):
        self.pattern, self.tally = pattern, tally
        self.flags, self.groups, self.groupindex = pattern.flags, pattern.groups, pattern.groupindex

    def search(self, text, pos=0, endpos=sys.maxsize):
        self.tally.add(search, self.pattern, text, pos, endpos)
        return self.pattern.search(text, pos, endpos)

    def match(self, text, pos=0, endpos=sys.maxsize):
        self.tally.add(match, self.pattern, text, pos, endpos)
        return self.pattern.match(text, pos, endpos)

    def fullmatch(self, text, pos=0, endpos=sys.maxsize):
        self.tally.add(fullmatch, self.pattern, text, pos, endpos)
        return self.pattern.fullmatch(text, pos, endpos)

    def finditer(self, text, pos=0, endpos=sys.maxsize):
        self.tally.add(finditer, self.pattern, text, pos, endpos)
        return self.pattern.finditer(text, pos, endpos)

    def findall(self, text, pos=0, endpos=sys.maxsize):
        self.tally.add(finditer, self.pattern, text, pos, endpos)
        return self.pattern.findall(text, pos, endpos)


class _CountedRe:
    """The `re` module as a counted module sees it: a pattern compiled inline (re.search(r"...", q)) is counted too."""

    def __init__(self, tally: Tally):
        self._tally = tally

    def __getattr__(self, name):
        return getattr(re, name)

    def search(self, pattern, text, flags=0):
        return Counted(re.compile(pattern, flags), self._tally).search(text)

    def finditer(self, pattern, text, flags=0):
        return Counted(re.compile(pattern, flags), self._tally).finditer(text)

    def findall(self, pattern, text, flags=0):
        return Counted(re.compile(pattern, flags), self._tally).findall(text)


@contextlib.contextmanager
def counting(*modules, per_char: int | None = None):
    """While held, the modules' patterns are counted (module-level re.Pattern attributes and their `re`): yields the
    Tally. Not thread-safe: the modules are patched for every thread while it holds."""
    tally, saved = Tally(per_char), []
    try:
        for module in modules:
            for attr, value in list(vars(module).items()):
                if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                    saved.append((module, attr, value))
                    setattr(module, attr, Counted(value, tally))
            if getattr(module, "re", None) is re:
                saved.append((module, "re", re))
                module.re = _CountedRe(tally)
        yield tally
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)

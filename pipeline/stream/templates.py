"""Line templates: a small streaming template miner, so lines of one message kind share a template id.

Owns `Miner`: a line's tokens (split on whitespace), with every token holding a digit masked to `<*>` first, are
matched against the templates of the same length and first token; the most similar one (share of positions equal or a
parameter, at least `threshold`; ties to the oldest id) takes the line and the positions that differ become `<*>`;
otherwise the line starts a template. This is Drain's fixed-depth tree cut to depth two (He et al., "Drain: An Online
Log Parsing Approach with Fixed Depth Tree", ICWS 2017), written here from the paper's idea. A template's id never
changes; its pattern only widens. The parameters of a line are its tokens at the template's `<*>` positions. Tokens
are split at whitespace, `|`, `,`, `;` and `=`. Never touches SQLite or a model.

Bounded work: a line is never compared with every template of its group. Each group indexes its templates by their
constant tokens ((position, token) -> ids, most recently used last); a line reads the index at its own tokens, rarest
first, at most `READ` ids in all and `PER_TOKEN` from one token, and compares only the `COMPARED` ids sharing most
tokens with it, plus the group's template with the most `<*>` (which may share none). When no token's list is cut,
this finds exactly the template a full scan finds (a template sharing no token scores at most its `<*>` count). The
miner keeps at most `max_templates` templates and `TOKENS_EACH` tokens a template on average, the least recently used
forgotten first (a line of that kind later starts a new id); `forget` drops templates whose lines are all gone.
"""
from __future__ import annotations

import heapq
import itertools
import re
from collections import OrderedDict
from dataclasses import dataclass, field

MASK = "<*>"
_DIGIT = re.compile(r"\d")
_TOKENS = re.compile(r"[\s|,;=]+")
READ = 512            # index entries a line reads at most
PER_TOKEN = 64        # of those, from one (position, token): the most recently used templates holding it
COMPARED = 16         # templates a line is compared with, token by token, at most (plus its group's widest)
TOKENS_EACH = 16      # the miner holds at most max_templates * TOKENS_EACH pattern tokens (~400 bytes each)


@dataclass
class _Template:
    tid: int
    key: tuple[int, str]
    pattern: list[str]
    masks: int                   # positions that are `<*>`


@dataclass
class _Group:
    """The templates of one (length, first token): their constant tokens indexed, and a heap of (-masks, id) whose
    valid top is the widest (entries of templates since widened or forgotten are skipped when met)."""
    index: dict[tuple[int, str], dict[int, None]] = field(default_factory=dict)    # insertion: use
    widest: list[tuple[int, int]] = field(default_factory=list)
    size: int = 0


class Miner:
    def __init__(self, threshold: float = 0.5, patterns: dict[int, str] | None = None, max_templates: int = 10_000):
        """patterns: templates already mined ({id: pattern}, as `take_changed` returned them), least recently used
        first, kept under their ids; max_templates: the most the miner holds (the least recently used forgotten)."""
        if max_templates < 1:
            raise ValueError(f"a miner holds at least one template, not {max_templates}")
        self.threshold, self.max_templates = threshold, max_templates
        self.groups: dict[tuple[int, str], _Group] = {}
        self.templates: OrderedDict[int, _Template] = OrderedDict()     # least recently used first
        self.tokens = 0                           # pattern tokens held
        self.changed: dict[int, str] = {}         # templates made or widened since `take_changed`
        self.compared = 0                         # templates compared token by token, all lines (for tests, figures)
        self.forgotten = 0                        # templates dropped to stay within the bounds
        self._next = 1
        for tid, pattern in (patterns or {}).items():
            self._keep(tid, pattern.split(" ") if pattern else [])
            self._next = max(self._next, tid + 1)
        self._bound()

    @staticmethod
    def _key(tokens: list[str]) -> tuple[int, str]:
        first = tokens[0] if tokens else ""
        return len(tokens), MASK if _DIGIT.search(first) else first

    def add(self, text: str) -> tuple[int, list[str]]:
        """(template id, parameters) of a line; the template is made or widened as needed."""
        raw = _TOKENS.split(text.strip()) if text.strip() else []
        tokens = [MASK if _DIGIT.search(t) else t for t in raw]
        best, best_score = self._best(tokens)
        if best is None or best_score < self.threshold:
            tid, self._next = self._next, self._next + 1
            template = self._keep(tid, tokens)
            self.changed[tid] = " ".join(tokens)
        else:
            template = best
            self._touch(template)
            if any(a != b and a != MASK for a, b in zip(template.pattern, tokens)):
                self._widen(template, tokens)
                self.changed[template.tid] = " ".join(template.pattern)
        params = [t for t, p in zip(raw, template.pattern) if p == MASK]
        tid = template.tid
        self._bound()
        return tid, params

    def _best(self, tokens: list[str]) -> tuple[_Template | None, float]:
        """The template most like `tokens` among a bounded number of its group's (see the module's docstring)."""
        group = self.groups.get(self._key(tokens))
        if group is None:
            return None, -1.0
        lists = [(i, group.index[(i, t)]) for i, t in enumerate(tokens) if i and (i, t) in group.index]
        lists.sort(key=lambda it: len(it[1]))                   # rarest first: they say most about the line
        shared: dict[int, int] = {}
        left = READ
        for _, ids in lists:
            for tid in itertools.islice(reversed(ids), min(PER_TOKEN, left)):
                shared[tid] = shared.get(tid, 0) + 1
                left -= 1
            if not left:
                break
        while group.widest and self._stale(group.widest[0]):
            heapq.heappop(group.widest)
        if group.widest:
            shared.setdefault(group.widest[0][1], 0)
        ranked = sorted(shared, key=lambda tid: (-(shared[tid] + self.templates[tid].masks), tid))
        best, best_score = None, -1.0
        for tid in sorted(ranked[:COMPARED]):                  # ids ascending: a tie goes to the oldest
            pattern = self.templates[tid].pattern
            self.compared += 1
            same = sum(a == b or a == MASK for a, b in zip(pattern, tokens))     # a parameter takes any token
            score = same / len(tokens) if tokens else 1.0
            if score > best_score:
                best, best_score = self.templates[tid], score
        return best, best_score

    def _stale(self, entry: tuple[int, int]) -> bool:
        t = self.templates.get(entry[1])
        return t is None or t.masks != -entry[0]

    def _keep(self, tid: int, tokens: list[str]) -> _Template:
        key = self._key(tokens)
        template = _Template(tid, key, tokens, sum(t == MASK for t in tokens))
        group = self.groups.setdefault(key, _Group())
        for i, t in enumerate(tokens):
            if i and t != MASK:
                group.index.setdefault((i, t), {})[tid] = None
        group.size += 1
        self._push(group, template)
        self.templates[tid] = template
        self.tokens += len(tokens)
        return template

    def _touch(self, template: _Template) -> None:
        """`template` was just used: the last to be forgotten, and first read in each of its tokens' lists."""
        self.templates.move_to_end(template.tid)
        index = self.groups[template.key].index
        for i, t in enumerate(template.pattern):
            if i and t != MASK:
                ids = index[(i, t)]
                del ids[template.tid]                      # a plain dict is smaller than an OrderedDict
                ids[template.tid] = None

    def _widen(self, template: _Template, tokens: list[str]) -> None:
        group = self.groups[template.key]
        for i, (a, b) in enumerate(zip(template.pattern, tokens)):
            if a != b and a != MASK:
                template.pattern[i] = MASK
                template.masks += 1
                if i:
                    self._unindex(group, (i, a), template.tid)
        self._push(group, template)

    def _push(self, group: _Group, template: _Template) -> None:
        heapq.heappush(group.widest, (-template.masks, template.tid))
        if len(group.widest) > 2 * group.size + 16:            # entries of widened or forgotten templates
            group.widest = [e for e in group.widest if not self._stale(e)]
            heapq.heapify(group.widest)

    @staticmethod
    def _unindex(group: _Group, at: tuple[int, str], tid: int) -> None:
        ids = group.index[at]
        del ids[tid]
        if not ids:
            del group.index[at]

    def forget(self, tids) -> None:
        """Drop these templates (their lines are all gone); ids not held are ignored."""
        for tid in tids:
            template = self.templates.pop(tid, None)
            self.changed.pop(tid, None)
            if template is not None:
                self._drop(template)

    def _drop(self, template: _Template) -> None:
        group = self.groups[template.key]
        for i, t in enumerate(template.pattern):
            if i and t != MASK:
                self._unindex(group, (i, t), template.tid)
        group.size -= 1
        if not group.size:
            del self.groups[template.key]
        self.tokens -= len(template.pattern)

    def _bound(self) -> None:
        """Forget the least recently used templates past max_templates or the tokens' bound (never the newest one:
        `changed` keeps a forgotten template's pattern until it is stored, since its lines name it)."""
        while len(self.templates) > 1 and (len(self.templates) > self.max_templates
                                           or self.tokens > self.max_templates * TOKENS_EACH):
            _, template = self.templates.popitem(last=False)
            self._drop(template)
            self.forgotten += 1

    def take_changed(self) -> dict[int, str]:
        """Templates made or widened since the last call ({id: pattern}), to be stored."""
        changed, self.changed = self.changed, {}
        return changed

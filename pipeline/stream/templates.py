"""Line templates: a small streaming template miner, so lines of one message kind share a template id.

Owns `Miner`: a line's tokens (split on whitespace), with every token holding a digit masked to `<*>` first, are
matched against the templates of the same length and first token; the most similar one (share of positions equal or a
parameter, at least `threshold`) takes the line and the positions that differ become `<*>`; otherwise the line starts a template.
This is Drain's fixed-depth tree cut to depth two (He et al., "Drain: An Online Log Parsing Approach with Fixed Depth
Tree", ICWS 2017), written here from the paper's idea. A template's id never changes; its pattern only widens.
The parameters of a line are its tokens at the template's `<*>` positions. Tokens are split at whitespace, `|`, `,`, `;` and `=`. Never touches SQLite or
a model.
"""
from __future__ import annotations

import re

MASK = "<*>"
_DIGIT = re.compile(r"\d")
_TOKENS = re.compile(r"[\s|,;=]+")


class Miner:
    def __init__(self, threshold: float = 0.5, patterns: dict[int, str] | None = None):
        """patterns: templates already mined ({id: pattern}, as `patterns` returned them), kept under their ids."""
        self.threshold = threshold
        self.groups: dict[tuple[int, str], list[tuple[int, list[str]]]] = {}
        self.changed: dict[int, str] = {}         # templates made or widened since `take_changed`
        self._next = 1
        for tid, pattern in sorted((patterns or {}).items()):
            tokens = pattern.split(" ") if pattern else []
            self.groups.setdefault(self._key(tokens), []).append((tid, tokens))
            self._next = max(self._next, tid + 1)

    @staticmethod
    def _key(tokens: list[str]) -> tuple[int, str]:
        first = tokens[0] if tokens else ""
        return len(tokens), MASK if _DIGIT.search(first) else first

    def add(self, text: str) -> tuple[int, list[str]]:
        """(template id, parameters) of a line; the template is made or widened as needed."""
        raw = _TOKENS.split(text.strip()) if text.strip() else []
        tokens = [MASK if _DIGIT.search(t) else t for t in raw]
        group = self.groups.setdefault(self._key(tokens), [])
        best, best_score = None, -1.0
        for i, (_, pattern) in enumerate(group):
            same = sum(a == b or a == MASK for a, b in zip(pattern, tokens))     # a parameter takes any token
            score = same / len(tokens) if tokens else 1.0
            if score > best_score:
                best, best_score = i, score
        if best is None or best_score < self.threshold:
            tid, self._next = self._next, self._next + 1
            group.append((tid, tokens))
            self.changed[tid] = " ".join(tokens)
            pattern = tokens
        else:
            tid, pattern = group[best]
            if any(a != b and a != MASK for a, b in zip(pattern, tokens)):
                pattern = [a if a == b else MASK for a, b in zip(pattern, tokens)]
                group[best] = (tid, pattern)
                self.changed[tid] = " ".join(pattern)
        return tid, [t for t, p in zip(raw, pattern) if p == MASK]

    def take_changed(self) -> dict[int, str]:
        """Templates made or widened since the last call ({id: pattern}), to be stored."""
        changed, self.changed = self.changed, {}
        return changed

"""Identifiers in log text: what the lines in view carry, and what an answer mentions.

Owns the identifier class (the TEP tag: `TAG`, as alarm consoles write it: FIR123, AIR003_3) and the reader that
finds identifiers in an answer, written independently of the rule that constrains answers (pipeline/decode/rules.py):
regular expressions with the variants a reader would take for the same tag (any case, "fir123"; upper-case letters
and digits apart by one space or hyphen, "FIR 123", "FIR-123"), compared upper-case without the separator. Never
runs a model.
"""
from __future__ import annotations

import re

TAG = re.compile(r"\b[A-Z]{1,4}\d{2,4}(?:_\d+)?\b")
_MENTIONS = (re.compile(r"\b([a-z]{1,4})(\d{2,4}(?:_\d+)?)\b", re.ASCII | re.IGNORECASE),
             re.compile(r"\b([A-Z]{1,4})[ -](\d{2,4}(?:_\d+)?)\b", re.ASCII))


def identifiers_in(text: str) -> list[str]:
    """The identifiers a log line carries (the class's matches, as written)."""
    return TAG.findall(text)


def carried(text: str, tags=()) -> list[str]:
    """A record's identifiers: its source's tag fields and the class's matches in its text."""
    return sorted(set(tags) | set(identifiers_in(text)))


def mentioned(text: str) -> list[str]:
    """Every identifier an answer mentions, in any of the variants, normalised (upper case, no separator)."""
    found = {(m[1] + m[2]).upper() for pattern in _MENTIONS for m in pattern.finditer(text)}
    return sorted(found)


def invented(text: str, visible) -> list[str]:
    """The identifiers `text` mentions that none of `visible` (identifiers in view, as written) is."""
    seen = {v.upper() for v in visible}
    return [m for m in mentioned(text) if m not in seen]

"""The severity a log line states, read by code: an assessment's `Severity` is computed from its lines, never
generated.

Owns the mapping, from what a line writes to one of SEVERITIES:

- a TEP alarm line (``HH:MM:SS TAG TYPE DESCRIPTION``, TYPE right after an identifier): HH or LL (high-high,
  low-low: the second limit passed) -> high; H or L -> medium; a recovery (``H NR``, ``HH NR``, ...) -> low. The top
  of the scale, critical, is left to logs that say so: the alarm types name a limit passed, not an outcome;
- any other line, its first level word in capitals: FATAL, CRITICAL, CRIT, EMERG, EMERGENCY, ALERT, PANIC ->
  critical; ERROR, ERR, SEVERE -> high; WARN, WARNING -> medium; INFO, NOTICE, DEBUG, TRACE, FINE -> low;
- a line stating none (a syslog line "sshd[...]: authentication failure") -> "": an assessment of such lines leaves
  the field out.

Lines together: the highest they state (an HH line, then its recovery: high). Never runs a model.
"""
from __future__ import annotations

import re

from pipeline.stream.identifiers import TAG
from pipeline.stream.words import LEVEL_WORDS, SEVERITIES

ALARM_TYPES = {"HH": "high", "LL": "high", "H": "medium", "L": "medium"}
_ALARM = re.compile(rf"(?:^|\s){TAG.pattern}\s+(HH|LL|H|L)(\s+NR)?(?=\s|$)")
_LEVEL = re.compile(r"(?<![A-Za-z0-9_.\-])(" + "|".join(sorted(LEVEL_WORDS, key=len, reverse=True)) +
                    r")(?![A-Za-z0-9_\-])")


def severity_of(text: str) -> str:
    """The severity one rendered line states (the module docstring), or "" when it states none."""
    alarm = _ALARM.search(text)
    if alarm is not None:
        return "low" if alarm[2] else ALARM_TYPES[alarm[1]]
    level = _LEVEL.search(text)
    return LEVEL_WORDS[level[1]] if level is not None else ""


def highest(severities) -> str:
    """The highest of the severities lines state ("" when none states one)."""
    stated = [s for s in severities if s]
    return max(stated, key=SEVERITIES.index) if stated else ""

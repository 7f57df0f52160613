"""What a verb of `run.py` returns: its result, how the result reads as text and as JSON, and the exit code.

Owns the contract `run.py` prints by: with --json, `as_dict()` as one JSON object (indented by `indent`, nothing
printed when it is None); otherwise `text()` on stdout (nothing when None) and `notes()` on stderr (nothing when
empty); --out writes `saved()`; the process exits with `exit_code`. A `Failure` prints only its line, on stderr.
Never computes a result: each verb's report class lives beside the code that produces the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class Report:
    """A result with nothing to say beyond itself (a pipeline run that printed as it went)."""
    data: Any = None
    indent: ClassVar[int | None] = None

    def as_dict(self) -> Any:
        return self.data

    def saved(self) -> Any:
        """What --out writes (the full result, which may hold more than --json prints)."""
        return self.as_dict()

    def text(self) -> str | None:
        return None

    def notes(self) -> str:
        return ""

    @property
    def exit_code(self) -> int:
        return 0


@dataclass
class Failure(Report):
    """A verb that ended with a verdict instead of a result: `line` on stderr, nothing on stdout, exit `code`."""
    line: str = ""
    code: int = 1

    @property
    def exit_code(self) -> int:
        return self.code

"""One builder per file in the shared cache: any number of processes may ask for the same file at once.

Owns the protocol. A finished file only ever appears by an atomic rename of a complete one, so "it exists" means
"it is finished"; a process that finds it missing takes an exclusive `flock` on `NAME.lock` beside it, looks again,
and only then builds, into `NAME.part`, which it renames when done. The others block on the lock and then find the
file. The kernel releases a lock when its holder dies, so a build killed half-way leaves a `.part` that nothing
mistakes for a finished file and that the next builder overwrites. Never decides what is built.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable


@contextmanager
def locked(path: Path):
    """Hold the exclusive lock that guards `path` (the file `path.lock`, created if missing and kept)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                          # closing the descriptor releases the lock


def build_once(path: Path, build: Callable[[Path], None], guard: Path | None = None) -> Path:
    """`path`, built by `build(part)` into a temporary file that is renamed to `path` when complete, by exactly one
    of the processes asking at the same time. guard: the name whose lock serializes the build (default: path; one
    guard for several files keeps one lock file where they live)."""
    path = Path(path)
    if path.exists():
        return path
    with locked(guard or path):
        if not path.exists():                 # another process may have built it while this one waited
            part = path.with_name(path.name + ".part")
            build(part)
            os.replace(part, path)
    return path

"""The journal: the run's durable record (JSON lines), and where a restart reads back what was committed.

Owns the file's two halves. `Journal` appends a record and makes it durable (write, flush, fsync) before returning:
a stream line is committed, and an assessment written, only once the record naming it has passed through here
(README, "Surviving faults"). `resume_point` reads the last checkpoint back, as the `Checkpoint` message it was
written from: a `checkpoint` record, or the one an `assessment` record carries; a torn last record (the writer was
killed mid-write) is skipped, and the next writer starts it on a line of its own. Never decides what is committed:
the cache owner does, by sending a Checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator

from pipeline.messages import Checkpoint

TAIL_BYTES = 4 << 20          # a resume reads the journal's last 4 MB first (checkpoints come every few seconds)


class Journal:
    """Append-only JSONL writer; every record is fsynced before `append` returns."""

    def __init__(self, path: str):
        self.path = path
        self.f = open(path, "ab")
        if self.f.tell():
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":            # a record torn by a crash: keep it alone on its line
                    self.f.write(b"\n")

    def append(self, record: dict) -> None:
        self.f.write(json.dumps(record).encode() + b"\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def records(path: str, start: int = 0) -> Iterator[dict]:
    """The journal's records from byte `start` (a partial first line skipped), a torn or foreign line skipped."""
    with open(path, "rb") as f:
        f.seek(start)
        if start:
            f.readline()
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec


def checkpoint_of(rec: dict) -> dict | None:
    """The checkpoint a record carries: a checkpoint record itself, or an assessment's."""
    if rec.get("kind") == "checkpoint":
        return rec
    if rec.get("kind") == "assessment" and isinstance(rec.get("checkpoint"), dict):
        return rec["checkpoint"]
    return None


def resume_point(path: str, source: str) -> Checkpoint | None:
    """The last durable checkpoint of `source` in the journal at `path`, or None (no journal, or nothing committed
    yet). ValueError when the journal's last checkpoint is another source's: resuming would skip the wrong lines."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return None
    last = None
    for start in ([max(0, size - TAIL_BYTES), 0] if size > TAIL_BYTES else [0]):
        for rec in records(path, start):
            last = checkpoint_of(rec) or last
        if last is not None:
            break
    if last is not None and last.get("source") != source:
        raise ValueError(f"{path}: its last checkpoint is of {last.get('source')!r}, not {source!r}; resume with "
                         f"the journal of this source, or start a new journal")
    if last is None:
        return None
    names = [f.name for f in dataclasses.fields(Checkpoint)]      # the record adds kind, t, stream: dropped here
    try:
        return Checkpoint(**{name: last[name] for name in names if name in last})
    except TypeError:
        raise ValueError(f"{path}: its last checkpoint lacks {sorted(set(names) - set(last))}: not a ringspec "
                         f"journal's checkpoint") from None

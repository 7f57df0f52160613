"""The journal: the run's durable record (JSON lines), and where a restart reads back what was committed.

Owns the file's two halves. `Journal` appends a record and makes it durable (write, flush, fsync) before returning:
a stream line is committed, and an assessment written, only once the record naming it has passed through here
(README, "Surviving faults"). `resume_point` reads the last checkpoint back, as the `Checkpoint` message it was
written from: a `checkpoint` record, or the one an `assessment` record carries; a torn last record (the writer was
killed mid-write) is skipped, and the next writer starts it on a line of its own. Never decides what is committed:
the cache owner does, by sending a Checkpoint.

The journal does not grow forever: once the file passes `max_bytes`, the next record carrying a checkpoint closes it.
It becomes F.1 (F.1 becomes F.2, ..., `keep` files in all, the oldest dropped), and the new F starts with that
checkpoint carried over (`carried`, no lines of its own), so F alone says where a restart resumes; `resume_point`
still reads back across the kept files (a crash between the rename and the carried record), and `history` reads
them all, oldest first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from typing import Iterator

from pipeline.messages import Checkpoint

TAIL_BYTES = 4 << 20          # a resume reads the journal's last 4 MB first (checkpoints come every few seconds)


class Journal:
    """Append-only JSONL writer; every record is fsynced before `append` returns. max_bytes: rotate past this size
    (0: never); keep: the files kept, this one included."""

    def __init__(self, path: str, max_bytes: int = 0, keep: int = 1):
        if keep < 1:
            raise ValueError(f"a journal keeps at least its own file, not {keep}")
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.f = open(path, "ab")
        if self.f.tell():
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":            # a record torn by a crash: keep it alone on its line
                    self.f.write(b"\n")

    def append(self, record: dict) -> None:
        self._write(record)
        point = checkpoint_of(record)
        if self.max_bytes and point is not None and self.f.tell() >= self.max_bytes:
            self._rotate(record, point)

    @classmethod
    def of(cls, path: str, supervise) -> Journal:
        """The journal at `path` rotated as a profile's [supervise] says (pipeline/config.py)."""
        return cls(path, int(supervise.journal_max_mb * (1 << 20)), supervise.journal_keep)

    def _write(self, record: dict) -> None:
        self.f.write(json.dumps(record).encode() + b"\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def _rotate(self, record: dict, point: dict) -> None:
        """F -> F.1 -> ... -> F.(keep-1), the oldest dropped; a new F that starts with the checkpoint just written."""
        self.f.close()
        for i in range(self.keep - 1, 0, -1):
            older = f"{self.path}.{i}"
            if i == self.keep - 1:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(older)
            elif os.path.exists(older):
                os.replace(older, f"{self.path}.{i + 1}")
        if self.keep > 1:
            os.replace(self.path, f"{self.path}.1")
        else:
            os.remove(self.path)
        _sync_dir(self.path)
        self.f = open(self.path, "ab")
        named = {"stream": record["stream"]} if "stream" in record else {}
        fields = {f.name: point[f.name] for f in dataclasses.fields(Checkpoint) if f.name in point}
        self._write({**named, "kind": "checkpoint", **fields, "offsets": [], "carried": True, "t": record.get("t")})

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


def files(path: str) -> list[str]:
    """The journal's files, oldest first: its rotated ones (F.N, ..., F.1), then F itself when it exists."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    rotated = sorted((int(m.group(1)), n) for n in names if (m := re.fullmatch(re.escape(name) + r"\.(\d+)", n)))
    return [os.path.join(folder, n) for _, n in reversed(rotated)] + ([path] if os.path.exists(path) else [])


def history(path: str) -> Iterator[dict]:
    """Every record of the journal at `path` across its rotated files, oldest first."""
    for each in files(path):
        yield from records(each)


def _sync_dir(path: str) -> None:
    """A rename is durable once the directory holding it is."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    last = None
    for each in reversed(files(path)):              # the newest file first; an older one if it holds none
        size = os.path.getsize(each)
        for start in ([max(0, size - TAIL_BYTES), 0] if size > TAIL_BYTES else [0]):
            for rec in records(each, start):
                last = checkpoint_of(rec) or last
            if last is not None:
                break
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

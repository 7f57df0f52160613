"""The journal: the run's durable record (JSON lines), and where a restart reads back what was committed.

Owns the file's two halves. `Journal` appends a record and makes it durable (write, flush, fsync) before returning:
a stream line is committed, and an assessment written, only once the record naming it has passed through here
(README, "Surviving faults"). `resume_point` reads the last checkpoint back, as the `Checkpoint` message it was
written from: a `checkpoint` record, or the one an `assessment` record carries; a torn last record (the writer was
killed mid-write) is skipped, and the next writer starts it on a line of its own. Never decides what is committed:
the cache owner does, by sending a Checkpoint.

The journal does not grow forever: once the file passes `max_bytes`, whatever record passed it (a line's, an
assessment's, an operator's answer: answers come with the stream idle or ended too), it is closed. It becomes F.1 (F.1
becomes F.2, ..., `keep` files in all, the oldest dropped), and the new F starts with the last checkpoint written
carried over (`carried`, no lines of its own; written to a new file first, which then takes F's name), so F alone
says where a restart resumes and no line is committed twice; `resume_point` still reads back across the kept files (a
crash between the two renames), and `history` reads them all, oldest first.

The journal holds operators' questions and answers: its files are created 0600 (an older F is made 0600 when opened).
Its directory may be shared (a sticky /tmp): a file at F is opened only if it is a regular file of this user (else a
clear error), and a kept file (F.N) is read, renamed or removed only if it is one too, never followed
(lstat, O_NOFOLLOW): another user's file, a symlink or a directory at F.N is left alone, counted (`refused`) and told
once on stderr; rotation goes on around it (the file of ours that would move onto it is dropped instead) and never
raises because of it.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
import sys
import tempfile
from collections import Counter
from typing import Iterator

from pipeline.messages import Checkpoint

TAIL_BYTES = 4 << 20          # a resume reads the journal's last 4 MB first (checkpoints come every few seconds)
MODE = 0o600                  # the journal holds operators' questions and answers
refused: Counter[str] = Counter()     # files at a journal's names that it did not write, by path: left alone, unread


class Journal:
    """Append-only JSONL writer; every record is fsynced before `append` returns. max_bytes: rotate past this size
    (0: never); keep: the files kept, this one included."""

    def __init__(self, path: str, max_bytes: int = 0, keep: int = 1):
        if keep < 1:
            raise ValueError(f"a journal keeps at least its own file, not {keep}")
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.f = _append(path)
        if self.f.tell():
            with _read(path) as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":            # a record torn by a crash: keep it alone on its line
                    self.f.write(b"\n")
        last = _last(path)
        self.carry = _carried(*last) if last is not None else None     # what a new F starts with
        folder, name = os.path.split(os.path.abspath(path))
        for left in os.listdir(folder):          # a new F a crash left before it took F's name (its record is kept)
            if left.startswith(f".{name}.") and _ours(os.path.join(folder, left)):
                os.remove(os.path.join(folder, left))

    def append(self, record: dict) -> None:
        self._write(record)
        point = checkpoint_of(record)
        if point is not None:
            self.carry = _carried(record, point)
        if self.max_bytes and self.f.tell() >= self.max_bytes:
            self._rotate(record.get("t"))

    @classmethod
    def of(cls, path: str, supervise) -> Journal:
        """The journal at `path` rotated as a profile's [supervise] says (pipeline/config.py)."""
        return cls(path, int(supervise.journal_max_mb * (1 << 20)), supervise.journal_keep)

    def _write(self, record: dict) -> None:
        self.f.write(json.dumps(record).encode() + b"\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def _rotate(self, t) -> None:
        """F -> F.1 -> ... -> F.(keep-1), the oldest dropped; a new F that starts with the last checkpoint written.
        The new F is written under a name of its own first, so a crash leaves the checkpoint in F or in F.1."""
        folder, name = os.path.split(os.path.abspath(self.path))
        fd, new = tempfile.mkstemp(dir=folder, prefix=f".{name}.")          # 0600, a name no one can plant
        with os.fdopen(fd, "ab") as f:
            if self.carry is not None:
                f.write(json.dumps({**self.carry, "t": t}).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self.f.close()
        for i in range(self.keep - 1, 0, -1):
            older, newer = f"{self.path}.{i}", f"{self.path}.{i + 1}"
            if i == self.keep - 1 or not _ours(older) or _move(older, newer) is None:
                _remove(older)
        if self.keep > 1:
            _move(self.path, f"{self.path}.1")  # not moved (F.1 is not ours): F's records go as the oldest would
        os.replace(new, self.path)              # one rename: F holds the old records or the carried checkpoint
        _sync_dir(self.path)
        self.f = _append(self.path)

    def close(self) -> None:
        self.f.close()


def _carried(record: dict, point: dict) -> dict:
    """The record a new F starts with: the checkpoint `point` (carried by `record`), naming no line of its own."""
    named = {"stream": record["stream"]} if "stream" in record else {}
    fields = {f.name: point[f.name] for f in dataclasses.fields(Checkpoint) if f.name in point}
    return {**named, "kind": "checkpoint", **fields, "offsets": [], "carried": True}


def _append(path: str):
    """The journal's file F for appending: created 0600, never through a symlink; ValueError when F is not a regular
    file of this user (a file planted in a shared directory is not written to, nor its questions read)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, MODE)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO):      # a symlink; a FIFO no one reads
            raise
        raise ValueError(f"{path}: not a journal this user wrote (a {_kind(os.lstat(path))}); name another "
                         f"--journal") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ValueError(f"{path}: not a journal this user wrote (a {_kind(st)} of uid {st.st_uid}); name another "
                         f"--journal")
    os.fchmod(fd, MODE)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def _read(path: str):
    """A journal's file for reading, or OSError when it is not one it wrote (checked on the file opened)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        _refuse(path, st)
        raise PermissionError(f"{path}: not a journal file this user wrote")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _ours(path: str) -> bool:
    """A file the journal wrote: a regular file of this user (lstat: a symlink is never followed). False when there
    is none; another's file is told and counted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
        return True
    _refuse(path, st)
    return False


def _kind(st: os.stat_result) -> str:
    return ("symlink" if stat.S_ISLNK(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode)
            else "file" if stat.S_ISREG(st.st_mode) else "special file")


def _refuse(path: str, st: os.stat_result) -> None:
    if not refused[path]:
        print(f"ringspec: journal: {path} is a {_kind(st)} of uid {st.st_uid}, not a file this journal wrote: left "
              f"alone, never read (counted)", file=sys.stderr, flush=True)
    refused[path] += 1


def _move(src: str, dst: str) -> str | None:
    """Rename our file `src` to `dst` unless another's file is there (os.replace replaces a symlink itself, never
    its target); `dst`, or None when it was not moved."""
    if os.path.lexists(dst) and not _ours(dst):
        return None
    try:
        os.replace(src, dst)
    except OSError as e:                         # planted between the check and here (a sticky directory refuses)
        print(f"ringspec: journal: {src} -> {dst}: {e}", file=sys.stderr, flush=True)
        return None
    return dst


def _remove(path: str) -> None:
    """Remove our file at `path`, if it is one."""
    if _ours(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def records(path: str, start: int = 0) -> Iterator[dict]:
    """The journal's records from byte `start` (a partial first line skipped), a torn or foreign line skipped."""
    try:
        f = _read(path)
    except PermissionError:
        return
    with f:
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
    """The journal's files, oldest first: its rotated ones (F.N, ..., F.1), then F itself when it exists; those
    it did not write (see above) left out."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    rotated = sorted((int(m.group(1)), n) for n in names if (m := re.fullmatch(re.escape(name) + r"\.(\d+)", n)))
    kept = [os.path.join(folder, n) for _, n in reversed(rotated)] + [path]
    return [each for each in kept if _ours(each)]          # another's file at one of its names: left alone, unread


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


def _last(path: str) -> tuple[dict, dict] | None:
    """(record, checkpoint) of the last checkpoint the journal at `path` holds (newest file first; an older one if
    it holds none)."""
    last = None
    for each in reversed(files(path)):
        size = os.path.getsize(each)
        for start in ([max(0, size - TAIL_BYTES), 0] if size > TAIL_BYTES else [0]):
            for rec in records(each, start):
                point = checkpoint_of(rec)
                last = (rec, point) if point is not None else last
            if last is not None:
                return last
    return None


def resume_point(path: str, source: str) -> Checkpoint | None:
    """The last durable checkpoint of `source` in the journal at `path`, or None (no journal, or nothing committed
    yet). ValueError when the journal's last checkpoint is another source's: resuming would skip the wrong lines."""
    found = _last(path)
    last = found[1] if found is not None else None
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

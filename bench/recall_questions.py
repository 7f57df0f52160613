"""Questions whose answers lie outside the model's window, and how often the archive retrieves the answering line.

Owns the question set built from TEP alarm CSVs and the recall@k measurement over `pipeline.stream.archive`. Never runs
a model and never writes anywhere but the archive directory it is given.

A "record index" here is the record's position in `read_log(log, "csv")`; an archive built for a log from record 0
gives record index i the seq `seq_of(i)` = i + 1.
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.stream.archive import Archive, search
from pipeline.stream.records import Record, read_log

PHRASES = {"H": "HIGH", "L": "LOW", "HH": "HIGH HIGH", "LL": "LOW LOW"}   # as operators say the alarm types
ALARM_TEMPLATES = ("When did {tag} last go {phrase}?", "When did {tag} last raise a {phrase} alarm?")
RECOVERY_TEMPLATE = "When did {tag} last return to normal from {phrase}?"   # the "X NR" types


@dataclass(frozen=True)
class Question:
    log: str            # path of the CSV
    upto: int           # the stream has been read up to and including record index `upto`
    window_from: int    # first record index still inside the model's window (lines >= window_from are in the ring)
    text: str           # e.g. "When did PIR108 last go HIGH HIGH?"
    answer: str         # the clock time HH:MM:SS of the answering line, e.g. "01:32:20"
    answer_offset: int  # record index of the answering line (must be < window_from)


def seq_of(index: int) -> int:
    """The archive seq of record index `index` in an archive built from record 0 of its log."""
    return index + 1


def alarm_of(record: Record) -> tuple[str, str]:
    """(tag, type) of a rendered TEP line 'HH:MM:SS TAG TYPE DESCRIPTION'; recovery types are two words ('H NR')."""
    words = record.text.split()
    return words[1], words[2] + (" NR" if words[3:4] == ["NR"] else "")


def clock_of(record: Record) -> str:
    return record.text.split(" ", 1)[0]


def phrase(tag: str, kind: str, rng: random.Random) -> str:
    if kind.endswith(" NR"):
        return RECOVERY_TEMPLATE.format(tag=tag, phrase=PHRASES[kind[:-3]])
    return rng.choice(ALARM_TEMPLATES).format(tag=tag, phrase=PHRASES[kind])


def question_at(log: str, records: list[Record], upto: int, window_lines: int, rng: random.Random) -> Question | None:
    """One question at stream point `upto` about an alarm last seen before the window and absent from it, or None."""
    window_from = upto - window_lines + 1
    in_window = {alarm_of(r) for r in records[window_from:upto + 1]}
    latest = {alarm_of(r): i for i, r in enumerate(records[:window_from])}   # later lines overwrite: the last one
    clocks = Counter((alarm_of(r), clock_of(r)) for r in records[:window_from])
    eligible = sorted(a for a, i in latest.items()
                      if a not in in_window and a[1].split()[0] in PHRASES
                      and clocks[(a, clock_of(records[i]))] == 1)        # the answer's clock names one line only
    if not eligible:
        return None
    tag, kind = rng.choice(eligible)
    answer = latest[(tag, kind)]
    return Question(log, upto, window_from, phrase(tag, kind, rng), clock_of(records[answer]), answer)


def build(logs: list[str], per_log: int = 5, window_lines: int = 40, seed: int = 0) -> list[Question]:
    """Deterministic: pick stream points `upto`; window_from = upto - window_lines + 1; ask about (tag, type) pairs
    whose most recent occurrence before `upto` is outside the window (answer_offset < window_from) and that do not
    occur inside the window at all (otherwise the window answers it). Phrase types as operators say them: H -> "HIGH",
    L -> "LOW", HH -> "HIGH HIGH", LL -> "LOW LOW", NR -> "return to normal". Skip pairs whose answer time is
    ambiguous (the same clock string on another line of that pair)."""
    questions = []
    for log in logs:
        records = read_log(log, "csv")
        rng = random.Random(f"{seed}:{Path(log).name}")       # per log: adding a log leaves the others' questions
        points = list(range(window_lines, len(records)))        # upto >= window_lines leaves a line before the window
        rng.shuffle(points)
        found = []
        for upto in points:
            if len(found) == per_log:
                break
            question = question_at(str(log), records, upto, window_lines, rng)
            if question is not None:
                found.append(question)
        questions += sorted(found, key=lambda q: q.upto)
    return questions


def archive_for(log: str, upto: int, archive_dir) -> Path:
    """An archive of records [0, upto] (at least) of `log`, kept in archive_dir and extended when a later question
    needs more. Lines past a question's window are never seen: search excludes seq >= seq_of(window_from)."""
    path = Path(archive_dir) / f"{Path(log).stem}-{hashlib.sha1(str(log).encode()).hexdigest()[:10]}.sqlite"
    with Archive(path, flush_every=1024) as archive:
        have = archive.next_seq - 1                               # records [0, have) are stored
        for index, record in enumerate(read_log(log, "csv")[have:upto + 1], start=have):
            seq = archive.add(record.offset, record.time, record.text)
            assert seq == seq_of(index), f"{path}: record {index} got seq {seq}, not {seq_of(index)}"
    return path


def recall_at_k(questions, k: int, archive_dir) -> dict:
    """For each question, build (or reuse, cached by log path) an archive of records [0, upto] of its log in
    archive_dir, search(question.text, k, before_seq=<seq of window_from>) and count a hit when the answering line
    (its seq) is among the k. Returns {"k": k, "questions": n, "recall": share, "per_question": [...]}"""
    Path(archive_dir).mkdir(parents=True, exist_ok=True)
    needed = {}
    for q in questions:
        needed[q.log] = max(needed.get(q.log, -1), q.upto)
    archives = {log: archive_for(log, upto, archive_dir) for log, upto in needed.items()}
    per_question = []
    for q in questions:
        hits = search(archives[q.log], q.text, k, before_seq=seq_of(q.window_from))
        seqs = [h.seq for h in hits]
        rank = seqs.index(seq_of(q.answer_offset)) + 1 if seq_of(q.answer_offset) in seqs else None
        per_question.append({**asdict(q), "hit": rank is not None, "rank": rank, "retrieved": [h.text for h in hits]})
    found = sum(p["hit"] for p in per_question)
    return {"k": k, "questions": len(questions), "recall": found / len(questions) if questions else 0.0,
            "per_question": per_question}

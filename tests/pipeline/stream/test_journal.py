"""The journal: what a restart reads back as committed, from whatever a crash left in the file. No model, fast."""
import json
import os

import pytest

from pipeline.messages import Checkpoint, as_dict
from pipeline.launch.supervise import _end_of, _started
from pipeline.stream import journal
from pipeline.stream.journal import Journal, resume_point

SRC = "/var/log/dcs.csv"


def checkpoint(offset: int, **kw) -> dict:
    return {"kind": "checkpoint", "source": SRC, "offset": offset, "loop": 0, "seq": offset // 10, "offsets": [offset],
            "position": offset, "window_offset": 0, "window_loop": 0, "window_seq": 0, "lines": offset // 10,
            "since": 0, **kw}


def test_the_last_checkpoint_wins_whether_a_checkpoint_record_or_an_assessments(tmp_path):
    path = tmp_path / "j.jsonl"
    j = Journal(str(path))
    j.append({"kind": "start"})
    j.append(checkpoint(100))
    j.append({"kind": "assessment", "text": "...", "checkpoint": checkpoint(200, kind=None)})
    j.close()
    assert resume_point(str(path), SRC).offset == 200


def test_a_record_torn_by_a_crash_is_skipped_and_the_next_writer_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps(checkpoint(100)) + "\n" + json.dumps(checkpoint(200))[:25])   # killed mid-write
    assert resume_point(str(path), SRC).offset == 100
    j = Journal(str(path))
    j.append(checkpoint(300))
    j.close()
    assert resume_point(str(path), SRC).offset == 300
    assert [r["offset"] for r in journal.records(str(path))] == [100, 300]


def test_no_journal_or_no_checkpoint_means_start_from_the_beginning(tmp_path):
    assert resume_point(str(tmp_path / "none.jsonl"), SRC) is None
    (tmp_path / "j.jsonl").write_text('{"kind": "start"}\n')
    assert resume_point(str(tmp_path / "j.jsonl"), SRC) is None


def test_resuming_another_sources_journal_is_refused_by_name(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps(checkpoint(100)) + "\n")
    with pytest.raises(ValueError, match="its last checkpoint is of '/var/log/dcs.csv', not '/other.csv'"):
        resume_point(str(path), "/other.csv")


def test_a_long_journal_is_read_from_its_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "TAIL_BYTES", 300)
    path = tmp_path / "j.jsonl"
    path.write_text("".join(json.dumps(checkpoint(i * 10)) + "\n" for i in range(100)))
    assert resume_point(str(path), SRC).offset == 990


def test_a_checkpoint_reads_back_as_the_message_it_was_written_from(tmp_path):
    """What output journals (the message's fields, then its time and stream name) is the Checkpoint a restart gets."""
    sent = Checkpoint(source=SRC, offset=643, loop=1, seq=65, offsets=[611, 643], position=2048, window_offset=40,
                      window_loop=1, window_seq=3, lines=65, since=5, due="every")
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"stream": "tep", **as_dict(sent), "t": 1.5}) + "\n")
    assert as_dict(resume_point(str(path), SRC)) == as_dict(sent)
    path.write_text(json.dumps({"kind": "checkpoint", "source": SRC, "offset": 100}) + "\n")
    with pytest.raises(ValueError, match="its last checkpoint lacks"):
        resume_point(str(path), SRC)


def fill(j: Journal, first: int, n: int) -> None:
    """n records of about 400 bytes, a checkpoint every third (an assessment's or a checkpoint record)."""
    for i in range(first, first + n):
        if i % 3 == 2:
            j.append(checkpoint(i * 10) if i % 2 else {"kind": "assessment", "text": "x" * 200,
                                                       "checkpoint": checkpoint(i * 10, kind=None)})
        else:
            j.append({"kind": "line", "text": "y" * 380, "nll_n": 1})


def test_a_journal_past_its_size_rotates_after_a_checkpoint_and_keeps_its_last_files(tmp_path):
    """Finding 9 of the security round: the journal grew forever. Rotated, F alone says where to resume (the
    checkpoint carried over, no lines of its own), `keep` files stay, and every line is committed once across them."""
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), max_bytes=2_000, keep=3)
    fill(j, 0, 60)
    j.close()
    kept = journal.files(str(path))
    assert [p.rsplit("/", 1)[-1] for p in kept] == ["j.jsonl.2", "j.jsonl.1", "j.jsonl"]
    assert all(p.stat().st_size < 2_000 + 1_000 for p in tmp_path.iterdir())       # cut at the first checkpoint after
    first = journal.records(str(path)).__next__()
    assert first["kind"] == "checkpoint" and first["carried"] and first["offsets"] == []
    points = [journal.checkpoint_of(r) for r in journal.history(str(path))]
    committed = [o for p in points if p for o in p["offsets"]]
    assert committed == sorted(set(committed))                     # none twice, in order, across the kept files
    assert resume_point(str(path), SRC).offset == max(committed)


def test_a_journal_rotated_with_one_file_kept_still_resumes_and_a_crash_mid_rotation_reads_the_older_file(tmp_path):
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), max_bytes=1_000, keep=1)
    fill(j, 0, 30)
    j.close()
    assert journal.files(str(path)) == [str(path)] and resume_point(str(path), SRC).offset == 290
    kept = tmp_path / "k.jsonl"                   # killed after F became F.1, before the new F had its first record
    k = Journal(str(kept), max_bytes=1_000, keep=2)
    fill(k, 0, 6)
    k.close()
    kept.rename(tmp_path / "k.jsonl.1")
    kept.write_text("")
    assert resume_point(str(kept), SRC).offset == 50


def test_a_journal_that_never_passes_its_size_is_one_file(tmp_path):
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), max_bytes=1 << 20, keep=4)
    fill(j, 0, 30)
    j.close()
    assert journal.files(str(path)) == [str(path)] and len(list(journal.history(str(path)))) == 30


def answer(i: int) -> dict:
    return {"kind": "answer", "id": f"q{i}", "question": "which port did gw7 use?", "text": "port 443 " * 20}


def test_a_journal_rotates_on_answers_alone_with_the_stream_idle_and_still_resumes_at_its_last_checkpoint(tmp_path):
    """Finding 7 of issue 55: rotation waited for a checkpoint, so answers with the stream idle grew it forever."""
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), max_bytes=2_000, keep=3)
    j.append({"stream": "tep", **checkpoint(120)})
    for i in range(300):                                 # ~60 KB of answers, no checkpoint among them
        j.append(answer(i))
    j.close()
    assert len(journal.files(str(path))) == 3
    assert all(p.stat().st_size < 2_000 + 1_000 for p in tmp_path.iterdir())
    first = next(journal.records(str(path)))
    assert first["carried"] and first["offset"] == 120 and first["stream"] == "tep" and first["offsets"] == []
    assert resume_point(str(path), SRC).offset == 120
    k = Journal(str(path), max_bytes=2_000, keep=1)      # reopened: the checkpoint is carried on from the file
    for i in range(30):
        k.append(answer(i))
    k.close()
    assert resume_point(str(path), SRC).offset == 120 and path.stat().st_size < 3_000
    committed = [o for r in journal.history(str(path)) if (p := journal.checkpoint_of(r)) for o in p["offsets"]]
    assert committed == []                               # carried checkpoints commit no line a second time


def test_a_start_is_seen_only_from_a_start_record_written_since_never_from_a_rotation_alone(tmp_path):
    """A supervisor tells a death at start-up (no restart) from one after it by the journal: answers given by the
    archive alone, before the target is up, rotate it now, and the file rotated in carries an earlier run's
    checkpoint: neither is a start."""
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), max_bytes=2_000, keep=3)
    j.append({"stream": "tep", **checkpoint(120)})      # an earlier run's
    j.close()
    at = _end_of(str(path))
    j = Journal(str(path), max_bytes=2_000, keep=3)
    for i in range(100):                                 # rotated more than once, no start among them
        j.append(answer(i))
    assert len(journal.files(str(path))) == 3 and not _started(str(path), at)
    j.append({"kind": "start"})
    j.close()
    assert _started(str(path), at) and _started(str(path), None)


def test_a_journals_files_are_its_users_alone(tmp_path):
    """Finding 12 of issue 55: the journal (operators' questions and answers) was created 0644."""
    path = tmp_path / "j.jsonl"
    j = Journal(str(path), max_bytes=500, keep=3)
    fill(j, 0, 10)
    j.close()
    assert len(journal.files(str(path))) == 3
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {"0o600"}
    older = tmp_path / "k.jsonl"
    older.write_text("")
    older.chmod(0o644)
    Journal(str(older)).close()
    assert older.stat().st_mode & 0o777 == 0o600


def test_a_file_planted_at_a_kept_name_is_never_read_moved_or_followed_and_rotation_goes_on(tmp_path):
    """Finding 12 of issue 55: in a shared directory another user's F.1 made every rotation raise, and `history`
    read a planted F.7. Here F.1 is another user's file, F.2 a symlink to a file of ours outside the journal."""
    path = tmp_path / "j.jsonl"
    other = tmp_path / "j.jsonl.1"
    other.write_text(json.dumps({"kind": "answer", "text": "planted"}) + "\n")
    os.chown(other, 4321, 4321)
    secret = tmp_path / "secret.txt"
    secret.write_text(json.dumps({"kind": "answer", "text": "secret"}) + "\n")
    (tmp_path / "j.jsonl.2").symlink_to(secret)
    j = Journal(str(path), max_bytes=1_000, keep=4)
    fill(j, 0, 40)                                       # rotates many times past the planted names
    j.close()
    texts = [r.get("text") for r in journal.history(str(path))]
    assert "planted" not in texts and "secret" not in texts
    assert other.read_text().count("planted") == 1 and other.stat().st_uid == 4321
    assert (tmp_path / "j.jsonl.2").is_symlink() and secret.read_text().count("secret") == 1
    assert resume_point(str(path), SRC).offset == max(i * 10 for i in range(40) if i % 3 == 2)
    assert journal.refused[str(other)] and journal.refused[str(tmp_path / "j.jsonl.2")]


def test_a_journal_named_at_another_users_file_or_a_symlink_is_refused_by_name(tmp_path):
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text("")
    os.chown(theirs, 4321, 4321)
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere")
    for each in (theirs, link):
        with pytest.raises(ValueError, match="not a journal this user wrote"):
            Journal(str(each))
    assert not (tmp_path / "elsewhere").exists()

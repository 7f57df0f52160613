"""The span reader's lookup (pipeline/answer/pick.py): which line and which of its spans answer, by the ranker alone;
and the same through the cited reader with serve.reader "spans" (an archive on disk, no model)."""
from __future__ import annotations

import numpy as np

from pipeline import config
from pipeline.answer import pick as picking
from pipeline.answer.pick import MAX_RANKED, pick, rank_line, ranker
from pipeline.answer.rank import question
from pipeline.messages import Answer as AnswerEvent
from pipeline.serve.cited import read
from pipeline.serve.front import Front
from pipeline.stream.evidence import ArchivedLine
from tests.pipeline.serve.test_cited import archive_of, supported
from tests.pipeline.serve.test_operators import WordTokenizer


def line(seq: int, text: str) -> ArchivedLine:
    return ArchivedLine(seq, 0, "", text, (), 0)


def test_a_span_the_question_writes_is_never_offered_unless_the_question_offers_its_answers():
    ln = line(1, "10:00:01 gw7 login user=operator3 from 10.1.2.3 result=ok")
    offered = {s.text for s, _ in rank_line(question("Which user logged in from 10.1.2.3?"), ln, ranker()).spans}
    assert "10.1.2.3" not in offered and "operator3" in offered
    offered = {s.text for s, _ in rank_line(question("Was the login of operator3 ok or failed?"), ln, ranker()).spans}
    assert "ok" in offered                                 # "ok or failed?": the question's words are its answers


def test_a_repeated_template_answers_from_its_newest_line_and_cites_the_others_saying_otherwise():
    lines = [line(n, f"10:00:0{n} job_7 listening on port {1000 * n}") for n in (3, 2, 1)]    # newest first
    got = pick(question("Which port is job_7 listening on?"), lines)
    assert got.line.seq == 3 and got.answer.text == "3000"
    assert [(ln.seq, s.text) for ln, s in got.others] == [(2, "2000"), (1, "1000")]


def test_an_older_line_whose_spans_fit_the_question_beats_a_newer_one_that_fits_worse():
    lines = [line(2, "10:00:02 job_7 heartbeat ok"), line(1, "10:00:01 job_7 accepted user=alice from 10.0.0.9")]
    got = pick(question("Which user did job_7 accept?"), lines)
    assert got.line.seq == 1 and got.answer.text == "alice"


def test_at_most_MAX_RANKED_lines_are_ranked_however_many_are_found():
    lines = [line(n, f"10:00:00 job_7 listening on port {n}") for n in range(3 * MAX_RANKED, 0, -1)]
    assert pick(question("Which port is job_7 listening on?"), lines).lines_ranked == MAX_RANKED


def test_a_line_with_no_span_but_what_the_question_writes_gives_no_pick():
    assert pick(question("Was job_7 ok?"), [line(1, "job_7 ok")]) is None


def test_the_cited_reader_with_spans_answers_a_lookup_with_a_span_of_the_line_it_cites(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 conn job_7 from 10.0.0.1 port 1111",
                                              "10:00:02 conn job_8 from 10.0.0.1 port 2222",
                                              "10:00:03 conn job_7 from 10.0.0.2 port 3333"])
    reply = read(path, "what port did job_7 use from 10.0.0.1?", spans=True)
    assert reply.answer == "1111" and [c.seq for c in reply.citations] == [1] and supported(reply)
    reply = read(path, "which port did job_9 use?", spans=True)
    assert reply.answer is None and reply.citations == () and reply.text.startswith("not found")


def test_the_cited_reader_with_spans_reads_a_row_by_the_header_in_force(tmp_path):
    path = archive_of(tmp_path / "z.sqlite", ["#separator \\x09", "#fields\tts\tuid\tid.orig_h\tid.resp_p\tquery",
                                              "1331901000.0\tCHhAvV\t192.168.202.76\t53\texample.org",
                                              "1331901001.0\tC9q1lb\t192.168.202.79\t53\tfoo.example"])
    reply = read(path, "Which query did connection C9q1lb send?", spans=True)
    assert reply.answer == "foo.example" and [c.seq for c in reply.citations] == [4] and supported(reply)


def test_ranking_is_bounded_by_MAX_RANKED_through_the_reader_too(tmp_path, monkeypatch):
    ranked = []
    real = picking.rank_line
    monkeypatch.setattr(picking, "rank_line", lambda q, ln, m: ranked.append(ln.seq) or real(q, ln, m))
    path = archive_of(tmp_path / "a.sqlite", [f"10:00:00 job_7 listening on port {n}" for n in range(100)])
    assert read(path, "which port is job_7 listening on?", spans=True).answer == "99"
    assert len(ranked) == MAX_RANKED and ranked[0] == 100


class _Tok(WordTokenizer):
    def encode(self, text: str, add_bos=None) -> np.ndarray:
        return np.ones(len(text.split()), np.int32)


class _Asks:
    def __init__(self):
        self.sent = []

    def send(self, header, arrays, timeout=None) -> int:
        self.sent.append((header, arrays))
        return len(self.sent)


def _scoring_front(path):
    front = Front(config.parse({"serve": {"reader": "spans", "span_model": 3}}), _Tok(), [("", _Asks(), path)])
    front.framing.span = lambda tok, system, messages, retrieved=(): np.ones(4, np.int32)
    return front


def _done(front, answer, scores) -> dict:
    front.on_event(AnswerEvent(id=answer.id, prompt_tokens=answer.prompt_tokens, finish="stop",
                               scores=np.asarray(scores, np.float64)))
    while (item := answer.items.get(timeout=5))[0] != "done":      # the reply's text as deltas, then its end
        pass
    return item[1]


def test_with_span_model_the_lines_first_candidates_go_to_the_owner_as_one_scoring_question(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 job_7 moved 10 kB and 20 kB to node-3"])
    front = _scoring_front(path)
    answer = front.ask("ann", messages=[{"role": "user", "content": "how many kB did job_7 move?"}])
    header, arrays = front.views[""].asks.sent[-1]
    choice = answer.choice
    assert header["kind"] == "question" and len(arrays["span_ends"]) == len(choice.options) == 3
    assert len(choice.prior) == 3 and list(choice.prior) == sorted(choice.prior, reverse=True)
    info = _done(front, answer, [0.0, 0.0, 100.0])          # the model's sum of log p, added to the ranker's score
    assert answer.answer == choice.options[2] and info["error"] is None
    assert answer.citations[0]["seq"] == 1 and answer.answer in answer.citations[0]["text"]


def test_a_scoring_choice_too_close_to_call_is_not_decided_and_cites_its_line(tmp_path):
    path = archive_of(tmp_path / "a.sqlite", ["10:00:01 job_7 moved 10 kB and 20 kB to node-3"])
    front = _scoring_front(path)
    answer = front.ask("ann", messages=[{"role": "user", "content": "how many kB did job_7 move?"}])
    _done(front, answer, [-p for p in answer.choice.prior])          # every total 0: a tie
    assert answer.answer is None and answer.text.startswith("not decided between")
    assert [c["seq"] for c in answer.citations] == [1]


def test_ranking_stops_when_the_questions_budget_is_spent_after_the_first_line(tmp_path, monkeypatch):
    """A long line's candidates take ~0.1 s to rank: past serve.question_budget_s no further line is ranked, and the
    reply says it was cut (planted: pick without keep_going ranks all 16 on a clock that has run out)."""
    from pipeline.serve import cited
    from pipeline.stream import evidence
    ranked = []
    real = picking.rank_line
    monkeypatch.setattr(picking, "rank_line", lambda q, ln, m: ranked.append(ln.seq) or real(q, ln, m))
    path = archive_of(tmp_path / "a.sqlite", [f"10:00:00 job_7 listening on port {n}" for n in range(40)])
    now = [0.0]
    budget = evidence.Budget(1.0, 1000, clock=lambda: now[0])
    real_said = picking.said

    def said_then_late(q, text):
        now[0] = 5.0                                  # the archive's reads took the question's whole time
        return real_said(q, text)
    monkeypatch.setattr(picking, "said", said_then_late)
    reply = cited.read(path, "which port is job_7 listening on?", budget=budget, spans=True)
    assert ranked == [40] and reply.answer == "39" and "spent" in reply.text and supported(reply)

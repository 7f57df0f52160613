"""A budget for each cited question (issue 55, finding 1): the archive's lines a question reads are capped, a query
past the budget is aborted where it runs, an answer cut short says its bound, and a question holds its admission slot
from before the archive is read until its (direct) answer ends. Over real archives; work counted in lines and SQLite
steps, never timed."""
from __future__ import annotations

import threading

import pytest

from pipeline.serve import cited, front as front_module
from pipeline.serve.cited import Reply, read
from pipeline.serve.front import RequestError
from pipeline.stream import evidence
from pipeline.stream.archive import search
from pipeline.stream.evidence import MIN_WEIGHED, STEPS, Budget
from tests.pipeline.serve.test_cited import SSH, archive_of, front_on

CONNECTING = [f"2026-12-06 10:{i // 60 % 60:02d}:{i % 60:02d} INFO worker-{i % 7} connecting to 10.0.0.{i % 5}:"
              f"{1024 + i % 3}" for i in range(300)]


@pytest.fixture
def wide(tmp_path):
    """300 lines, every one of which says connecting (and names a port)."""
    return archive_of(tmp_path / "wide.sqlite", CONNECTING)


@pytest.fixture(scope="module")
def small_and_large(tmp_path_factory):
    """The 300 lines, and 20 copies of them (6,000 lines)."""
    d = tmp_path_factory.mktemp("sizes")
    return archive_of(d / "small.sqlite", CONNECTING), archive_of(d / "large.sqlite", CONNECTING * 20)


@pytest.fixture
def built(monkeypatch):
    """How many lines the archive's readers build, over every call of `evidence.lines` (a question's scope, the
    archive's oldest line, is one more than its candidates)."""
    count = [0]
    inner = evidence.lines

    def counted(con, seqs, *rest, **kw):
        count[0] += len(seqs)
        return inner(con, seqs, *rest, **kw)
    monkeypatch.setattr(evidence, "lines", counted)
    return count


def test_a_count_over_more_lines_than_the_cap_reads_the_cap_and_answers_at_least_with_its_bound(wide, built):
    budget = Budget(3600.0, 50)
    reply = read(wide, "how many lines say connecting?", budget=budget)
    assert built[0] <= 50 + 1 and budget.examined == 50 and budget.cut == "lines"
    assert reply.answer == "at least 50"                   # a lower bound, never the whole count claimed
    assert "only 50 candidate lines weighed (lines #251 to #300)" in reply.text and "narrow it by" in reply.text
    assert reply.citations and all(c.text in CONNECTING for c in reply.citations)


def test_a_count_within_the_cap_is_exact_and_says_no_bound(wide, built):
    reply = read(wide, "how many lines say connecting?", budget=Budget(3600.0, 1000))
    assert reply.answer == "300" and "weighed" not in reply.text and built[0] == 300 + 1


@pytest.mark.parametrize("question", ["which port is used most often?", "which ports did worker-3 connect to?",
                                      "when was the first connection?", "when did worker-3 last connect?",
                                      "which port did 10.0.0.4 connect to?"])
def test_every_aggregate_and_lookup_reads_at_most_the_cap(wide, built, question):
    budget = Budget(3600.0, 40)
    reply = read(wide, question, budget=budget)
    assert built[0] <= 40 + 1 and budget.examined <= 40
    assert isinstance(reply, (Reply, cited.Choice))
    if isinstance(reply, Reply):
        assert reply.answer is None or all(any(part in c.text for c in reply.citations)
                                           for part in reply.answer.split(", "))     # a distinct list: each


@pytest.mark.parametrize("question", ["how many lines say connecting?", "how many times did 10.0.0.4 connect?",
                                      "which port is used most often?"])
def test_a_capped_questions_work_in_sqlite_steps_does_not_grow_with_the_archive(small_and_large, question):
    steps = []
    for path in small_and_large:
        budget = Budget(3600.0, 50)
        read(path, question, budget=budget)
        steps.append(budget.steps)
    assert steps[1] <= steps[0] + STEPS                      # one look at the clock apart at most


def test_the_first_reads_the_oldest_candidates_and_finds_the_first_line(wide, built):
    reply = read(wide, "when was the first connection?", budget=Budget(3600.0, 40))
    assert built[0] <= 40 + 1 and reply.citations[0].seq == 1


def test_a_query_past_its_steps_is_aborted_by_sqlite_and_the_answer_is_too_broad_with_no_citation(tmp_path):
    path = archive_of(tmp_path / "big.sqlite", CONNECTING * 10)
    budget = Budget(3600.0, 100_000, max_steps=STEPS)      # one look at the budget: then it is spent
    reply = read(path, "how many times did 10.0.0.4 connect?", budget=budget)
    assert budget.cut == "time" and budget.steps <= 2 * STEPS
    assert reply.answer is None and reply.citations == () and "too broad" in reply.text


def test_a_query_aborted_by_the_budget_is_a_reply_at_every_step_never_an_exception(tmp_path):
    path = archive_of(tmp_path / "big.sqlite", CONNECTING * 4)
    for steps in range(1, 40, 3):
        budget = Budget(3600.0, 100_000, max_steps=steps * STEPS)
        for question in ("how many lines say connecting?", "which port is used most often?",
                         "when did worker-3 last connect?", "how many times did 10.0.0.4 connect?"):
            reply = read(path, question, budget=budget)          # None: no line found by words, the free reader's
            assert reply is None or isinstance(reply, (Reply, cited.Choice)), (steps, question)
            budget = Budget(3600.0, 100_000, max_steps=steps * STEPS)


def test_a_spent_clock_aborts_a_query_and_stops_the_readers_loops(wide):
    now = [0.0]
    budget = Budget(1.0, 100_000, clock=lambda: now[0])
    con = cited.open_reader(wide)
    try:
        budget.watch(con)
        now[0] = 2.0                                           # the clock passes the deadline
        with pytest.raises(Exception, match="interrupted"):
            con.execute("SELECT count(*) FROM lines a, lines b").fetchone()
        assert evidence.holding(con, roots=["connect"], budget=budget) == [] and budget.cut == "time"
    finally:
        con.close()
    assert list(budget.each(range(MIN_WEIGHED + 5))) == list(range(MIN_WEIGHED))     # then a loop's least, no more


def test_the_nearest_lines_are_searched_within_the_questions_budget(wide, monkeypatch):
    assert search(wide, "connecting worker", k=3)                         # found with no budget...
    spent = Budget(3600.0, 1000, max_steps=1)
    assert search(wide, "connecting worker", k=3, watch=spent.watch) == [] and spent.cut == "time"   # ... not past it
    calls = []
    real = cited.search
    monkeypatch.setattr(cited, "search", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    budget = Budget(3600.0, 1000)
    reply = read(wide, "how many times did 10.9.9.9 connect?", budget=budget)
    assert reply.answer is None and reply.nearest and calls == [{"k": 3, "watch": budget.watch}]


# -- admission --------------------------------------------------------------------------------------------------------
def _blocked_read(monkeypatch):
    """A cited read that waits, inside, until released: (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    real = cited.read

    def slow(*args, **kw):
        entered.set()
        assert release.wait(30)
        return real(*args, **kw)
    monkeypatch.setattr(front_module.cited, "read", slow)
    return entered, release


def _asking(front, client, question):
    out = {}

    def run():
        try:
            out["answer"] = front.ask(client, messages=[{"role": "user", "content": question}])
        except RequestError as e:
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("serve, second, status", [({"max_waiting": 1}, "b", 503),
                                                   ({"max_waiting": 4, "max_waiting_per_operator": 1}, "a", 429)])
def test_a_question_holds_its_slot_while_the_archive_is_read(tmp_path, monkeypatch, serve, second, status):
    front = front_on(archive_of(tmp_path / "ssh.sqlite", SSH), **serve)
    entered, release = _blocked_read(monkeypatch)
    t, out = _asking(front, "a", "How many times did root fail?")
    assert entered.wait(30)
    try:
        assert front.gauges()["in_flight"] == 1
        with pytest.raises(RequestError) as refused:
            front.ask(second, messages=[{"role": "user", "content": "How many times did root fail?"}])
        assert refused.value.status == status
    finally:
        release.set()
        t.join(30)
    assert out["answer"].finished and out["answer"].answer == "2"     # the direct answer, finished
    assert front.reading == {} and front.gauges()["in_flight"] == 0
    again = front.ask(second, messages=[{"role": "user", "content": "How many times did root fail?"}])
    assert again.answer == "2"                                         # its slot freed when it ended


def test_a_refused_question_frees_the_slot_it_took(tmp_path):
    front = front_on(archive_of(tmp_path / "ssh.sqlite", SSH), max_waiting=1, max_prompt_tokens=16)
    with pytest.raises(RequestError):
        front.ask("a", messages=[{"role": "user", "content": " ".join(["word"] * 40)}])
    assert front.reading == {}
    assert front.ask("a", messages=[{"role": "user", "content": "How many times did root fail?"}]).answer == "2"


def test_the_free_readers_retrieval_is_searched_within_the_questions_budget(wide):
    front = front_on(wide, reader="free", retrieve=2)
    assert front.framing.retrieve("connecting worker", front.view(), Budget(3600.0, 1000))    # found within a budget...
    assert front.framing.retrieve("connecting worker", front.view(), Budget(3600.0, 1000, max_steps=1)) == []  # none past it


def test_a_questions_one_budget_covers_the_cited_read_and_the_retrieval_after_it(wide, monkeypatch):
    front = front_on(wide, reader="cited", retrieve=2)
    seen = []
    monkeypatch.setattr(front_module.cited, "read", lambda path, q, budget, **_: seen.append(budget))     # not its to answer
    monkeypatch.setattr(front.framing, "retrieve", lambda q, view, budget: seen.append(budget) or [])
    front.ask("a", messages=[{"role": "user", "content": "what is the worker doing?"}])
    assert len(seen) == 2 and seen[0] is seen[1]

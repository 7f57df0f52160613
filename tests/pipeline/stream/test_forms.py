"""Assessment forms on the real model (pipeline/stream/forms.py): the constrained forms write exactly what the
constrained target alone writes, whatever the draft, and cannot name a tag out of view.

The rule's own properties (any logits, any vocabulary) are in tests/pipeline/decode/test_rules.py; the engine's
exactness under a rule, on tiny models with every proposer, in test_engine_sampling.py; the actor pipeline's
assessments (structured, the default) against the serial engine's in tests/pipeline/test_launch.py.
"""
from __future__ import annotations

import pytest

from pipeline import config
from pipeline.stream.forms import SEVERITIES, Writer
from pipeline.stream.identifiers import invented, mentioned
from pipeline.stream.records import read_log
from pipeline.stream.replay import make_session, replay
from tests.paths import ROOT

LOG = ROOT / "data" / "tep_demo.csv"
LINES = 30


def assessments(form: str, draft: str) -> list[dict]:
    cfg = config.load(None, {"replay.form": form, "draft.kind": draft})
    out = []
    replay(str(LOG), None, cfg, lambda kind, p: out.append(p) if kind == "assessment" else None, max_lines=LINES)
    return out


@pytest.mark.parametrize("form", ["constrained", "structured"])
def test_a_constrained_form_with_a_draft_writes_what_the_target_alone_writes(default_gguf, form):
    """Greedy identity under the rule, on the real model over the bundled log: the default draft (proposals judged
    against the masked target) against no draft at all."""
    with_draft, alone = assessments(form, "suffix"), assessments(form, "none")
    assert [a["text"] for a in with_draft] == [a["text"] for a in alone] and len(alone) == LINES // 10
    assert sum(a["stats"]["accepted"] for a in with_draft) > 0
    for a in alone:
        assert invented(a["text"], a["window_tags"]) == [], a["text"]
        if form == "structured":
            assert a["fields"]["severity"] in SEVERITIES and set(a["fields"]["alarms"]) <= set(a["window_tags"])


@pytest.fixture(scope="module")
def session(default_gguf):
    """The serial session after the log's first 20 lines (tags AIR00x_y, FIR123 in view)."""
    cfg = config.load()
    session = make_session(cfg)
    for rec in read_log(str(LOG), "csv")[:20]:
        session.engine.append(rec.text + "\n")
    return session, cfg, rec.text


@pytest.mark.parametrize("form", ["constrained", "structured"])
def test_with_no_tag_in_view_a_constrained_form_names_none(session, form):
    """Not vacuous: asked the same question, the free form names tags; told that none is in view, the constrained
    forms name none, in any spelling the reader knows."""
    session, cfg, latest = session
    f, r, mark = session.frame, cfg.replay, session.engine.mark()
    texts = {}
    for kind in ("free", form):
        writer = Writer(f.tok, kind, r.max_new_tokens, r.system_prompt, r.question, r.form_question)
        texts[kind] = f.tok.decode(writer.write(session.engine, writer.ask(latest), [], f.params).ids)
        session.engine.rollback(mark)
    assert mentioned(texts["free"]), "the free form should name tags here"
    assert mentioned(texts[form]) == [], texts[form]

"""Assessment forms (pipeline/stream/forms.py). On the real model: the constrained forms write exactly what the
constrained target alone writes, whatever the draft, and cannot name a tag out of view. Fast: the structured form's
severity and tags are computed from the assessed lines (pipeline/stream/severity.py), the model writes neither, no
field repeats another, and a real stream run on the tiny model states a high-high line's severity.

The rule's own properties (any logits, any vocabulary) are in tests/pipeline/decode/test_rules.py; the engine's
exactness under a rule, on tiny models with every proposer, in test_engine_sampling.py; the actor pipeline's
assessments (structured, the default) against the serial engine's in tests/pipeline/test_launch.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline import config
from pipeline.config import SamplingSection
from pipeline.decode.step import Stats
from pipeline.stream.forms import SEVERITIES, Stated, Writer, fields_of, repeats, stated_by, text_of
from pipeline.stream.identifiers import carried, invented, mentioned
from pipeline.stream.prompts import Prompt
from pipeline.stream.records import read_log
from pipeline.stream.replay import make_session, replay
from pipeline.stream.severity import severity_of
from tests.paths import ROOT

LOG = ROOT / "data" / "tep_demo.csv"
LINES = 30


def assessments(form: str, draft: str) -> list[dict]:
    cfg = config.load(None, {"replay.form": form, "draft.kind": draft})
    out = []
    replay(str(LOG), None, cfg, lambda kind, p: out.append(p) if kind == "assessment" else None, max_lines=LINES)
    return out


def no_field_repeats_another(fields: dict) -> bool:
    texts = [", ".join(v) if isinstance(v, list) else v for v in fields.values() if v]
    return not any(repeats(t, texts[:i]) for i, t in enumerate(texts))


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
            assert no_field_repeats_another(a["fields"]), a["fields"]


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
        writer = Writer.of(f.tok, r, form=kind)
        texts[kind] = f.tok.decode(writer.write(session.engine, writer.ask(latest), [], f.params).ids)
        session.engine.rollback(mark)
    assert mentioned(texts["free"]), "the free form should name tags here"
    assert mentioned(texts[form]) == [], texts[form]


# ---- fast tier: what the structured form computes, on the tiny test model's tokenizer and a scripted engine, and one
# real stream run on the tiny model

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from models.tokenizer import Tokenizer
    from tests.tiny_gguf import write_tiny_gguf
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_gguf(path, seed=3)
    return path, Tokenizer.from_gguf(path)


class Scripted:
    """An engine that writes the given texts, one per field it is asked for (each ending at a newline), and keeps
    the prompts it was given."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.prompts = tok, list(texts), []
        self.index = SimpleNamespace(n=0)

    def generate(self, prompt_ids, max_tokens, params, stop_ids=(), keep_going=None, rule=None, rule_state=""):
        self.prompts.append(self.tok.decode([int(t) for t in prompt_ids]))
        ids = [int(t) for t in self.tok.encode(self.texts.pop(0) + "\n")][:max_tokens]
        return SimpleNamespace(token_ids=ids, stats=Stats(generated=len(ids)))

    def rollback(self, position):
        pass


def written(tok, texts, stated=Stated(), entry="alarm"):
    writer = Writer(tok, "structured", 60, Prompt("SYS"), "Q", "FORM", entry)
    engine = Scripted(tok, texts)
    out = writer.write(engine, writer.ask("07:33:00 PIR108 HH PRES REACT HIGH HIGH ALM"), ["PIR108", "FIR123"],
                       SamplingSection().params(), stated=stated)
    return fields_of(tok, out.fields), text_of(tok, out.ids), engine


@pytest.mark.parametrize("lines, severity", [
    (["07:33:00 PIR108 HH PRES REACT HIGH HIGH ALM"], "high"),
    (["07:33:00 FIR115 LL FLW PURGE LOW LOW ALM"], "high"),
    (["01:32:20 AIR003_3 H PURGE C CONC HIGH ALM", "02:04:10 AIR001_1 L REACT FEED A CONC LOW ALM"], "medium"),
    (["03:35:30 FIR123 H NR FLW COND CW HIGH ALM RECOVERED", "07:40:00 PIR108 HH NR PRES RECOVERED"], "low"),
    (["07:33:00 PIR108 HH PRES REACT HIGH HIGH ALM", "07:40:00 PIR108 HH NR PRES REACT RECOVERED"], "high"),
    (["- 1117838570 2005.06.03 R02-M1-N0 RAS KERNEL FATAL data TLB error interrupt"], "critical"),
    (["2015-10-18 18:01:47,978 ERROR [RMCommunicator Allocator] org.apache.hadoop: ERROR IN CONTACTING RM."], "high"),
    (["2015-07-29 19:04:29,071 - WARN  [SendWorker:188978561024] - Send worker leaving thread",
      "2015-07-29 19:04:12,394 - INFO  [/10.10.34.11:3888] - Received connection request"], "medium"),
    (["2015-10-18 18:01:48,963 INFO [main] MRAppMaster: Executing with tokens:"], "low"),
    (["Jun 14 15:16:01 combo sshd(pam_unix)[19939]: authentication failure; logname= uid=0 euid=0"], ""),
])
def test_the_severity_is_the_highest_the_assessed_lines_state_and_none_when_they_state_none(lines, severity):
    assert stated_by([(carried(text), severity_of(text)) for text in lines]).severity == severity


def test_the_alarm_tags_are_those_of_the_latest_lines_newest_first():
    lines = [(("AIR001_1",), "medium"), (("FIR123",), "low"), (("AIR001_1",), "medium"), (("PIR108",), "high")]
    assert stated_by(lines).tags == ("PIR108", "AIR001_1", "FIR123")
    assert stated_by(lines + [(("V160",), "medium")]).tags == ("V160", "PIR108", "AIR001_1")
    assert stated_by([]) == Stated()


def test_a_structured_assessment_states_the_computed_severity_and_tags_and_the_model_writes_neither(tiny):
    _, tok = tiny
    fields, text, engine = written(tok, [" 07:33:00 PIR108 HH PRES", " pressure may keep rising."],
                                   Stated(("PIR108", "FIR123"), "high"))
    assert fields == {"changed": "The latest alarm is 07:33:00 PIR108 HH PRES", "alarms": ["PIR108", "FIR123"],
                      "severity": "high", "next": "The pressure may keep rising."}
    assert text.splitlines() == ["Changed: The latest alarm is 07:33:00 PIR108 HH PRES",
                                 "Latest alarm tags: PIR108, FIR123", "Severity: high",
                                 "What may follow: The pressure may keep rising."]
    assert len(engine.prompts) == 2 and "Severity: high\nWhat may follow: The" in engine.prompts[1]
    fields, text, _ = written(tok, [" a message", " cause may be found."], Stated(), entry="message")
    assert "severity" not in fields and fields["alarms"] == [] and text.splitlines() == [
        "Changed: The latest message is a message", "Latest message tags: none",
        "What may follow: The cause may be found."]


@pytest.mark.parametrize("repeated", [" latest alarm is 07:33:00 PIR108 HH PRES", " latest alarm is 07:33:00 PIR108",
                                      " Latest alarm is 07:33:00 PIR108 HH PRES.", ""])
def test_no_field_of_a_structured_assessment_repeats_another(tiny, repeated):
    """The model's last field restating "Changed" (word for word, cut short, in other case, or nothing at all) is
    left out of the fields and the text; one that adds something stays."""
    _, tok = tiny
    fields, text, _ = written(tok, [" 07:33:00 PIR108 HH PRES", repeated], Stated(("PIR108",), "high"))
    assert "next" not in fields and "What may follow" not in text and no_field_repeats_another(fields)
    fields, _, _ = written(tok, [" 07:33:00 PIR108 HH PRES", " reactor pressure may trip the plant."])
    assert fields["next"] == "The reactor pressure may trip the plant." and no_field_repeats_another(fields)


def test_a_high_high_lines_assessment_states_severity_high_in_a_real_stream_run(tiny, tmp_path):
    """Through the serial replay on the tiny model: the assessment after a HH line (the trigger) states high, the
    latest lines' tags newest first, in its fields, its text and its journal record alike; one after recoveries
    only states low."""
    gguf, _ = tiny
    log = tmp_path / "alarms.csv"
    log.write_text(",timestamp,tag,type,description\n"
                   "0,2024-05-01 01:32:20.000000000,AIR003_3,H,PURGE C CONC HIGH ALM\n"
                   "1,2024-05-01 01:33:20.000000000,FIR123,H NR,FLW COND CW HIGH ALM RECOVERED\n"
                   "2,2024-05-01 07:33:00.000000000,PIR108,HH,PRES REACT HIGH HIGH ALM\n"
                   "3,2024-05-01 07:40:00.000000000,PIR108,HH NR,PRES REACT HIGH HIGH ALM RECOVERED\n"
                   "4,2024-05-01 07:41:00.000000000,AIR003_3,H NR,PURGE C CONC HIGH ALM RECOVERED\n")
    cfg = config.load(None, {"model.gguf": str(gguf), "model.max_rows": 16, "cache.window": 512,
                             "replay.trigger_pattern": r"HIGH HIGH ALM$|AIR003_3 H NR", "replay.every_lines": 100})
    out = []
    replay(str(log), "csv", cfg, lambda kind, record: out.append(record) if kind == "assessment" else None)
    high, low = out
    assert high["trigger"] == "pattern" and high["fields"]["severity"] == "high", high["fields"]
    assert high["fields"]["alarms"] == ["PIR108", "FIR123", "AIR003_3"] and "\nSeverity: high\n" in high["text"]
    assert low["fields"]["severity"] == "low" and low["fields"]["alarms"] == ["AIR003_3", "PIR108"]

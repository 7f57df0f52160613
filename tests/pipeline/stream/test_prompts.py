"""A stream's own words (pipeline/stream/prompts.py, pipeline/stream/frame.py): each stream's sinks hold its own
system prompt and log label, its questions and an operator's are framed in them, and the ring of a target's streams
is sized for the longest head. On the tiny test model's tokenizer and the front on stand-ins (fast tier)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline import config
from pipeline.serve.front import Front
from pipeline.stream.frame import replay_frame
from pipeline.stream.prompts import Prompt, question_span, stream_head

SSH = "You read the syslog of an SSH gateway and say briefly what is happening."
HADOOP = ("You are the operations analyst of a Hadoop cluster. You read a MapReduce job's log and, when asked, say "
          "in one or two short sentences what is happening to the job and which tasks or nodes are involved.")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from models.tokenizer import Tokenizer
    from tests.tiny_gguf import write_tiny_gguf
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_gguf(path, seed=3)
    return path, Tokenizer.from_gguf(path)


def three_streams(gguf=None) -> config.Config:
    """A TEP stream on [replay]'s words, an SSH syslog and a Hadoop job log on their own."""
    return config.parse({"model": {"gguf": str(gguf)} if gguf else {}, "streams": [
        {"name": "tep", "log": "a.csv"},
        {"name": "ssh", "log": "auth.log", "system_prompt": SSH, "log_label": "Syslog:", "entry": "message",
         "form_question": "Fill in the form for the latest messages above."},
        {"name": "hadoop", "log": "job.log", "system_prompt": HADOOP, "log_label": "Job log:"}]})


def test_each_streams_sinks_hold_its_own_system_prompt_and_log_label(tiny):
    gguf, tok = tiny
    cfg = three_streams(gguf)
    heads = {name: tok.decode(replay_frame(scfg).head.tolist()) for name, scfg in config.streams_of(cfg)}
    assert heads["tep"].endswith("<|im_start|>user\nAlarm log:\n") and "chemical plant" in heads["tep"]
    assert SSH in heads["ssh"] and heads["ssh"].endswith("<|im_start|>user\nSyslog:\n")
    assert HADOOP in heads["hadoop"] and heads["hadoop"].endswith("<|im_start|>user\nJob log:\n")
    assert "chemical plant" not in heads["ssh"] + heads["hadoop"]


def test_the_ring_a_target_shares_holds_the_longest_head_and_the_largest_span_of_its_streams(tiny):
    gguf, _ = tiny
    cfg = three_streams(gguf)
    shared = replay_frame(cfg).spec
    frames = [replay_frame(scfg) for _, scfg in config.streams_of(cfg)]
    assert shared.sink == max(len(f.head) for f in frames) > len(replay_frame(config.parse({})).head)
    alone = [f.spec for f in frames]
    assert shared.ring == max(s.ring for s in alone) and shared.window == alone[0].window


def test_an_assessments_question_is_framed_in_its_streams_words(tiny):
    gguf, tok = tiny
    cfg = three_streams(gguf)
    ssh = dict(config.streams_of(cfg))["ssh"]
    writer = replay_frame(ssh).writer
    asked = tok.decode(writer.ask("Jun 14 15:16:01 combo sshd[1]: authentication failure").tolist())
    assert "The latest message: Jun 14" in asked and "alarm" not in asked
    assert np.array_equal(writer.ask(""), question_span(tok, Prompt(SSH, "Syslog:"),
                                                        [{"role": "user", "content": ssh.replay.form_question}]))


@pytest.mark.parametrize("label", ["Alarm log:", "Syslog:", "Job log:"])
def test_the_head_the_lines_and_a_question_span_make_one_chat_under_any_label(tiny, label):
    _, tok = tiny
    prompt, lines = Prompt("SYS", label), "line one\nline two\n"
    ids = np.concatenate([stream_head(tok, prompt), tok.encode(lines),
                          question_span(tok, prompt, [{"role": "user", "content": "What happened?"}])])
    whole = tok.render_chat([{"role": "system", "content": "SYS"}, {"role": "user", "content": label + "\n" + lines},
                             {"role": "user", "content": "What happened?"}], add_generation_prompt=True)
    assert ids.tolist() == list(whole)


class Asks:
    def send(self, header, arrays, timeout=None) -> int:
        return 1


class Words:
    """The front's tokenizer without a model: one token per word."""
    stop_ids = (0,)
    _bytes = (b"", b"w")
    _control_set = frozenset()

    def encode(self, text: str) -> np.ndarray:
        return np.ones(len(text.split()), np.int32)


def test_an_operators_question_is_framed_in_the_words_of_the_stream_it_names():
    cfg = three_streams()
    front = Front(cfg, Words(), [(name, Asks(), None) for name, _ in config.streams_of(cfg)])
    framed = []
    front.framing.span = lambda tok, prompt, messages, retrieved=(): framed.append(prompt) or np.ones(4, np.int32)
    front.framing.retrieve = lambda question, view, budget: []
    for name in ("ssh", "hadoop", "tep"):
        front.ask("ann", messages=[{"role": "user", "content": "what failed?"}], stream=name)
    assert framed == [Prompt(SSH, "Syslog:"), Prompt(HADOOP, "Job log:"), Prompt.of(config.ReplaySection())]

"""Profiles are validated once, with messages that name the file, the key and what was expected."""
from __future__ import annotations

import pytest

from pipeline import config
from pipeline.config import ConfigError


def test_default_profile_loads_and_sizes_the_ring_for_the_largest_block():
    cfg = config.load()
    assert cfg.draft.kind in ("none", "suffix", "model", "hybrid")
    assert config.ring_spec(cfg).ring >= cfg.cache.window + cfg.model.max_rows


@pytest.mark.parametrize("text, words", [
    ("[cache]\nwindow = 0\n", ["cache.window", ">= 1"]),
    ("[cache]\nwindw = 10\n", ["unknown key cache.windw", "window"]),
    ("[cahce]\n", ["unknown section [cahce]"]),
    ("[model]\nthreads = \"two\"\n", ["model.threads must be int", "'two'"]),
    ("[draft]\nkind = \"eagle\"\n", ["draft.kind", "'eagle'", "suffix"]),
    ("[draft]\nkind = \"model\"\nmodel = \"\"\n", ["needs model ="]),
    ("[sampling]\ntop_p = 1.5\n", ["top_p must be in (0, 1]"]),
    ("[draft]\nmin_confidence = 1.0\n", ["draft.min_confidence", "[0, 1)"]),
    ("[model]\nthreads = true\n", ["model.threads must be int"]),
    ("[cache\nwindow = 3\n", ["not valid TOML"]),
    ("[replay]\ntrigger_pattern = \"(HH\"\n", ["replay.trigger_pattern", "not a valid regular expression"]),
    ("[actors]\nlauncher = \"k8s\"\n", ["actors.launcher", "'k8s'", "ray"]),
    ("[replay]\nidle_s = -1\n", ["replay.idle_s", ">= 0"]),
    ("[model]\npass_streams = 0\n", ["model.pass_streams", ">= 1"]),
    ("[model]\npass_streams = 33\n", ["model.pass_streams", "<= 32"]),
    ("[draft]\nbackend = \"cuda\"\n", ["draft.backend", "'cuda'", "rknn"]),
    ("[model]\nkv_dtype = \"bfloat16\"\n", ["model.kv_dtype", "'bfloat16'", "float16"]),
    ("[draft]\nkind = \"suffix\"\nbackend = \"rknn\"\n", ["draft.backend", "needs kind"]),
    ("[draft]\nkind = \"model\"\nbackend = \"rknn\"\n", ["needs a board with an NPU", "[board] npu"]),
    ("[board]\nnpu = \"hailo\"\n", ["board.npu", "'hailo'"]),
    ("[board]\ncpus = \"0-3\"\nbig_cpus = \"2-5\"\n", ["board.big_cpus", "outside board.cpus"]),
    ("[board]\ncpus = \"0-1\"\n[actors]\ningest_cpus = \"2\"\n", ["actors.ingest_cpus", "board", "[2]"]),
    ("[board]\nbig_cpus = \"1\"\n[actors]\ntarget_cpus = \"0-1\"\n", ["target_cpus", "[0]", "big cores"]),
    ("[[streams]]\nname = \"DCS list\"\nlog = \"a.csv\"\n", ["streams[0].name", "'DCS list'", "lower-case"]),
    ("[[streams]]\nname = \"a\"\nlog = \"a.csv\"\n[[streams]]\nname = \"a\"\nlog = \"b.csv\"\n",
     ["streams[1].name = 'a'", "already"]),
    ("[[streams]]\nname = \"plc\"\n", ["streams[0] (plc) needs log"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nwindow = 3\n", ["streams[0] (plc): unknown key window"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nevery_lines = 0\n", ["streams[0] (plc)", "every_lines"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nnode = \"Gateway 2\"\n",
     ["streams[0].node = 'Gateway 2'", "ringspec-node"]),
    ("[[streams]]\nname = \"plc\"\nlog = \"a.log\"\nnode = 2\n", ["streams[0].node = 2"]),
    # a stream's own words: its system prompt, its log label, its entry word
    ("[replay]\nlog_label = 3\n", ["replay.log_label must be str", "int 3"]),
    ("[replay]\nlog_lable = \"Syslog:\"\n", ["unknown key replay.log_lable", "log_label"]),
    ("[replay]\nlog_label = \"\"\n", ["replay.log_label = ''", "one line", "Syslog:"]),
    ("[replay]\nentry = \"a\\nb\"\n", ["replay.entry = 'a\\nb'", "one line", "message"]),
    ("[replay]\nlog_label = \" Syslog:\"\n", ["replay.log_label = ' Syslog:'", "without surrounding spaces"]),
    ("[replay]\nsystem_prompt = \"  \"\n", ["replay.system_prompt is empty", "system turn"]),
    ("[replay]\nlog_label = \"\"\n[[streams]]\nname = \"ssh\"\nlog = \"a.log\"\nlog_label = \"Syslog:\"\n",
     ["replay.log_label = ''"]),
    ("[[streams]]\nname = \"ssh\"\nlog = \"a.log\"\nsystem_prompt = 7\n",
     ["streams[0] (ssh)", "replay.system_prompt must be str", "int 7"]),
    ("[[streams]]\nname = \"ssh\"\nlog = \"a.log\"\nlog_label = \"Syslog:\\n\"\n",
     ["streams[0] (ssh).log_label = 'Syslog:\\n'", "one line"]),
    ("[[streams]]\nname = \"ssh\"\nlog = \"a.log\"\nsystem_prompt = \"\"\n",
     ["streams[0] (ssh).system_prompt is empty"]),
    ("[[streams]]\nname = \"ssh\"\nlog = \"a.log\"\nform = \"free\"\n",
     ["streams[0] (ssh): unknown key form", "system_prompt, log_label, entry, question, form_question"]),
])
def test_bad_profiles_are_refused_with_a_precise_message(tmp_path, text, words):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    for word in words:
        assert word in str(err.value)
    assert str(path) in str(err.value)


def test_a_stream_states_its_own_words_and_takes_every_other_key_from_replay(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[replay]\nevery_lines = 7\nlog_label = "Console:"\n'
                    '[[streams]]\nname = "tep"\nlog = "a.csv"\n'
                    '[[streams]]\nname = "ssh"\nlog = "auth.log"\n'
                    'system_prompt = "You read an SSH gateway\'s syslog."\n'
                    'log_label = "Syslog:"\nentry = "message"\nquestion = "What happened?"\n')
    cfg = config.load(path)
    tep, ssh = (config.replay_of(cfg, name) for name in ("tep", "ssh"))
    assert (tep.system_prompt, tep.log_label, tep.entry) == (config.ReplaySection.system_prompt, "Console:", "alarm")
    assert (ssh.system_prompt, ssh.log_label, ssh.entry, ssh.question) == (
        "You read an SSH gateway's syslog.", "Syslog:", "message", "What happened?")
    assert ssh.every_lines == tep.every_lines == 7 and ssh.form_question == config.ReplaySection.form_question
    assert config.replay_of(cfg, "") == cfg.replay


def test_the_syslog_and_hadoop_profiles_speak_of_their_logs_not_of_a_chemical_plant():
    for name, label in (("syslog", "Syslog:"), ("hadoop", "Job log:")):
        cfg = config.load(config.ROOT / "configs" / f"{name}.toml")
        r = cfg.replay
        assert r.log_label == label and r.entry == "message" and config.replay_log(cfg).endswith("_2k.log")
        words = " ".join((r.system_prompt, r.question, r.form_question)).lower()
        assert "alarm" not in words and "plant" not in words and "tag" not in words
    assert config.load().replay.log_label == "Alarm log:" and "chemical plant" in config.load().replay.system_prompt


def test_missing_profile_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(tmp_path / "absent.toml")


def test_integers_are_accepted_where_floats_are_expected(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[sampling]\ntemperature = 1\n")
    assert config.load(path).sampling.temperature == 1.0


@pytest.mark.parametrize("value, words", [("0-x", "not a CPU list"), ("4096", "does not offer")])
def test_actor_cpu_sets_are_validated(tmp_path, value, words):
    path = tmp_path / "p.toml"
    path.write_text(f'[actors]\nowner_cpus = "{value}"\n')
    with pytest.raises(ConfigError, match=words):
        config.load(path)


def test_cpu_set_syntax():
    assert config.cpu_set("0-2,5") == {0, 1, 2, 5} and config.cpu_set("") == set()


def test_a_boards_profile_names_the_way_to_run_it_on_another_machine_and_that_way_unpins_every_actor(monkeypatch):
    """configs/rk3588.toml pins to eight cores: here it is refused with the hint, RINGSPEC_UNPIN=1 runs it
    unpinned, and `plan` (here=False) reads it as the board's without either."""
    import os
    profile = config.ROOT / "configs" / "rk3588.toml"
    missing = set(range(8)) - os.sched_getaffinity(0)
    if missing:
        with pytest.raises(ConfigError, match="RINGSPEC_UNPIN=1 runs it here unpinned"):
            config.load(profile)
    board = config.load(profile, here=False)
    assert board.actors.target_cpus == "4-7" and board.board.big_cpus == "4-7" and board.draft.backend == "rknn"
    monkeypatch.setenv("RINGSPEC_UNPIN", "1")
    unpinned = config.load(profile)
    assert all(getattr(unpinned.actors, key) == "" for key in config.ACTOR_CPUS)


# ---- serve.pub: any local user can subscribe to a PUB socket, so it is off unless asked, private when on, and never
# carries an operator's question or answer

def test_serve_publishes_nothing_unless_asked():
    assert config.ServeSection().pub == "" and config.load().serve.pub == ""


def test_an_ipc_pub_binds_in_a_directory_made_0700(tmp_path):
    import stat

    from actors.output import publisher
    sock = publisher(f"ipc://{tmp_path}/pub/events")
    try:
        assert stat.S_IMODE((tmp_path / "pub").stat().st_mode) == 0o700
    finally:
        sock.close(linger=0)


@pytest.mark.parametrize("mode, uid", [(0o777, None), (0o750, None), (0o700, 65534)],
                         ids=["world_writable", "group_readable", "another_users"])
def test_an_ipc_pub_refuses_a_directory_others_can_enter_or_own(tmp_path, mode, uid):
    import os

    from actors.output import publisher
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    if uid is not None:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(shared, uid, uid)
    with pytest.raises(PermissionError, match="0700"):
        publisher(f"ipc://{shared}/events")
    assert not (shared / "events").exists()


def test_a_pub_directory_others_can_enter_is_refused_before_any_actor_starts(tmp_path):
    """Refused at the actor's bind only, it made the output actor die at every restart (a crash loop): the launcher
    asks first, names the directory, exits 2, and starts nothing."""
    import os
    import subprocess
    import sys

    from tests.paths import ROOT
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "replay", "--pub", f"ipc://{shared}/events",
                           "--max-lines", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and f"PUB directory {shared} is 0o755" in proc.stderr, proc.stderr
    assert "actor" not in proc.stderr and "Traceback" not in proc.stderr and not (shared / "events").exists()


def test_an_ipc_pub_refuses_a_symlink_to_a_private_directory(tmp_path):
    from actors.output import publisher
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(private)
    with pytest.raises(PermissionError, match="not a directory"):
        publisher(f"ipc://{tmp_path}/link/events")


def _publish_then_leave(endpoint, subscribed, n, size):
    """A forked child: bind, say "hello" until the subscriber hears one, publish `n` events of `size` bytes and an
    "eof", close as the output actor does and return (multiprocessing's child then leaves through os._exit)."""
    from actors.output import close_publisher, publisher
    sock = publisher(endpoint)
    while not subscribed.wait(0.05):
        sock.send_multipart([b"hello", b""])
    for _ in range(n):
        sock.send_multipart([b"line", bytes(size)])
    sock.send_multipart([b"eof", b""])
    close_publisher(sock)


def test_a_publishers_last_events_reach_a_subscriber_after_its_process_leaves():
    """An actor leaves through os._exit, which ends zmq's I/O thread with whatever a linger alone was keeping: the
    Eof and its figures were lost (a soak's report without the target's KV pool, CI at e8e8faa). Queued events go
    out before the process ends."""
    import multiprocessing
    import tempfile

    import zmq
    n, size = 20, 1 << 20                             # 20 MiB: far more than a socket buffer holds at the exit
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/pub/events"
        ctx = multiprocessing.get_context("fork")
        subscribed = ctx.Event()
        child = ctx.Process(target=_publish_then_leave, args=(endpoint, subscribed, n, size))
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVHWM, 0)
        child.start()
        sub.connect(endpoint)
        kinds: list[bytes] = []
        try:
            while sub.poll(30_000):
                kind, _ = sub.recv_multipart()
                subscribed.set()
                if kind != b"hello":
                    kinds.append(kind)
                if kind == b"eof":
                    break
        finally:
            sub.close(linger=0)
            child.join(30)
        assert child.exitcode == 0
        assert kinds == [b"line"] * n + [b"eof"]


class _Recorded:
    """A PUB socket that keeps what it is given."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, frames):
        self.sent.append(frames[0].decode())


def test_an_operators_answer_is_never_published_and_the_streams_events_are():
    from actors.output import _record, publish
    from pipeline.messages import Answer, Assessment, Eof, Line
    sock = _Recorded()
    answer = {"kind": Answer.kind, "id": "q1", "client": "alice", "question": "what is the root password?",
              "text": "hunter2", "error": None}
    _record(answer, None, sock)                       # the output actor's path
    publish(sock, {"stream": "plant", **answer})      # the site actor's path
    for kind in ("answer_delta", "question", "status", "something_new"):
        publish(sock, {"kind": kind})
    assert sock.sent == []
    for kind in (Line.kind, Assessment.kind, Eof.kind):
        publish(sock, {"kind": kind})
    assert sock.sent == ["line", "assessment", "eof"]

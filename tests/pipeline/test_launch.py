"""The actor pipeline, end to end on the real model and real processes, under both launchers: the same assessments as
the serial engine (with the stream proposer and with a draft model running ahead), CPU affinity, the sources (tail
rotation, a socket client that disconnects, bad bytes on stdin), and clean exits (normal end, a drain by SIGTERM to
the launcher or SIGINT to the process group, the launcher SIGKILLed): no orphan process, no leftover shared-memory
segment. An actor's death and the restart that follows are test_supervise.py's."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from bench.chaos import free_port
from models.subset import layer_subset
from pipeline import watch
from pipeline.channel import cleanup_stale
from pipeline.stream.forms import SEVERITIES
from tests import procs
from tests.journals import comparable
from tests.paths import ROOT, SHARED

LOG = ROOT / "data" / "tep_demo.csv"


# Every process this module starts (pipelines, Ray clusters and their workers) inherits this mark, so the checks
# below see only this suite's processes: a second copy of the suite may run beside it.
MARK = f"RINGSPEC_TEST_RUN={uuid.uuid4().hex}"
ENV = {**os.environ, MARK.split("=")[0]: MARK.split("=")[1]}


def leftovers(proc) -> list[str]:
    """The shared-memory segments and ipc socket files still there of the pipeline `proc` ran (their names carry
    the launching process's pid: pipeline/launch/supervise.py)."""
    prefix = f"ringspec_p{proc.pid}_"
    return ([name for name in os.listdir("/dev/shm") if name.startswith(prefix)] +
            [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(prefix) and name.endswith(".ipc")])


def processes(marker: bytes) -> list[int]:
    """Pids of this suite's processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes() and _marked(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def catches(pid: int, sig: int) -> bool:
    """The process has a handler installed for `sig` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


ACTORS = frozenset({"ingest", "cache_owner", "target", "draft", "output"})


def actor_pids(proc, launcher: str) -> dict[str, int]:
    """{actor name: pid} once all five actors run and have named themselves (local: the launcher's fork server's
    children; ray: the RayActor workers). A just-started actor is still called "python" for a moment: wait for its name."""
    names = {}

    def named() -> bool:
        if launcher == "local":
            pids = [p for p in actors_of(proc.pid) if alive(p)]
        else:
            pids = [p for p in processes(b"ray::RayActor.run") if alive(p)]
        names.clear()
        for p in pids:
            try:
                names[Path(f"/proc/{p}/comm").read_text().strip().removeprefix("rs:")] = p
            except FileNotFoundError:                   # gone between the listing and the read
                pass
        return ACTORS <= set(names)
    wait_for(named, "the five actors starting and naming themselves", proc, progress=lambda: sorted(names))
    return {name: names[name] for name in ACTORS}


_launched: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_stray_pipelines():
    """A failing test must not leave its pipeline running: stop (then kill) whatever it launched."""
    yield
    while _launched:
        proc = _launched.pop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def launch(*args, launcher: str = "local", stdin=None, text: bool = True, group: bool = False,
           env: dict | None = None, verb: str = "replay") -> subprocess.Popen:
    """`replay` (or `verb`) through `launcher`; group: in a process group of its own, as a terminal runs a command
    (a Ctrl-C there reaches every process of the group)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), verb, *args, "--launcher", launcher],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text,
                            env={**ENV, **(env or {})}, start_new_session=group, preexec_fn=watch.dies_with_parent)
    _launched.append(proc)
    return proc


def journal_of(path: Path) -> list[dict]:
    """The journal's complete records (a line still being written is left out)."""
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def serial_assessments(max_lines: int, config_path=None) -> list[str]:
    from pipeline import config
    from pipeline.stream.replay import replay

    out = []
    replay(str(LOG), None, config.load(config_path), lambda kind, p: out.append(p["text"])
                 if kind == "assessment" else None, max_lines=max_lines)
    return out


# token trees (2 siblings) and line-end blocks at once. Not adaptive length here: it chooses from measured times, so
# whether a sibling's path wins would depend on the clock (pipeline-bench's test runs all three locally)
TREES_LINES = '[draft]\nkind = "suffix"\nsiblings = 2\nend_at_line = true\n'


@pytest.mark.parametrize("launcher,lines,profile", [("local", 30, ""), ("ray", 20, TREES_LINES)],
                         ids=["local", "ray-trees-lines"])
def test_pipelined_assessments_equal_the_serial_engine(default_gguf, tmp_path, launcher, lines, profile):
    journal = tmp_path / "journal.jsonl"
    config = tmp_path / "profile.toml"
    config.write_text(profile)
    proc = launch(str(LOG), "--quiet-lines", "--max-lines", str(lines), "--journal", str(journal),
                  *(["--config", str(config)] if profile else []), launcher=launcher)
    out, err = procs.finish(proc, "the pipeline ending")
    assert proc.returncode == 0, err
    records = journal_of(journal)
    assert records[-1]["kind"] == "eof" and records[-1]["sent"] == lines
    serial = tmp_path / "serial.jsonl"                 # the reference: the serial launcher's journal of the same run
    proc_serial = launch(str(LOG), "--quiet-lines", "--max-lines", str(lines), "--journal", str(serial),
                         *(["--config", str(config)] if profile else []), launcher="serial")
    _, err_serial = procs.finish(proc_serial, "the serial replay ending")
    assert proc_serial.returncode == 0, err_serial
    assert comparable(records) == comparable(journal_of(serial))     # record for record, what was measured left out
    assert len([r for r in records if r["kind"] == "assessment"]) == lines // 10
    for r in records:                  # the default form: structured, field by field under the identifier rule
        if r["kind"] == "assessment":
            assert r["fields"]["severity"] in SEVERITIES and r["fields"]["alarms"], r["fields"]
            assert r["tags_hallucinated"] == [] and set(r["fields"]["alarms"]) <= set(r["window_tags"])
    if profile:            # the draft ran ahead (whether the stream offers siblings, and one wins, depends on the
        stats = [r["stats"] for r in records if r["kind"] == "assessment"]     # text this CPU makes: no tree here on
        assert sum(s["ahead"] for s in stats) > 0                              # an AVX-512 EPYC; a tree judged
                                                                               # through the actors, on given
                                                                               # proposals: test_pipelined_sampling)
    figures = {f["actor"]: f for f in records[-1]["figures"]}
    assert set(figures) == {"ingest", "cache_owner", "target", "draft", "output"}
    # The lines waited for the owner (ingest reads the file while the target loads and probes its rows), so it fed
    # several at once in full passes, and the assessments above are the serial engine's, which feeds one at a time.
    assert figures["cache_owner"]["packed_feeds"] > 0, figures["cache_owner"]
    assert "pipeline overhead share" in err
    assert not leftovers(proc)
    if launcher == "ray":
        assert not processes(b"ray::RayActor") and not processes(b"raylet")


STREAM_LOGS = {"tep": LOG, "bgl": SHARED / "data" / "loghub" / "BGL_2k.log",
               "zookeeper": SHARED / "data" / "loghub" / "Zookeeper_2k.log"}


# Ray's GCS marks a node dead after this many missed health checks this far apart (its defaults: 5 every 3 s): the
# dead node's streams are restarted elsewhere ~12 s sooner, nothing else changes (a check still waits its own timeout)
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def test_streams_on_two_ray_nodes_served_by_one_front_one_node_dies_its_stream_resumes_and_the_rest_are_unchanged(
        default_gguf, tmp_path):
    """A real two-node Ray cluster on this machine (`ray start` twice, nodes labelled ringspec-node=a and b) serving
    three logs as `[[streams]]`: tep and zookeeper on node a (one target carrying both streams' rows in shared
    passes), bgl on node b, and one HTTP front for all three (the site actor, on the launcher's host): a question
    names its stream and is answered by that stream's owner (its answer journaled in that stream's journal alone),
    and /metrics labels every stream's series with its node. Node b's processes are killed once bgl has committed 8
    lines: bgl is reported down, resumes on node a from its checkpoint (every line committed once), is labelled with
    node a and is asked again through the same front; tep's and zookeeper's answers are, token for token, what the
    serial engine answers over each log alone. (No analyses: when a served stream's analyses fire depends on how its
    lines arrive.)"""
    from bench.chaos import account
    from pipeline import config as cfgs
    from pipeline.launch.ray_actors import _ray_token
    ray_dir = tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp")
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    small = ["--num-cpus", "2", "--object-store-memory", str(80 << 20), "--disable-usage-stats"]
    head = procs.run([*ray, "start", "--head", "--include-dashboard=false", "--port", str(free_port()),
                      "--temp-dir", ray_dir, "--labels", "ringspec-node=a", *small], cwd=tmp_path,
                     env={**ENV, **FAST_NODE_DEATH})
    try:
        assert head.returncode == 0, head.stderr
        address = re.search(r"ray start --address='([^']+)'", head.stdout + head.stderr).group(1)
        joins = {**ENV, "RAY_AUTH_MODE": "token"} if _ray_token() else ENV      # as the launcher joins (ray_actors.py)
        node_b = procs.run([*ray, "start", "--address", address, "--labels", "ringspec-node=b", *small],
                           cwd=tmp_path, env=joins)
        assert node_b.returncode == 0, node_b.stderr
        logs = {"tep": (LOG, "a", 16), "zookeeper": (STREAM_LOGS["zookeeper"], "a", 16),
                "bgl": (STREAM_LOGS["bgl"], "b", 48)}
        profile = tmp_path / "streams.toml"
        profile.write_text(f'[serve]\napi_key = "{SITE_KEY}"\nretrieve = 0\n[replay]\nevery_lines = 1000\n' +
                           "".join(f'[[streams]]\nname = "{name}"\nlog = "{log}"\nnode = "{node}"\nmax_lines = {n}\n'
                                   for name, (log, node, n) in logs.items()))
        journal, port = tmp_path / "journal.jsonl", free_port()
        proc = launch("--config", str(profile), "--quiet-lines", "--journal", str(journal), "--ray-address", address,
                      "--http", f"127.0.0.1:{port}", "--zmq", "", "--pub", "", "--archive",
                      str(tmp_path / "archive.sqlite"), launcher="ray", verb="serve")
        bgl = tmp_path / "journal.bgl.jsonl"
        wait_for(lambda: bgl.exists() and max([r.get("lines", 0) for r in journal_of(bgl)
                                               if r["kind"] == "checkpoint"], default=0) >= 8,
                 "bgl's first 8 lines committed", proc)
        raylet = {node: next(p for p in processes(b"raylet/raylet") if f'ringspec-node": "{node}"'.encode() in
                             Path(f"/proc/{p}/cmdline").read_bytes()) for node in "ab"}
        on = {node: sorted(Path(f"/proc/{p}/comm").read_text().strip() for p in children(pid)
                           if Path(f"/proc/{p}/comm").read_text().startswith("rs:")) for node, pid in raylet.items()}
        # each node runs its group's target and output and its streams' owners and drafts (an ingest that has read
        # its file to the end has exited); the front is neither's: the site actor is the launcher's own
        roles = ("target", "output", "cache_owner", "draft")
        for node in "ab":                         # one process of each role, whatever the node's streams
            assert [on[node].count(f"rs:{role}") for role in roles] == [1, 1, 1, 1], on
        assert [Path(f"/proc/{p}/comm").read_text().strip() for p in actors_of(proc.pid)].count("rs:site") == 1
        asked = {"bgl on b": ask_site(port, "bgl")}
        wait_for(lambda: any(r.get("id") == asked["bgl on b"][0] for r in journal_of(bgl)), "the answer's record "
                 "back at node b, in bgl's journal", proc)
        metrics = site_metrics(port)
        assert re.search(r'^ringspec_stream_lines_total\{stream="bgl",node="b"\} \d+$', metrics, re.M), metrics
        assert re.search(r'^ringspec_stream_lines_total\{stream="tep",node="a"\} \d+$', metrics, re.M), metrics
        for pid in [raylet["b"], *children(raylet["b"])]:  # node b goes: its raylet and everything it started
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "stream_end" in after_restart(journal_of(bgl)), "bgl resumed and read to its end", proc)
        asked["bgl on a"] = ask_site(port, "bgl")                      # the same front, its owner now on node a
        wait_for(lambda: re.search(r'^ringspec_stream_lines_total\{stream="bgl",node="a"\} \d+$', site_metrics(port),
                                   re.M), "bgl's series labelled with node a, where it runs now", proc)
        wait_for(lambda: site_lines(port, ("tep", "zookeeper")) == [16, 16], "tep's and zookeeper's lines in their "
                 "rings", proc)
        for name in ("tep", "zookeeper"):
            asked[name] = ask_site(port, name)
        restarts = re.findall(r'^ringspec_actor_restarts_total\{actor="[a-z_]+(?:\.bgl|@b)"\} (\d+)$',
                              site_metrics(port), re.M)
        assert sum(map(int, restarts)) >= 1, restarts
        proc.send_signal(signal.SIGINT)                                # serving ends with the operator's drain
        out, err = procs.finish(proc, "the two-node server draining")
        assert proc.returncode == 0, err
        assert "streams bgl (node b) are down" in err and "no live Ray node is labelled ringspec-node=b" in err, err
        first48 = tmp_path / "bgl48.log"
        first48.write_bytes(b"".join(STREAM_LOGS["bgl"].read_bytes().splitlines(keepends=True)[:48]))
        got = account(first48, bgl, cfgs.load(profile), serve=True)
        assert got["lines_committed"] == 48 and got["lines_lost"] == got["lines_duplicated"] == 0, got
        # each answer is journaled by its own stream's output actor, with the text its asker got, and nowhere else
        answered = {name: {r["id"]: r["text"] for r in journal_of(tmp_path / f"journal.{name}.jsonl")
                           if r["kind"] == "answer"} for name in logs}
        for what, (answer_id, text) in asked.items():
            assert answered[what.split()[0]].get(answer_id) == text and text.strip(), (what, answered)
        assert sum(map(len, answered.values())) == len(asked), answered
        passes = set()
        for name, scfg in cfgs.streams_of(cfgs.load(profile, {"serve.enabled": True})):
            if name == "bgl":
                continue
            records = journal_of(tmp_path / f"journal.{name}.jsonl")
            assert records[-1]["kind"] == "eof" and records[-1]["sent"] == 16
            assert not any(r["kind"] == "restart" for r in records), name
            assert asked[name][1] == alone_answer(scfg, logs[name][0], 16), name
            target = next(f for f in records[-1]["figures"] if f["actor"] == "target")
            passes.add((target["passes"], target["forward_calls"]))
        assert any(shared < calls for shared, calls in passes), f"no pass carried two streams' rows: {passes}"
        assert processes(b"gcs_server"), "the cluster we joined was shut down"
        assert not processes(b"ray::RayActor") and not leftovers(proc)
    finally:
        stop_ours()
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_a_sites_front_that_dies_starts_again_and_answers_while_the_streams_go_on(default_gguf, tmp_path):
    """Two node groups side by side on this machine (the local launcher), served by one site actor: the site is
    SIGKILLed; the launcher starts it again on the same links, the groups reconnect, a question is answered again
    through it, /metrics shows the target's exactness verdict again, and neither group was restarted (the site holds
    no sequence state)."""
    profile = tmp_path / "site.toml"
    profile.write_text(f'[serve]\napi_key = "{SITE_KEY}"\nretrieve = 0\n[replay]\nevery_lines = 1000\n' + "".join(
        f'[[streams]]\nname = "{name}"\nlog = "{STREAM_LOGS[name]}"\nnode = "{node}"\nmax_lines = 8\n'
        for name, node in (("tep", "a"), ("bgl", "b"))))
    port = free_port()
    proc = launch("--config", str(profile), "--quiet-lines", "--journal", str(tmp_path / "journal.jsonl"), "--http",
                  f"127.0.0.1:{port}", "--zmq", "", "--pub", "", "--archive", str(tmp_path / "archive.sqlite"),
                  verb="serve")
    wait_for(lambda: site_lines(port, ("tep", "bgl")) == [8, 8], "both streams' lines in their rings", proc)
    first = ask_site(port, "tep")
    site = [p for p in actors_of(proc.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "rs:site"]
    assert len(site) == 1
    os.kill(site[0], signal.SIGKILL)
    wait_for(lambda: not alive(site[0]), "the site gone", proc)
    wait_for(lambda: site_lines(port, ("tep", "bgl")) == [8, 8], "the site started again, the groups' status "
             "reaching it", proc)
    again = ask_site(port, "bgl"), ask_site(port, "tep")
    assert again[1][1] == first[1] and again[0][1].strip()        # the same question of the same ring: the same text
    restarts = dict(re.findall(r'^ringspec_actor_restarts_total\{actor="([a-z_@]+)"\} (\d+)$', site_metrics(port),
                               re.M))
    assert restarts["site"] == "1" and restarts["target@a"] == restarts["cache_owner@b"] == "0", restarts
    # the Start events went by before it started again: the groups' hello carries them (the verdict, not NaN)
    wait_for(lambda: re.search(r"^ringspec_batch_invariant [01]$", site_metrics(port), re.M), "the streams' Start "
             "records from the groups' hello", proc)
    proc.send_signal(signal.SIGINT)
    out, err = procs.finish(proc, "the server draining")
    assert proc.returncode == 0, err
    assert f"actor site (pid {site[0]}) died: signal 9 (SIGKILL); the site's front starts again (restart 1)" in err
    for name in ("tep", "bgl"):
        records = journal_of(tmp_path / f"journal.{name}.jsonl")
        assert not any(r["kind"] == "restart" for r in records) and records[-1]["kind"] == "eof", name
    assert not leftovers(proc)


SITE_KEY = "site-test-key-0123"
SITE_QUESTION, SITE_TOKENS = "What happened last, in one sentence?", 12


def after_restart(records: list[dict]) -> list[str]:
    """The kinds of the records after the first restart record ([] before one)."""
    kinds = [r["kind"] for r in records]
    return kinds[kinds.index("restart") + 1:] if "restart" in kinds else []


def ask_site(port: int, stream: str) -> tuple[str, str]:
    """Ask `stream` through the site's one HTTP front: the answer's id and text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "model": f"ringspec/{stream}", "max_tokens": SITE_TOKENS,
        "messages": [{"role": "user", "content": SITE_QUESTION}]}),
        {"Content-Type": "application/json", "Authorization": f"Bearer {SITE_KEY}"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, body
    reply = json.loads(body)
    assert reply["model"] == f"ringspec/{stream}", reply
    return reply["id"], reply["choices"][0]["message"]["content"]


def alone_answer(scfg, log: Path, lines: int) -> str:
    """What the serial engine answers `ask_site`'s question over the log's first `lines` lines alone, in the pool
    `serve` sizes (a question span and its answer)."""
    from pipeline.decode.assemble import make_engine
    from pipeline.stream.prompts import question_span
    from pipeline.stream.records import read_log
    from pipeline.stream.frame import replay_frame
    frame = replay_frame(scfg)
    engine = make_engine(scfg, frame.spec, check_rows=False)
    engine.feed(frame.head)
    for rec in read_log(str(log), None)[:lines]:
        engine.feed(frame.tok.encode(rec.text + "\n"))
    span = question_span(frame.tok, scfg.replay.system_prompt, [{"role": "user", "content": SITE_QUESTION}])
    res = engine.generate(span, SITE_TOKENS, frame.params, stop_ids=frame.tok.stop_ids)
    return frame.tok.decode([t for t in res.token_ids if t not in frame.tok.stop_ids])


def site_lines(port: int, streams) -> list:
    """Each stream's lines in its ring, as the site's /healthz says (None while it cannot say)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/healthz")
        health = json.loads(conn.getresponse().read())
        return [health["streams"][name]["lines"] for name in streams]
    except (OSError, ValueError, KeyError):
        return [None] * len(streams)


def site_metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {SITE_KEY}"})
    return conn.getresponse().read().decode()


def test_streams_are_grouped_by_node_in_profile_order(tmp_path):
    """One group per node (one target each), in the order the profile names them; one group keeps the run's names."""
    from pipeline import config as cfgs
    from pipeline.launch.plan import StreamOptions, groups, stream_runs
    profile = tmp_path / "nodes.toml"
    profile.write_text("".join(f'[[streams]]\nname = "{name}"\nlog = "{STREAM_LOGS[name]}"\nnode = "{node}"\n'
                               for name, node in (("bgl", "b"), ("tep", "a"), ("zookeeper", "b"))))
    cfg = cfgs.load(profile)
    run = groups(stream_runs(cfg, StreamOptions(), str(tmp_path)), str(tmp_path))
    assert [(g.node, [st.name for st in g.streams], g.actor("target")) for g in run] == [
        ("b", ["bgl", "zookeeper"], "target@b"), ("a", ["tep"], "target@a")]
    assert len({g.dir for g in run}) == 2 and all(g.dir.startswith(str(tmp_path) + "/") for g in run)
    one = groups(stream_runs(cfgs.node_profile(cfg, "b"), StreamOptions(), str(tmp_path)), str(tmp_path))
    assert [(g.node, g.dir, g.actor("target")) for g in one] == [("b", str(tmp_path), "target")]


def test_a_nodes_streams_share_one_draft_actor_and_npu_groups_on_one_host_are_refused_before_anything_starts(
        default_gguf, tmp_path):
    """One NPU per node, and one process may hold it: a node's streams share one draft actor (each stream's inbox
    and outbox), so NPU drafts of several streams on a node are planned as one opener. Two nodes' groups run by the
    local launcher on this one host would open it twice: refused before a model loads."""
    import actors.draft
    from models.npu import NpuBusy
    from pipeline import config as cfgs
    from pipeline.launch.plan import StreamOptions, actor_plans, groups, stream_runs
    from pipeline.launch.verbs import run_replay
    npu = '[board]\nnpu = "rknpu2"\n[draft]\nkind = "model"\nmodel = "default-draft"\nbackend = "rknn"\n'
    profile = tmp_path / "npu.toml"
    for nodes in ("aa", "ab"):
        profile.write_text(npu + "".join(f'[[streams]]\nname = "{name}"\nlog = "{STREAM_LOGS[name]}"\n'
                                         f'node = "{node}"\n' for name, node in zip(("bgl", "tep"), nodes)))
        cfg = cfgs.load(profile)
        run = groups(stream_runs(cfg, StreamOptions(), str(tmp_path)), str(tmp_path))
        drafts = [p for group in run for p in actor_plans(cfg, group, None, True, "t") if p.run is actors.draft.run]
        assert [(p.name, len(p.args.inboxes), len(p.args.outboxes)) for p in drafts] == (
            [("draft", 2, 2)] if nodes == "aa" else [("draft@a", 1, 1), ("draft@b", 1, 1)])
    with pytest.raises(NpuBusy, match="2 processes would open the NPU at once \\(draft@a, draft@b\\).*--launcher ray"):
        run_replay(cfg)


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_of(int(entry)) == pid:
                    found.append(int(entry))
            except (OSError, IndexError):
                continue
    return found


def actors_of(launcher: int) -> list[int]:
    """The actor processes a local launcher started: the children of its fork server (pipeline/launch/
    local_processes.py), named rs:<actor> once they run."""
    found = []
    for pid in (p for server in children(launcher) for p in children(server)):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("rs:"):
                found.append(pid)
        except OSError:                                  # gone between the listing and the read
            continue
    return found


def test_scored_lines_are_journaled_and_fire_where_the_serial_replay_fires(default_gguf, tmp_path):
    """score_stream + surprise_above through the actors: every line is journaled with its surprisal (the same as the
    serial replay's, which feeds lines one at a time: a feed's cut changes a surprisal by float rounding only), and
    the surprise trigger fires after the same lines in both."""
    from pipeline import config as cfgs
    from pipeline.stream.replay import replay
    journal, profile = tmp_path / "journal.jsonl", tmp_path / "profile.toml"
    profile.write_text('[replay]\nscore_stream = true\nsurprise_above = 1.0\nevery_lines = 1000\n'
                       'trigger_pattern = ""\nmax_new_tokens = 12\n')
    proc = launch(str(LOG), "--quiet-lines", "--max-lines", "40", "--journal", str(journal), "--config", str(profile))
    _, err = procs.finish(proc, "the pipeline ending")
    assert proc.returncode == 0, err
    records = journal_of(journal)
    lines = [r for r in records if r["kind"] == "line"]
    serial, fired = [], []
    replay(str(LOG), None, cfgs.load(profile),
           lambda kind, p: {"line": serial, "assessment": fired}.get(kind, []).append(p),
           max_lines=40)
    assert [r["text"] for r in lines] == [p["text"] for p in serial] and len(lines) == 40
    assert all(r["nll_n"] == p["nll_n"] and abs(r["nll_sum"] - p["nll_sum"]) < 1e-3 for r, p in zip(lines, serial))
    assert lines[0].get("surprise") is None and all(r.get("surprise") is not None for r in lines[1:])
    surprising = [a["lines"] for a in records if a["kind"] == "assessment" and a["trigger"] == "surprise"]
    assert surprising == [a["lines"] for a in fired if a["trigger"] == "surprise"] and surprising
    assert surprising == [i + 1 for i, r in enumerate(lines) if r["unusual"]]


@pytest.fixture(scope="module")
def skip20_profile(default_gguf, tmp_path_factory):
    """A draft model that runs ahead for real: SmolLM2 without block 20 (accepts about 60%, so rejections, restarts
    and stale blocks all happen)."""
    where = tmp_path_factory.mktemp("draft")
    keep = [i for i in range(30) if i != 20]
    gguf = layer_subset(default_gguf, where / "smollm2-skip20.gguf", keep)
    profile = where / "model_draft.toml"
    profile.write_text(f'[draft]\nkind = "model"\nmodel = "{gguf}"\nlength = 4\n[replay]\nmax_new_tokens = 40\n')
    return profile


def test_a_draft_model_running_ahead_changes_nothing_in_the_output(skip20_profile, tmp_path):
    journal = tmp_path / "journal.jsonl"
    proc = launch(str(LOG), "--quiet-lines", "--max-lines", "20", "--journal", str(journal), "--config",
                  str(skip20_profile))
    out, err = procs.finish(proc, "the pipeline ending")
    assert proc.returncode == 0, err
    records = journal_of(journal)
    analyses = [r for r in records if r["kind"] == "assessment"]
    target_only = skip20_profile.parent / "target_only.toml"
    target_only.write_text('[draft]\nkind = "none"\n[replay]\nmax_new_tokens = 40\n')
    assert [r["text"] for r in analyses] == serial_assessments(20, target_only)
    stats = [r["stats"] for r in analyses]
    assert sum(s["rejections"] for s in stats) > 0                  # restarts after rejections were exercised
    assert sum(s["accepted"] for s in stats) > 0
    assert all(0.0 <= s["overlap_s"] <= s["draft_s"] for s in stats)


def test_a_launcher_killed_outright_takes_its_actors_with_it(default_gguf):
    """SIGKILL (or the OOM killer) gives the launcher no chance to stop its actors: they die with it (PR_SET_PDEATHSIG)
    instead of spinning on as orphans, and what their dead owners left is what `cleanup_stale` removes."""
    proc = launch(str(LOG), "--quiet-lines", "--speed", "0.01")      # slow replay: mid-stream when killed
    actors = actor_pids(proc, "local")
    proc.kill()
    proc.communicate()
    wait_for(lambda: not any(alive(pid) for pid in actors.values()), "every actor gone with its SIGKILLed launcher",
             hang_s=120)
    cleanup_stale(f"ringspec_p{proc.pid}_")
    assert not leftovers(proc)


PINNED = {"ingest": "1", "cache_owner": "1", "target": "0", "draft": "1", "output": "1"}


@pytest.mark.parametrize("launcher,to", [("local", "launcher"), ("local", "group"), ("ray", "group")])
def test_sigusr1_prints_figures_and_a_stop_signal_drains_and_flushes_the_journal(default_gguf, tmp_path, launcher, to):
    """to: SIGTERM to the launcher (systemd, kill), or SIGINT to the whole process group (Ctrl-C in a terminal: every
    actor gets it too, ignores it, and the launcher drains them). The same runs hold
    test_per_actor_cpu_affinity_from_the_config_is_applied (a test of its own before, under both launchers; one
    pipeline start each now): with two CPUs, each actor pins itself on start-up to its `[actors]` CPUs."""
    journal, profile = tmp_path / "journal.jsonl", tmp_path / "pinned.toml"
    pin = len(os.sched_getaffinity(0)) >= 2
    profile.write_text("[actors]\n" + "".join(f'{k.replace("cache_", "")}_cpus = "{v}"\n' for k, v in PINNED.items())
                       if pin else "")
    proc = launch(str(LOG), "--quiet-lines", "--speed", "0.01", "--every", "2", "--journal", str(journal),
                  "--config", str(profile), launcher=launcher, group=to == "group")
    actors = actor_pids(proc, launcher)
    if pin:
        seen = {}

        def pinned() -> bool:                                            # each actor pins itself on start-up
            seen.update({name: cpus_allowed(pid) for name, pid in actors.items() if alive(pid)})
            return seen == PINNED
        wait_for(pinned, "every actor pinned", proc, progress=lambda: dict(seen))
        assert seen == PINNED
    wait_for(lambda: journal.exists() and bool(journal.read_text().strip()),    # streaming: the start record
             "the pipeline's start in the journal", proc)
    assert all(catches(pid, signal.SIGUSR1) for pid in actors.values())  # every actor answers SIGUSR1
    proc.send_signal(signal.SIGUSR1)                                     # figures on request
    time.sleep(2.0)
    if to == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    out, err = procs.finish(proc, "the pipeline ending")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "died" not in err, err
    on_request = [json.loads(line.split(" ", 1)[1]) for line in err.splitlines() if line.startswith("figures {")]
    assert {f["actor"] for f in on_request} == {"ingest", "cache_owner", "target", "draft", "output"}
    assert "draining" in err
    last = journal_of(journal)[-1]
    assert last["kind"] == "eof" and last["stopped"] and 0 < last["sent"] < 243
    assert not any(alive(pid) for pid in actors.values())
    assert not leftovers(proc)
    if launcher == "ray":
        assert not processes(b"raylet")


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def test_runner_threads_come_from_the_options(default_gguf):
    from kernels.ring import RingSpec
    from models.registry import converted_dir
    from models.runner import Runner, RunnerOptions

    def threads() -> int:
        return int(next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                        if line.startswith("Threads:")))

    cpus = len(os.sched_getaffinity(0))        # ONNX Runtime's thread pools (the native pass's: test_native.py)
    base = threads()
    one = Runner(converted_dir(default_gguf), RingSpec(4, 64, 96), RunnerOptions(threads=1, kernel="nbits"))
    with_one = threads()
    two = Runner(converted_dir(default_gguf), RingSpec(4, 64, 96), RunnerOptions(threads=min(2, cpus), kernel="nbits"))
    with_two = threads()
    assert with_two - with_one == (with_one - base) + min(2, cpus) - 1   # a pool of n threads: the caller + n - 1
    many = Runner(converted_dir(default_gguf), RingSpec(4, 64, 96), RunnerOptions(threads=cpus + 3, kernel="nbits"))
    assert threads() - with_two == (with_one - base) + cpus - 1     # never more than the CPUs it may run on
    del one, two, many


def test_follow_through_the_pipeline_survives_rotation_without_loss(default_gguf, tmp_path):
    """Each rotation happens once the lines before it were echoed (copytruncate loses what was not read before
    the truncation, in `tail -F` too), so a slow host only slows the test."""
    log = tmp_path / "plant.log"
    log.write_text("")
    sent = [f"12:{i // 60:02d}:{i % 60:02d} PIC{i:03d} H PRESSURE HIGH" for i in range(12)]
    proc = launch(str(log), "--follow", "--format", "plain", "--every", "1000", "--max-lines", "12")
    echoed = Echo(proc)
    ingest = actor_pids(proc, "local")["ingest"]
    wait_for(lambda: holds_open(ingest, log), "ingest opening the log", proc)
    with open(log, "a") as f:
        f.write("\n".join(sent[:5]) + "\n")
    echoed.wait(5)
    log.rename(tmp_path / "plant.log.1")                                 # rename rotation
    with open(log, "w") as f:
        f.write("\n".join(sent[5:9]) + "\n")
    echoed.wait(9)
    with open(log, "r+") as f:                                           # copytruncate
        f.truncate(0)
    with open(log, "a") as f:
        f.write("\n".join(sent[9:]) + "\n")
    wait_for(lambda: proc.poll() is not None, "the pipeline ending after 12 lines", proc, exit_ok=True)
    assert proc.wait() == 0, proc.stderr.read()
    echoed.done()
    assert echoed.lines == sent


class Echo:
    """The log lines a pipeline echoes on stdout (two-space indent), read as they come."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("  ") and not line.startswith("   "):
                self.lines.append(line[2:].rstrip("\n"))

    def wait(self, n: int) -> None:
        wait_for(lambda: len(self.lines) >= n or self.proc.poll() is not None, f"{n} lines echoed", self.proc,
                 progress=lambda: len(self.lines))

    def done(self) -> None:
        self.reader.join(30)


def wait_for(condition, what: str, proc=None, **kw) -> None:
    """Wait while `proc`'s tree (default: this process's) works; fail if proc exits first or everything stalls.
    A loaded host only makes this slower (pipeline/watch.py)."""
    try:
        watch.wait_for(condition, what, pids=[proc.pid] if proc is not None else (), **kw)
    except TimeoutError as e:
        pytest.fail(str(e))


def holds_open(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def stream_lines(out: str) -> list[str]:
    """The log lines the output actor echoed (two-space indent; assessments are marked otherwise)."""
    return [line[2:] for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")]


def test_a_socket_client_that_disconnects_mid_line_loses_nothing_and_triggers_fire(default_gguf, tmp_path):
    """Three lines, then quiet until the idle trigger's assessment is in the journal (however long a loaded host
    takes to load the model and prefill them), then a line that matches the pattern trigger."""
    port = free_port()
    journal = tmp_path / "journal.jsonl"
    profile = tmp_path / "triggers.toml"
    profile.write_text("[replay]\nevery_lines = 1000\ntrigger_pattern = '\\bHH\\b'\nidle_s = 1.0\n")
    proc = launch(f"tcp://127.0.0.1:{port}", "--max-lines", "5", "--config", str(profile), "--journal", str(journal))
    conn = []

    def listening() -> bool:
        try:
            conn.append(socket.create_connection(("127.0.0.1", port), timeout=1.0))
        except OSError:
            pass
        return bool(conn)
    wait_for(listening, "the TCP source listening", proc)
    first = conn[0]
    first.sendall(b"ALM1 FIC101 HIGH\nALM2 TIC202 LOW\nALM3 half a li")
    first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    first.close()                                                        # reset mid-line
    wait_for(lambda: journal.exists() and any(r["kind"] == "assessment" for r in journal_of(journal))
             or proc.poll() is not None, "the idle trigger never fired")  # quiet: the idle trigger fires
    with socket.create_connection(("127.0.0.1", port)) as second:
        second.sendall(b"ALM4 PIC303 HH PRESSURE\nALM5 LIC404 LOW\n")   # HH: the pattern trigger fires
    out, err = procs.finish(proc, "the pipeline ending after 5 lines")
    assert proc.returncode == 0, err
    assert stream_lines(out) == ["ALM1 FIC101 HIGH", "ALM2 TIC202 LOW", "ALM3 half a li", "ALM4 PIC303 HH PRESSURE",
                                 "ALM5 LIC404 LOW"]
    analyses = [r for r in journal_of(journal) if r["kind"] == "assessment"]
    assert [(a["trigger"], a["lines"]) for a in analyses] == [("idle", 3), ("pattern", 4)]


def test_bad_bytes_on_stdin_are_counted_never_fatal(default_gguf, tmp_path):
    journal = tmp_path / "journal.jsonl"
    data = (b"ok one\n" + b"bad \xff\xfe utf8\n" + b"nul \x00 inside\n" + b"X" * 100_000 + b"\n"
            + bytes(range(1, 9)) + b" junk\n" + b"ok last\n")
    proc = launch("-", "--format", "plain", "--every", "1000", "--quiet-lines", "--journal", str(journal),
                  stdin=subprocess.PIPE, text=False)
    out, err = procs.finish(proc, "the pipeline ending", data)
    err = err.decode()
    assert proc.returncode == 0, err
    eof = journal_of(journal)[-1]
    assert eof["kind"] == "eof" and eof["sent"] == 6
    assert (eof["invalid_utf8"], eof["nul_bytes"], eof["oversized"]) == (1, 1, 1)
    assert "1 invalid UTF-8, 1 with NUL, 1 oversized" in err


def test_ray_launcher_joins_an_existing_cluster_survives_an_actors_death_and_leaves_it_running(default_gguf,
                                                                                              tmp_path):
    """A SIGKILLed Ray actor restarts the pipeline in the same Ray session, and the stream resumes: every line
    committed once (test_supervise.py holds the local launcher to the same, under chaos)."""
    from bench.chaos import account
    from pipeline import config
    # Its own port, temp dir and the address it printed ("auto" would join whichever cluster started last on this
    # machine), and stopped by killing its own process tree (`ray stop` stops every cluster on the machine). The
    # temp dir is short: Ray puts unix sockets under it.
    ray_dir = tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp")
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    start = procs.run([*ray, "start", "--head", "--num-cpus", "2", "--include-dashboard=false",
                       "--disable-usage-stats", "--port", str(free_port()), "--temp-dir", ray_dir],
                      cwd=tmp_path, env=ENV)
    try:
        assert start.returncode == 0, start.stderr
        address = re.search(r"ray start --address='([^']+)'", start.stdout + start.stderr).group(1)
        journal = tmp_path / "journal.jsonl"
        proc = launch(str(LOG), "--quiet-lines", "--max-lines", "40", "--journal", str(journal), "--ray-address",
                      address, launcher="ray")
        actors = actor_pids(proc, "ray")
        wait_for(lambda: any(r["kind"] == "assessment" for r in journal_of(journal)) if journal.exists() else False,
                 "a first assessment in the journal", proc)
        os.kill(actors["draft"], signal.SIGKILL)
        out, err = procs.finish(proc, "the pipeline ending")
        assert proc.returncode == 0, err
        assert "actor draft" in err and "restarting the pipeline" in err and "Traceback" not in err
        assert [r["actor"] for r in journal_of(journal) if r["kind"] == "restart"] == ["draft"]
        lines = tmp_path / "first40.csv"
        lines.write_bytes(b"".join(LOG.read_bytes().splitlines(keepends=True)[:41]))
        got = account(lines, journal, config.load(), serve=False)
        assert got["lines_committed"] == 40 and got["lines_lost"] == got["lines_duplicated"] == 0
        assert processes(b"gcs_server"), "the cluster we joined was shut down"
        assert not any(alive(pid) for pid in actors.values())
        assert not processes(b"ray::RayActor") and not leftovers(proc)
    finally:
        stop_ours()
        shutil.rmtree(ray_dir, ignore_errors=True)


def stop_ours(grace_s: float = 10.0) -> None:
    """End every process this module started that is still running, with its descendants (a Ray cluster's
    daemons, and the agents they start with an environment of their own)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = parent_of(int(entry))
            except (OSError, IndexError):
                continue
    pids = {pid for pid in parents if pid != os.getpid() and _marked(pid)}
    while True:
        children = {pid for pid, parent in parents.items() if parent in pids} - pids
        if not children:
            break
        pids |= children
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace_s
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)


def _marked(pid: int) -> bool:
    try:
        return MARK.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_a_start_up_error_names_its_cause_and_starts_nothing(tmp_path):
    profile = tmp_path / "missing_draft.toml"
    profile.write_text('[draft]\nkind = "model"\nmodel = "/nonexistent/draft.gguf"\n')
    proc = launch(str(LOG), "--config", str(profile))
    out, err = procs.finish(proc, "the pipeline ending")
    assert proc.returncode == 2
    assert "model file /nonexistent/draft.gguf does not exist" in err and "Traceback" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas, read from /proc")
def test_an_actor_allocates_from_one_malloc_arena_however_many_threads_contend(tmp_path):
    """An actor's threads share glibc's main arena: one more arena per contending thread would stay resident and
    step its memory up under load (process._one_malloc_arena). Eight threads allocate at once in an actor process."""
    out = tmp_path / "arenas"
    code = f"from pipeline.process import enter; from tests.malloc_arenas import run; enter(run, {str(out)!r})"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
    assert out.read_text() == "0"

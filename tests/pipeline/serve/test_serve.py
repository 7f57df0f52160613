"""`run.py serve`, integration tier: the real model and pipeline answering operators while the stream flows.

One server for the module: the bundled TEP log looped at 10 lines/s for 400 lines, an API key, a small waiting
bound. Driven with OpenAI's own client, plain HTTP with SSE parsing, the zmq `ask` client, and the console in real
headless chromium.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.chaos import free_port
from pipeline.serve.zmq_api import client
from pipeline.stream.journal import records
from pipeline.watch import dies_with_parent, wait_for
from tests import procs
from tests.paths import ROOT, SHARED

KEY = "test-key"
LINES = 400
pytestmark = pytest.mark.slow


class Server:
    def __init__(self, proc, http_port: int, zmq: str, archive: Path):
        self.proc, self.port, self.zmq, self.archive = proc, http_port, zmq, archive
        self.stdout: list[str] = []
        threading.Thread(target=lambda: self.stdout.extend(proc.stdout), daemon=True).start()

    def request(self, method: str, path: str, body=None, key: str | None = KEY, raw: bytes | None = None,
                headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if key:
            hdrs["Authorization"] = f"Bearer {key}"
        conn.request(method, path, raw if raw is not None else (json.dumps(body) if body is not None else None),
                     hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp

    def health(self) -> dict:
        return json.loads(self.request("GET", "/healthz", key=None)[1])

    def metrics(self) -> str:
        return self.request("GET", "/metrics")[1].decode()

    def progress(self) -> tuple:
        """What moves while the server works: its output, the lines it took, the model's position."""
        try:
            h = self.health()
            return len(self.stdout), h["lines"], h["position"]
        except (OSError, ValueError):
            return len(self.stdout), None, None

    def wait_for(self, done, what: str, **kw) -> None:
        """Wait while the server makes progress (a loaded host only slows it); fail if it exits or stalls."""
        try:
            wait_for(done, what, pids=[self.proc.pid], progress=self.progress, **kw)
        except TimeoutError as e:
            pytest.fail(f"{e}\n" + "".join(self.stdout[-40:]))


def start_server(tmp: Path, profile_text: str, rate: float, lines: int, ready_lines: int) -> Server:
    profile = tmp / "serve.toml"
    profile.write_text(profile_text)
    http_port, zmq = free_port(), f"tcp://127.0.0.1:{free_port()}"
    archive = tmp / "archive.sqlite"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "serve", str(ROOT / "data" / "tep_demo.csv"),
                             "--loop", "--rate", str(rate), "--max-lines", str(lines), "--config", str(profile),
                             "--http", f"127.0.0.1:{http_port}", "--zmq", zmq, "--pub", "", "--archive", str(archive),
                             "--quiet-lines", "--journal", str(tmp / "journal.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=dies_with_parent)
    srv = Server(proc, http_port, zmq, archive)
    srv.wait_for(lambda: (srv.progress()[1] or 0) >= ready_lines,   # the model is up, the first lines in the ring
                 "the server coming up")
    return srv


def stop_server(srv: Server, at_once: bool = False) -> None:
    """SIGINT: drain (the module's server); at_once: a second SIGINT stops without draining (a test whose records
    are already in the journal need not wait for the backlog's analyses)."""
    srv.proc.send_signal(2)
    if at_once:
        wait_for(lambda: srv.proc.poll() is not None or any("draining" in line for line in srv.stdout),
                 "the drain starting", pids=[srv.proc.pid], exit_ok=True)
        srv.proc.send_signal(2)
    try:
        wait_for(lambda: srv.proc.poll() is not None, "the server draining", pids=[srv.proc.pid], cpu_budget_s=60,
                 hang_s=300)
    except TimeoutError:
        srv.proc.kill()
    srv.proc.wait()


@pytest.fixture(scope="module")
def server(default_gguf, tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("serve"),
                       f'[serve]\napi_key = "{KEY}"\nmax_waiting = 3\n[replay]\nevery_lines = 10\n'
                       'score_stream = true\n', rate=10,
                       lines=LINES, ready_lines=30)
    yield srv
    stop_server(srv)


def sse_events(resp) -> list[str]:
    """The data fields of a server-sent-event stream, as they arrive."""
    events, data = [], []
    for raw in resp:
        line = raw.decode().rstrip("\n").rstrip("\r")
        if line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and data:
            events.append("\n".join(data))
            data = []
    return events


def test_openai_client_streams_a_chat_answer_token_by_token(server):
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY, max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="ringspec", stream=True, max_tokens=40,
                                            messages=[{"role": "user", "content": "Which tags are alarming now?"}])
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 3 and "".join(pieces).strip()
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage.completion_tokens >= len(pieces) and last.usage.prompt_tokens > 10


def test_openai_client_gets_whole_chat_and_completion_answers_with_usage(server):
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY, max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="ringspec", max_tokens=24,
                                          messages=[{"role": "user", "content": "What is the plant doing?"}])
    assert chat.choices[0].message.content.strip()
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    done = client.completions.create(model="ringspec", prompt="12:00:00 AIR003_3", max_tokens=12)
    assert done.choices[0].text and done.usage.completion_tokens == 12 and done.choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list().data] == ["ringspec"]


def test_plain_sse_ends_with_done_and_an_answer_carries_the_lines_it_cites(server):
    # AIR003_3 is the log's first line: once 100 lines (over 1,500 tokens) are in the ring it has left the 1,024-token
    # window, and only the archive has it (waiting for the count, not for a time: a loaded host slows the ring)
    server.wait_for(lambda: (server.progress()[1] or 0) >= 100, "the first line leaving the window")
    body = {"messages": [{"role": "user", "content": "When did AIR003_3 last go HIGH?"}], "max_tokens": 30,
            "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.getheader("Content-Type") == "text/event-stream"
    events = sse_events(resp)
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    meta = final["ringspec"]          # a "last" question: answered from the archive, the line cited by the server
    cited = meta["citations"]
    assert meta["route"] == "aggregate" and cited and all("AIR003_3" in h["text"] and h["time"] and h["seq"] >= 1
                                                          for h in cited)
    assert meta["answer"] and meta["answer"] in cited[0]["text"]
    assert final["usage"]["completion_tokens"] >= len(events) - 2


@pytest.mark.parametrize("method, path, body, raw, status, words", [
    ("POST", "/v1/chat/completions", None, b"{not json", 400, "not JSON"),
    ("POST", "/v1/chat/completions", {"messages": []}, None, 400, "non-empty list"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, None,
     400, "max_tokens must be an integer in 1..256"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "PIR108 " * 600}]}, None, 400,
     "at most 384"),
    ("POST", "/v1/chat/completions", None, b"{" + b" " * 70000 + b"}", 413, "exceeds 65536"),
    ("POST", "/v1/completions", {"prompt": ""}, None, 400, "non-empty string"),
    ("GET", "/v1/nowhere", None, None, 404, "no such endpoint"),
    ("GET", "/v1/chat/completions", None, None, 405, "method not allowed"),
])
def test_bad_requests_get_a_clear_4xx_and_the_server_carries_on(server, method, path, body, raw, status, words):
    got, payload, _ = server.request(method, path, body, raw=raw)
    assert got == status
    assert words in json.loads(payload)["error"]["message"]
    assert server.health()["status"] == "ok"


def test_the_api_key_is_required_except_for_health(server):
    """Every route, not one: each refuses a missing, wrong or query key, but health and the console's page (which
    holds no data; its fetches carry the key). A refusal comes before any work, so this costs no model time."""
    from pipeline.serve.http_api import _Handler
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for method, routes in _Handler.ROUTES.items():
        for path in routes:
            body = chat if method == "POST" else None
            for key, query in ((None, ""), ("wrong", ""), (None, "?key=wrong")):
                got = server.request(method, path + query, body, key=key)[0]
                assert got == (200 if path in ("/healthz", "/") else 401), (method, path, key, query)


def test_clients_that_disconnect_are_each_cancelled_and_counted_and_more_than_the_waiting_bound_get_503(server):
    """Three long answers in flight (a streamed one being answered, two waiting for a whole reply), a fourth refused
    with 503; the three clients hang up. Each is noticed while it waits (http_api `_next`; a whole reply writes
    nothing until its end, so before that the server saw no hang-up and ran it to its 256 tokens), counted and
    cancelled: a queued one leaves the queue, one being answered stops at its next block; each is journaled."""
    before, cancelled_before = disconnects(server), counted(server, 'answers_total{outcome="cancelled"}')
    journal = str(server.archive.parent / "journal.jsonl")
    asked = "12:00:00 AIR003_3 H PURGE C CONC HIGH ALM\n"

    def answers() -> list[dict]:
        return [r for r in records(journal) if r.get("kind") == "answer" and r.get("question") == asked]
    answered_before = len(answers())
    socks = []
    for i in range(3):                      # max_waiting = 3: three long answers (the log continued) in flight
        s = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": asked, "max_tokens": 256,
                           "stream": i == 0, "deadline_s": 60}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        socks.append(s)
    socks[0].settimeout(120)
    assert b"200 OK" in socks[0].recv(4096)                  # the streamed answer has started
    server.wait_for(lambda: counted(server, 'queue_depth{queue="in_flight"}') == 3, "three answers in flight")
    status, payload, resp = server.request("POST", "/v1/chat/completions",
                                           {"messages": [{"role": "user", "content": "and me?"}]})
    assert status == 503 and resp.getheader("Retry-After") == "1"
    assert "already waiting" in json.loads(payload)["error"]["message"]
    for s in socks:
        s.close()                                     # gone mid-answer: cancelled, counted, nothing breaks

    server.wait_for(lambda: len(answers()) - answered_before == 3 and
                    counted(server, 'queue_depth{queue="in_flight"}') == 0, "the three answers ending")
    gone = answers()[answered_before:]
    assert [(r["finish_reason"], r.get("client_gone")) for r in gone] == [("cancelled", True)] * 3, gone
    assert max(r["completion_tokens"] for r in gone) < 256, gone     # stopped, not run to their end (or not started)
    assert disconnects(server) - before == 3
    # the owner's counters reach /metrics with its next status, after the answers' records: wait for it
    server.wait_for(lambda: counted(server, 'answers_total{outcome="cancelled"}') - cancelled_before >= 3,
                    "the cancellations in the owner's figures")
    assert counted(server, 'answers_total{outcome="cancelled"}') - cancelled_before == 3
    status, payload, _ = server.request("POST", "/v1/chat/completions",
                                        {"messages": [{"role": "user", "content": "still there?"}], "max_tokens": 8})
    assert status == 200


def counted(server, name: str) -> int:
    """A counter or gauge of the server's /metrics (name with its labels, as printed)."""
    return int(float(re.search(rf"^ringspec_{re.escape(name)} (\S+)$", server.metrics(), re.M).group(1)))


def disconnects(server) -> int:
    return int(re.search(r"^ringspec_client_disconnects_total (\d+)", server.metrics(), re.M).group(1))


def test_a_client_that_resets_between_requests_is_a_counted_drop_not_a_traceback(server):
    """A keep-alive client that sends a TCP reset while its handler waits for the next request line (seen in CI when
    an answer ended just before its client closed). The reset is planted with SO_LINGER 0, so it happens every run."""
    before = disconnects(server)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("GET", "/healthz")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["status"] == "ok" and not resp.will_close
    # the whole answer is read: the handler now waits for the next request line on the kept-alive connection
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()                                     # linger 0: the close is a reset, not a FIN
    traced = lambda: "Traceback" in "".join(server.stdout)                 # noqa: E731 -- what the fault prints
    server.wait_for(lambda: disconnects(server) > before or traced(), "the reset being counted or traced")
    assert not traced() and disconnects(server) > before
    assert server.health()["status"] == "ok"


def test_metrics_are_prometheus_text_with_the_figures_an_operator_watches(server):
    text = server.metrics()
    for name in ("decode_tokens_per_second", "draft_acceptance_ratio", "queue_depth", "resident_memory_bytes",
                 "kv_pool_bytes", "dropped_lines_total", "request_ttft_ms", "request_latency_ms",
                 "http_requests_total"):
        assert f"# TYPE ringspec_{name} " in text, name
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r'ringspec_\w+(\{[^}]*\})? [-+0-9.eENa]+', line), line
    assert re.search(r'^ringspec_resident_memory_bytes\{actor="target"\} [1-9]', text, re.M)
    assert int(re.search(r"^ringspec_kv_pool_bytes (\d+)", text, re.M).group(1)) > 0
    assert re.findall(r'^ringspec_actor_restarts_total\{actor="(\w+)"\} 0$', text, re.M) == [
        "ingest", "cache_owner", "target", "draft", "output"]          # no actor died (test_supervise kills them)
    # the profile scores the stream: every line but the first has a surprise, counted in a cumulative histogram
    buckets = [int(n) for n in re.findall(r'^ringspec_line_surprise_bucket\{le="[^"]+"\} (\d+)$', text, re.M)]
    count = int(re.search(r"^ringspec_line_surprise_count (\d+)$", text, re.M).group(1))
    assert "# TYPE ringspec_line_surprise histogram" in text and buckets == sorted(buckets)
    assert buckets[-1] == count > 0


def test_zmq_ask_client_prints_the_answer_as_it_streams(server):
    ask = [sys.executable, str(ROOT / "run.py"), "ask", "--zmq", server.zmq, "--max-tokens", "20",
           "When did AIR001_3 last go HIGH?"]
    refused = procs.run(ask, env={k: v for k, v in os.environ.items() if k != "RINGSPEC_API_KEY"})
    assert refused.returncode != 0 and "missing API key" in refused.stderr     # the server has a key
    proc = procs.run(ask, env={**os.environ, "RINGSPEC_API_KEY": KEY})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "tokens" in proc.stderr and "cited" in proc.stderr


def test_zmq_rejects_junk_with_an_error_reply(server):
    import msgpack
    sock = client(server.zmq, KEY)                   # the server has a key: it is given in the handshake
    try:
        for junk in (b"\xc1\xff not msgpack", msgpack.packb({"question": ""}), msgpack.packb([1, 2])):
            sock.send(junk)
            assert sock.poll(30000)
            reply = msgpack.unpackb(sock.recv(), raw=False)
            assert reply["code"] == 400 and reply["error"]
    finally:
        sock.close()


def chromium_driver():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        if os.environ.get("CI"):
            pytest.fail("CI needs Debian's chromium and chromium-driver (.ci/run installs them)")
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_console_in_headless_chromium_shows_the_tail_moving_and_an_answer_arriving_token_by_token(server, tmp_path):
    from selenium.webdriver.common.by import By
    browser = chromium_driver()
    try:
        browser.get(f"http://127.0.0.1:{server.port}/#key={KEY}")
        tail = browser.find_element(By.ID, "tail")
        server.wait_for(lambda: len(tail.find_elements(By.TAG_NAME, "div")) > 0, "a stream line in the console")
        first_last = tail.find_elements(By.TAG_NAME, "div")[-1].get_attribute("data-seq")
        # a question the cited reader routes "other": the model writes it, token by token (an answer copied from the
        # archive arrives whole, at once)
        browser.find_element(By.ID, "question").send_keys("Summarise what the plant is doing in one sentence.")
        browser.find_element(By.ID, "ask").click()
        seen = []

        def answered() -> bool:
            answers = browser.find_elements(By.CSS_SELECTOR, ".answer")
            text = answers[-1].text if answers else ""
            if text and (not seen or seen[-1] != text):
                seen.append(text)
            return browser.find_element(By.ID, "ask").is_enabled() and bool(text)
        server.wait_for(answered, "the answer finishing in the console", poll_s=0.02)
        assert len(seen) >= 3, f"the answer did not arrive incrementally: {seen}"
        assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))
        server.wait_for(lambda: tail.find_elements(By.TAG_NAME, "div")[-1].get_attribute("data-seq") != first_last,
                        "the console's tail moving")
        assert browser.find_element(By.ID, "g-lines").text not in ("", "-")
        browser.save_screenshot(str(tmp_path / "console.png"))
    finally:
        browser.quit()


def test_every_line_reaches_the_ring_while_questions_are_served(server):
    """Runs last in the module: the stream of LINES lines ends; none was lost to the questions above."""
    server.wait_for(lambda: server.health()["stream_ended"], "the stream ending")
    server.wait_for(lambda: server.health()["lines"] >= LINES, f"all {LINES} lines reaching the ring")
    assert server.health()["lines"] == LINES
    text = server.metrics()
    assert re.findall(r'^ringspec_dropped_lines_total\{reason="queue_full"\} (\d+)', text, re.M) == ["0"]
    assert int(re.search(r'^ringspec_answers_total\{outcome="answers"\} (\d+)', text, re.M).group(1)) >= 6
    tokens = int(re.search(r'^ringspec_stream_tokens_total (\d+)', text, re.M).group(1))
    assert tokens >= 20 * LINES                          # a TEP line is about 29 tokens
    share = dict(re.findall(r'^ringspec_stream_share\{kind="(\w+)"\} (\S+)', text, re.M))
    assert float(share["minimum"]) == 0.5 and 0.0 < float(share["measured"]) <= 1.0


def test_ctrl_c_to_the_servers_process_group_drains_it(server):
    """Ends the module's server as a terminal's Ctrl-C would: SIGINT to every process of its group. The actors ignore
    it, the launcher drains them: exit 0, no traceback, the journal's final record written (after the whole stream,
    which this test waits for itself: run alone, with -k or by a parallel runner, it is the module's first test)."""
    server.wait_for(lambda: server.health()["stream_ended"], "the stream ending")
    os.killpg(server.proc.pid, signal.SIGINT)
    wait_for(lambda: server.proc.poll() is not None, "the server draining", pids=[server.proc.pid], hang_s=300)
    time.sleep(0.5)                                          # the reader thread takes the last of its output
    out = "".join(server.stdout)
    assert server.proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out and "died" not in out, out[-3000:]
    journal = [json.loads(line) for line in (server.archive.parent / "journal.jsonl").read_text().splitlines()]
    assert journal[-1]["kind"] == "eof" and journal[-1]["sent"] == LINES


def test_an_answer_with_trees_adaptive_length_and_line_ends_is_the_target_alones(default_gguf, tmp_path):
    """The same stream, fully in the ring, and the same question: the target alone and the speculative pipeline with
    every block policy on write the same answer, token for token. The length follows acceptance alone (prior costs):
    with timed costs a loaded host could choose no proposals at all, and the check that some were accepted would
    fail for the clock's sake (seen once, with three heavy jobs on two cores)."""
    answers = {}
    for name, draft in (("target_only", 'kind = "none"'),
                        ("combined", 'kind = "suffix"\nsiblings = 2\nadaptive = true\nadaptive_costs = "prior"\n'
                                     'end_at_line = true')):
        (tmp_path / name).mkdir()
        srv = start_server(tmp_path / name, f'[draft]\n{draft}\n[serve]\napi_key = "{KEY}"\n'
                                            f'[replay]\nevery_lines = 1000\n', rate=100, lines=40, ready_lines=40)
        try:
            status, body, _ = srv.request("POST", "/v1/chat/completions", {
                "model": "ringspec", "max_tokens": 48,
                "messages": [{"role": "user", "content": "Which alarms are active, and on which units?"}]})
        finally:
            stop_server(srv, at_once=True)
        assert status == 200, body
        answers[name] = json.loads(body)["choices"][0]["message"]["content"]
        journal = [json.loads(line) for line in (tmp_path / name / "journal.jsonl").read_text().splitlines()]
        stats = next(r["stats"] for r in journal if r["kind"] == "answer")
        assert (stats["accepted"] > 0) == (name == "combined"), stats      # the draft's proposals were accepted
    assert answers["combined"] == answers["target_only"] and answers["combined"].strip()


STREAMS = {"tep": ROOT / "data" / "tep_demo.csv", "bgl": SHARED / "data" / "loghub" / "BGL_2k.log",
           "zookeeper": SHARED / "data" / "loghub" / "Zookeeper_2k.log"}


def test_three_streams_in_one_server_each_answer_as_the_target_alone(default_gguf, tmp_path):
    """One `serve`, three logs as three streams of one target (`[[streams]]`): a question names its stream by the
    model (ringspec/NAME) and is answered, token for token, as the serial engine answers it over that log alone;
    /healthz and /metrics show each stream; a question naming no stream, or another one, gets a clear 4xx."""
    from pipeline import config as cfgs
    from pipeline.decode.assemble import make_engine
    from pipeline.stream.prompts import question_span
    from pipeline.stream.records import read_log
    from pipeline.stream.frame import replay_frame
    lines, question = 12, "What happened last, in one sentence?"
    profile = tmp_path / "streams.toml"
    profile.write_text(f'[serve]\napi_key = "{KEY}"\nretrieve = 0\n[replay]\nevery_lines = 1000\n'
                       f'max_lines = {lines}\n' + "".join(f'[[streams]]\nname = "{n}"\nlog = "{p}"\n'
                                                          for n, p in STREAMS.items()))
    http_port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "serve", "--config", str(profile),
                             "--http", f"127.0.0.1:{http_port}", "--zmq", f"tcp://127.0.0.1:{free_port()}",
                             "--pub", "", "--archive", str(tmp_path / "archive.sqlite"), "--quiet-lines",
                             "--journal", str(tmp_path / "journal.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=dies_with_parent)
    srv = Server(proc, http_port, "", tmp_path / "archive.sqlite")

    def taken() -> dict:
        """Each stream's lines in its ring so far ({} while the server comes up)."""
        try:
            return {n: st["lines"] for n, st in srv.health().get("streams", {}).items()}
        except (OSError, ValueError):
            return {}

    srv.progress = lambda: (len(srv.stdout), *taken().values())
    answers = {}
    try:
        srv.wait_for(lambda: taken() == {n: lines for n in STREAMS}, "every stream's lines in its ring")
        for name in STREAMS:
            status, body, _ = srv.request("POST", "/v1/chat/completions", {
                "model": f"ringspec/{name}", "max_tokens": 24, "messages": [{"role": "user", "content": question}]})
            assert status == 200, body
            reply = json.loads(body)
            assert reply["model"] == f"ringspec/{name}"
            answers[name] = reply["choices"][0]["message"]["content"]
        for model, code in (("ringspec", 400), ("ringspec/nowhere", 404)):
            status, body, _ = srv.request("POST", "/v1/chat/completions", {
                "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": question}]})
            assert status == code and b"stream" in body, body
        # an owner's figures reach /metrics with its next status, just after its answer's last event: wait for them
        srv.wait_for(lambda: all(re.search(rf'^ringspec_answers_total{{stream="{name}",outcome="answers"}} 1$',
                                           srv.metrics(), re.M) for name in STREAMS), "each answer in /metrics")
        metrics = srv.metrics()
        for name in STREAMS:
            assert re.search(rf'^ringspec_stream_lines_total{{stream="{name}"}} {lines}$', metrics, re.M), metrics
        models = json.loads(srv.request("GET", "/v1/models")[1])["data"]
        assert [m["id"] for m in models] == [f"ringspec/{n}" for n in STREAMS]
        console = console_asks(http_port, "bgl", question, srv)
    finally:
        stop_server(srv, at_once=True)
    # the console: lines labelled by stream, the picked stream's gauges, its question asked of that stream (greedy:
    # the console's longer answer begins with the 24-token one)
    assert {"[tep]", "[bgl]", "[zookeeper]"} <= {text.split(" ")[0] for text in console["tail"]}, console["tail"]
    assert console["lines"] == str(lines)
    assert console["answer"].startswith(answers["bgl"].strip()), console["answer"]
    for (name, scfg), log in zip(cfgs.streams_of(cfgs.load(profile, {"serve.enabled": True})), STREAMS.values()):
        frame = replay_frame(scfg)                      # the pool `serve` sizes: a question span and its answer
        engine = make_engine(scfg, frame.spec, check_rows=False)
        engine.feed(frame.head)
        for rec in read_log(str(log), None)[:lines]:
            engine.feed(frame.tok.encode(rec.text + "\n"))
        span = question_span(frame.tok, scfg.replay.system_prompt, [{"role": "user", "content": question}])
        res = engine.generate(span, 24, frame.params, stop_ids=frame.tok.stop_ids)
        alone = frame.tok.decode([t for t in res.token_ids if t not in frame.tok.stop_ids])
        assert answers[name] == alone and alone.strip(), name


def console_asks(port: int, stream: str, question: str, srv) -> dict:
    """The console in headless chromium with several streams: pick `stream`, ask `question`; its tail's lines, the
    lines gauge and the answer once finished."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    browser = chromium_driver()
    try:
        browser.get(f"http://127.0.0.1:{port}/#key={KEY}")
        srv.wait_for(lambda: browser.find_element(By.ID, "g-stream-box").is_displayed(), "the console's picker")
        Select(browser.find_element(By.ID, "stream")).select_by_value(stream)
        browser.find_element(By.ID, "question").send_keys(question)
        browser.find_element(By.ID, "ask").click()
        answer = (lambda: browser.find_elements(By.CSS_SELECTOR, ".answer")[-1].text)
        srv.wait_for(lambda: browser.find_element(By.ID, "ask").is_enabled() and bool(answer()),
                     "the console's answer")
        return {"tail": [d.text for d in browser.find_element(By.ID, "tail").find_elements(By.TAG_NAME, "div")],
                "lines": browser.find_element(By.ID, "g-lines").text, "answer": answer()}
    finally:
        browser.quit()


def test_a_question_preempts_a_running_analysis(default_gguf, tmp_path):
    """Every line triggers a 200-token free-text analysis and lines come every half second; each question is asked
    once /metrics shows an analysis being written (sent as it starts): it must not wait for that analysis to end."""
    srv = start_server(tmp_path, "[replay]\ntrigger_pattern = '.'\nmax_new_tokens = 200\nform = 'free'\n", rate=2,
                       lines=60, ready_lines=3)       # free text: the structured form's fields end in ~40 tokens
    try:
        def counted(name: str) -> int:
            return int(re.search(rf"^ringspec_{re.escape(name)} (\d+)", srv.metrics(), re.M).group(1))

        queued = []
        for question in ("What just happened?", "Which tag alarmed last?", "Is anything LOW now?"):
            srv.wait_for(lambda: counted("analysis_running") == 1, "an analysis being written", poll_s=0.02)
            status, payload, _ = srv.request("POST", "/v1/chat/completions", key=None,
                                             body={"messages": [{"role": "user", "content": question}],
                                                   "max_tokens": 8})
            assert status == 200, payload
            queued.append(json.loads(payload)["ringspec"]["queued_blocks"])
        # the owner's figures reach /metrics between its work items
        srv.wait_for(lambda: counted('answers_total{outcome="answers"}') >= 3, "three answers in /metrics")
        assert counted("analyses_preempted_total") >= 2, srv.metrics()
        assert max(queued) <= 1        # verify blocks sent after a question came: the one being prepared, not the rest
    finally:
        stop_server(srv, at_once=True)


def test_eval_recall_reports_retrieval_and_exact_answers_with_and_without_the_archive(default_gguf):
    log = SHARED / "data" / "tep_alarms" / "filter" / "text_alarms_filter_1.csv"
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "eval-recall", "--logs", str(log), "--per-log", "2",
                      "--max-questions", "2", "--k", "2", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["questions"] == 2 and set(out["recall_at"]) == {"1", "4", "8"}
    assert 0.0 <= out["exact_without_archive"] <= out["exact_with_archive"] + 1.0
    for row in out["rows"]:
        assert re.fullmatch(r"\d\d:\d\d:\d\d", row["answer"])
        assert row["exact_with"] == (row["answer"] in row["text_with"])
        assert row["exact_without"] == (row["answer"] in row["text_without"])
        assert row["recalled"] == any(row["answer"] in line for line in row["retrieved"])


def test_operator_bench_measures_answers_and_ingestion_against_a_real_server(default_gguf, tmp_path):
    profile = tmp_path / "quiet.toml"            # no periodic analyses: the servers come up and answer sooner
    profile.write_text("[replay]\nevery_lines = 1000\n")
    proc = procs.run([sys.executable, str(ROOT / "run.py"), "bench", "--task", "operator", "--questions", "2",
                      "--rate", "10", "--rates", "4", "--seconds", "3", "--warm-lines", "10", "--json",
                      "--config", str(profile)])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [r["retrieve"] for r in out["latency"]] == [0, 2]
    for r in out["latency"]:
        assert len(r["rows"]) == 2 and r["ttft_p50_ms"] > 0 and r["tokens_per_s_p50"] > 0
        assert all(row["prompt_tokens"] > 0 and row["final"]["ringspec"]["model_call"] for row in r["rows"])  # the
        #                                                        model's answers, not the archive's direct ones
    assert out["keeps_up"][0]["rate"] == 4 and out["keeps_up"][0]["questions"] >= 1

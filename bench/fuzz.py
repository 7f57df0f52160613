"""`python run.py fuzz`: property-based fuzzing of every input ringspec takes from outside, with figures.

Owns the targets and the one property each holds: an input gets a precise error or a counted drop, never a crash, a
hang or a traceback to the client. Inputs are drawn by hypothesis (the test extra); a failing input is shrunk to a
small one and printed. Each target runs the real code on real sockets and files:

    records   a log's bytes (csv, jsonl, plain; invalid UTF-8, NUL, lines up to 1 MB, control-token text) through
              the stream source, the parser and the renderer: records printable, bounded, every oversized line,
              invalid byte and NUL counted
    config    TOML profiles: junk text, and valid TOML with unknown sections, wrong types and values -> a Config or a
              ConfigError naming the file, never another exception
    gguf      the default model's first MB, truncated or with bytes flipped -> GGUFError naming the file
    http      request heads and bodies over a real socket to the real HTTP face and front, a stand-in owner answering
              at once -> a JSON error or an answer, or the connection cut and counted; no traceback on stderr; the
              server healthy after every case
    zmq       msgpack and junk messages to the real zmq face (the key in its handshake) -> an error reply with a
              code, or an answer
    site      hostile multipart messages to the real site hub (pipeline/serve/site_link.py), from a stranger's PUSH to its
              PULL and a stranger's DEALER to its ROUTER: random frames, a wrong MAC (random, another run's key, the
              other direction, a flipped frame) over valid frames, and under the run's key hostile headers (odd
              dtypes, lying byte counts, huge shapes, bad envelopes, replays) -> the hub never raises, delivers
              nothing, counts each as one drop; a real group's event and question still cross after every case
    http_smuggle  a second request smuggled in a body the server does not read (a GET with a length, a POST
              refused 401/404/405), two or conflicting Content-Lengths and Transfer-Encodings, and a few clients
              trickling a request slower than serve.request_timeout_s (0.5 s here) -> never a second answer on the
              connection, never a 500, a trickler cut in time and counted; a request on a fresh connection answered
    budget    hostile questions (any text, long word lists, many roots, FTS5 syntax, every aggregate form) to the
              cited reader (every other one with serve.reader "spans") over a prebuilt 3,000-line archive, under a
              small budget (200 lines, 200 x evidence.STEPS steps) -> a Reply, a Choice or None, never an exception;
              the lines read and the steps within the budget (and the lines each loop weighs whatever it says); every
              answer a span of a line cited, or a count
    site_flood  floods of a real site hub in a child process (bench/flood.py), one per case, drawn: keyless zmq
              peers sending 4 MiB messages, keyless raw ZMTP peers sending one endless multipart message, key
              holders replaying an earlier start's hello and the live start's old counters -> the child's peak
              resident size never over 64 MB above its size before the first flood, every replay refused (stale or
              replayed), the real group's event and question crossing after every flood
    archive   hostile lines (4 KB lines of numbers, distinct words, lone and planted header lines) into a real archive
              (max_lines 20, 16 values a line, a miner of 8 templates) -> never raises; no line over 16 value rows,
              no template row without a line, the miner within 8 templates and COMPARED + 1 comparisons a line
    journal   records of any size (answers, checkpoints), reopenings and files planted at its kept names (another
              user's, a symlink, a directory) -> never raises; every file of its own under max_bytes plus one record
              plus the carried checkpoint, 0600; the last checkpoint resumed; no planted file read or changed
    patterns  hostile log lines and questions (a short unit of the characters the patterns name, repeated, then a
              tail) whose pattern work is counted in steps (bench/regex_steps.py) and must stay linear: values_of on
              a line, route() on a question, at 256 and 512 characters -> steps at most x2.5 from one to the other (or
              under 40 a character), no call past 200 a character; the cited reader's fit of a line's every span
              within 12 x _NEAR steps a span (plus 8 a character)
    zmq_flood  floods of the real zmq face (a key, 4 peers, 4 workers) for a drawn while: keyless DEALERs, wrong keys,
              raw ZMTP peers sending one endless message of MORE frames, key holders sending junk or questions and
              never reading the replies -> a key holder's question answered or refused with a code during the
              flood and answered after it, the peers' table within its cap, this process's growth <= 64 MB
    http_flood  up to 24 sockets from one to four loopback addresses holding the real HTTP face (a key, 8
              connections, 4 unkeyed per address, 1 KiB heads): requests begun and never finished, heads past the
              bound that never end, keyless requests and key holders' connections kept alive -> /healthz 200 and a
              key holder's request 200 meanwhile (503 only when key holders hold every keyed place), an oversized
              head 431 or cut, no 500, the keyed places given back, this process's growth <= 64 MB
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import get_type_hints

import msgpack
import numpy as np
import zmq

from bench import regex_steps
from bench.flood import Host, _zmtp_peer
from bench.question_budget import build as build_archive
from models.gguf import GGUFError, GGUFModel
from pipeline import config, messages
from pipeline.channel import Channel, ChannelSpec
from pipeline.messages import Answer, AnswerDelta, Cancel, Question, decode
from pipeline.process import proc_status
from pipeline.report import Report
from pipeline.serve import cited as cited_reader
from pipeline.serve import route as router
from pipeline.serve import site_link
from pipeline.serve.auth import load_keys
from pipeline.serve.cited import Choice as CitedChoice, Reply as CitedReply, read as cited_read
from pipeline.serve.front import Front
from pipeline.serve.http_api import serve_http
from pipeline.serve.zmq_api import ZmqFront
from pipeline.serve.zmq_api import client as zmq_client
from pipeline.stream import values as line_values
from pipeline.stream import journal
from pipeline.stream.archive import Archive
from pipeline.stream.evidence import MIN_WEIGHED, STEPS, Budget
from pipeline.stream.journal import Journal, resume_point
from pipeline.stream.records import render
from pipeline.stream.sources import Stream, parse
from pipeline.stream.templates import COMPARED

TARGETS = ("records", "config", "gguf", "http", "zmq", "site", "http_smuggle", "budget", "site_flood", "archive",
           "journal", "patterns", "zmq_flood", "http_flood")
CONTROL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "\x00", "\x1b[2J", "\u202e")
CASE_TIMEOUT_S = 30.0                      # a case with no answer by then is a hang
LENGTHS = ["exact", "short", "none", "twice", "-1", "+5", "1e3", " 12", "0x10", "\u0663", "99999999999"]


@dataclass
class FuzzReport(Report):
    def text(self) -> str:
        rows = [f"{'target':12} {'cases':>6} {'failures':>8}  first failure (shrunk)"]
        for name, row in self.data.items():
            rows.append(f"{name:12} {row['cases']:6d} {row['failures']:8d}  {row.get('failure', '')[:300]}")
        return "\n".join(rows)

    @property
    def exit_code(self) -> int:
        return 1 if any(row["failures"] for row in self.data.values()) else 0


def run_fuzz(cfg, cases: int, targets: str = "", seed: int = 0) -> FuzzReport:
    """Fuzz what ringspec takes from outside with inputs drawn by hypothesis: per target, the cases run and the
    failures (the first, shrunk to a small input, is printed); exit 1 on any failure.

    targets (each holds: a precise error or a counted drop, never a crash, a hang or a traceback to the client):
      records  log bytes (csv, jsonl, plain; invalid UTF-8, NUL, 1 MB lines, control-token text) -> records
      config   TOML profiles, valid and junk -> a Config or a ConfigError naming the file
      gguf     the model's first MB truncated or with bytes flipped -> GGUFError naming the file
      http     request heads and bodies over a real socket to the real HTTP face and front
      zmq      msgpack and junk messages to the real zmq face
      site     hostile frames, wrong MACs and hostile array descriptions to the real site hub's two links
      http_smuggle  smuggled requests in unread bodies, conflicting lengths, slow tricklers, to the real HTTP face
      budget   hostile questions to the cited reader under a small budget -> bounded work, a cited answer or none
      site_flood  keyless and replaying peers flooding a real site hub -> its growth <= 64 MB, the group served
      archive  hostile lines into a real archive -> values, templates and the miner's work within their bounds
      journal  records, reopenings and planted kept files -> bounded 0600 files, the last checkpoint resumed
      patterns hostile lines and questions -> the patterns' work counted in steps, linear in their length
      zmq_flood   keyless, wrong-key, endless-message and unread peers at the real zmq face -> bounded, served
      http_flood  begun, oversized, keyless and kept-alive connections at the real HTTP face -> health and keys served"""
    chosen = [t.strip() for t in targets.split(",") if t.strip()] or list(TARGETS)
    unknown = set(chosen) - set(TARGETS)
    if unknown:
        raise ValueError(f"unknown fuzz targets {sorted(unknown)}; known: {', '.join(TARGETS)}")
    out = {}
    for name in chosen:
        t0 = time.monotonic()
        out[name] = _run(name, cfg, cases, seed)
        out[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"fuzz: {name}: {out[name]['cases']} cases, {out[name]['failures']} failures "
              f"({out[name]['seconds']} s)", file=sys.stderr, flush=True)
    return FuzzReport(out)


def _run(name: str, cfg, cases: int, seed: int) -> dict:
    try:                                                # the test extra: the engine runs without it
        from hypothesis import HealthCheck, given, seed as hseed, settings, strategies as st
    except ImportError:
        raise RuntimeError("fuzz draws its inputs with hypothesis: pip install -e '.[test]'") from None

    check, strategy, closing = globals()[f"_{name}"](cfg, st)
    count = [0]

    @hseed(seed)
    @settings(max_examples=cases, deadline=None, database=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def property_holds(case):
        count[0] += 1
        check(case)

    row = {"cases": 0, "failures": 0}
    try:
        property_holds()
    except Exception as exc:                             # noqa: BLE001 -- the shrunk failures are the figure
        found = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else [exc]
        row["failures"] = len(found)
        row["failure"] = " | ".join(f"{type(e).__name__}: {e} ({'; '.join(getattr(e, '__notes__', []))})"
                                    for e in found)
    finally:
        closing()
    row["cases"] = count[0]
    return row


# ---- records -------------------------------------------------------------------------------------------------------

def _records(cfg, st):
    limit = 4096
    tok = cfg.target.tokenizer
    control = set(tok.control_ids.tolist())
    text = st.text(alphabet=st.characters(codec="utf-8"), max_size=200) | st.sampled_from(CONTROL)
    junk = st.binary(max_size=400) | st.builds(lambda n, b: b * n, st.integers(1, 1 << 20), st.sampled_from(
        [b"x", b"\x00", b"\xff", b"\xc3", b","]))
    csv_row = st.lists(text, min_size=0, max_size=6).map(lambda cells: ",".join(cells).encode("utf-8", "replace"))
    json_row = st.dictionaries(st.text(max_size=10), st.one_of(st.none(), st.integers(), st.floats(), text),
                               max_size=5).map(lambda d: json.dumps(d).encode())
    lines = st.lists(st.one_of(junk, csv_row, json_row, text.map(str.encode)), max_size=12)
    header = st.sampled_from([b"timestamp,tag,type,description\n", b"", b"time,tag\n"])
    case = st.tuples(st.sampled_from(["csv", "jsonl", "plain"]), header, lines, st.booleans())

    def check(c):
        fmt, head, rows, trailing = c
        data = head + b"\n".join(rows) + (b"\n" if trailing else b"")
        source = Stream(io.BytesIO(data), max_line_bytes=limit)
        try:
            records = list(parse(fmt, iter(source)))
        except ValueError as exc:
            assert fmt == "csv" and "CSV header" in str(exc), f"unexpected ValueError: {exc}"
            return
        stats = source.stats
        for r in records:
            assert all(ch.isprintable() or ch == "\t" for ch in r.text), f"unprintable text {r.text[:80]!r}"
            assert len(r.text.encode()) <= 64 * 1024, f"a record of {len(r.text.encode())} bytes"
        rendered = render(records)
        assert rendered.count("\n") == len(records)
        assert not control & set(tok.encode(rendered, add_bos=False).tolist()), "log text became a control token"
        long_lines = sum(len(line) > limit for line in data.split(b"\n"))
        assert stats.oversized == long_lines, f"{long_lines} lines over {limit} bytes, {stats.oversized} counted"
        assert (b"\x00" in data) <= (stats.nul_bytes > 0 or stats.oversized > 0), "a NUL byte not counted"

    return check, case, lambda: None


# ---- config --------------------------------------------------------------------------------------------------------

def _config(cfg, st):
    tables = {name: cls for name, cls in get_type_hints(config.Config).items() if name not in ("source", "streams")}
    sections = st.sampled_from(sorted(tables) + ["nope"])
    value = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                      st.text(max_size=30), st.lists(st.integers(), max_size=3))
    keys = st.sampled_from(sorted({f.name for cls in tables.values() for f in fields(cls)}) + ["bogus"])
    table = st.dictionaries(keys, value, max_size=4)
    profile = st.dictionaries(sections, table, max_size=3)
    junk = st.text(max_size=300)
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    path = tmp / "profile.toml"

    def check(c):
        kind, body = c
        path.write_text(_toml(body) if kind == "toml" else body, errors="replace")
        try:
            config.load(path)
        except config.ConfigError as exc:
            assert str(path) in str(exc), f"a ConfigError that does not name the file: {exc}"

    return check, st.one_of(st.tuples(st.just("toml"), profile), st.tuples(st.just("junk"), junk)), \
        lambda: _rmtree(tmp)


def _toml(tables: dict) -> str:
    out = []
    for name, table in tables.items():
        out.append(f"[{name}]")
        for key, value in table.items():
            if value is None:
                continue
            out.append(f"{key} = {_toml_value(value)}")
    return "\n".join(out) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


# ---- gguf ----------------------------------------------------------------------------------------------------------

def _gguf(cfg, st):
    with open(cfg.target.gguf, "rb") as f:
        head = f.read(1 << 20)
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    path = tmp / "model.gguf"
    flips = st.lists(st.tuples(st.integers(0, len(head) - 1), st.integers(1, 255)), max_size=8)
    case = st.tuples(st.integers(0, len(head)), flips)

    def check(c):
        cut, flipped = c
        data = bytearray(head[:cut])
        for at, mask in flipped:
            if at < len(data):
                data[at] ^= mask
        path.write_bytes(bytes(data))
        try:
            GGUFModel(path)
        except GGUFError as exc:
            assert str(path) in str(exc), f"a GGUFError that does not name the file: {exc}"
            return
        raise AssertionError(f"{cut} bytes of a GGUF opened as a model")       # the first MB cannot hold it all

    return check, case, lambda: _rmtree(tmp)


# ---- http and zmq: the real faces and front, a stand-in owner ------------------------------------------------------

class _Owner:
    """Takes the front's questions from the real channel and answers each at once with one token (the owner's part
    of the protocol: AnswerDelta then Answer), so the front and its faces run as in `serve`."""

    def __init__(self, cfg, tok):
        spec = ChannelSpec(f"fuzz_asks_{time.monotonic_ns() % 10**9}", 64, cfg.serve.max_prompt_tokens * 4 + 4096)
        self.inbox = Channel.create(spec)
        self.front = Front(cfg, tok, [("", Channel.attach(spec.name), None)])
        self.reply = np.asarray(tok.encode(" ok"), np.int32)
        self.asked = 0                                   # questions the front took, counted in the handler's thread
        ask = self.front.ask

        def counted(*args, **kwargs):                    # before the handler answers or closes: no race with it
            answer = ask(*args, **kwargs)
            self.asked += 1
            return answer
        self.front.ask = counted
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="fuzz-owner")
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                received = self.inbox.recv(timeout=0.2)
            except TimeoutError:
                continue
            with received:
                msg = decode(received)
            if isinstance(msg, Question):
                self.front.on_event(AnswerDelta(id=msg.id, ids=self.reply))
                self.front.on_event(Answer(id=msg.id, prompt_tokens=len(msg.ids), finish="stop",
                                           completion_tokens=len(self.reply)))

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.inbox.close()
        self.inbox.unlink()                              # the segment's name too: a fuzz run leaves nothing in /dev/shm


def _front(cfg):
    serve = replace(cfg.serve, request_timeout_s=2.0, max_body_bytes=4096, deadline_s=10.0, retrieve=0,
                    api_key="fuzz-key-0001")
    cfg = replace(cfg, serve=serve)
    return cfg, _Owner(cfg, cfg.target.tokenizer)


def _http(cfg, st):
    cfg, owner = _front(cfg)
    limit = cfg.serve.max_body_bytes
    server = serve_http(owner.front, "127.0.0.1", 0, load_keys(cfg.serve.api_key, ""))
    port = server.server_address[1]
    stderr = io.StringIO()
    token = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
                    min_size=1, max_size=20)
    header_value = st.one_of(st.text(max_size=40), st.sampled_from(["-1", "0", "chunked", "Bearer fuzz-key-0001",
                                                                     "http://evil.example", "null"]))
    headers = st.lists(st.tuples(st.one_of(token, st.sampled_from(["Transfer-Encoding", "Host", "Origin",
                                                                   "Authorization", "Content-Type"])),
                                 header_value), max_size=4)
    content = st.one_of(st.text(min_size=1, max_size=60), st.sampled_from(CONTROL), st.integers(), st.none())
    message = st.fixed_dictionaries({"role": st.sampled_from(["user"] * 4 + ["assistant", "system", "x"]),
                                     "content": content})
    chat = st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=3)},
                                 optional={"max_tokens": st.one_of(st.integers(-5, 400), st.text(max_size=3)),
                                           "stream": st.booleans(),
                                           "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=3))),
                                           "deadline_s": st.one_of(st.floats(), st.integers(-1, 100)),
                                           "prompt": st.one_of(st.text(max_size=40), st.integers()),
                                           "pad": st.integers(0, 3 * limit).map(lambda n: "x" * n)})
    plain = st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.text(min_size=1, max_size=40)}), min_size=1, max_size=2)},
        optional={"stream": st.booleans(), "max_tokens": st.integers(1, 8)})     # a request the front takes
    body = st.one_of(plain, chat).map(lambda d: json.dumps(d).encode()) | st.binary(max_size=300)
    method = st.sampled_from(["POST"] * 4 + ["GET"] * 2 + ["PUT", "HEAD", "G\x00T"])
    path = st.one_of(st.sampled_from(["/v1/chat/completions", "/v1/completions"] * 3 +
                                     ["/", "/healthz", "/metrics", "/v1/models", "/v1/status"]),
                     st.text(max_size=60).map(lambda p: "/" + p.replace(" ", "%20")))
    length = st.sampled_from(["exact"] * 4 + LENGTHS)
    wild = st.tuples(method, path, length, headers, body, st.sampled_from([True, True, True, False]))
    prompt = st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=40)}, optional={"max_tokens": st.integers(
        1, 8)})
    api = st.one_of(st.tuples(st.just("/v1/chat/completions"), plain), st.tuples(st.just("/v1/completions"), prompt))
    harmless = st.lists(st.tuples(token, st.text(max_size=20)), max_size=2)
    api = st.tuples(st.just("POST"), api, st.sampled_from(LENGTHS), harmless).map(
        lambda c: (c[0], c[1][0], c[2], c[3], json.dumps(c[1][1]).encode(), True))    # its length the fuzzed part
    case = st.one_of(api, wild)

    def check(c):
        verb, target, how, extra, payload, with_key = c
        head = [f"{verb} {target} HTTP/1.1", "Host: 127.0.0.1"]
        if with_key:
            head.append("Authorization: Bearer fuzz-key-0001")
        exact = f"Content-Length: {len(payload)}"
        head += {"exact": [exact], "short": [f"Content-Length: {len(payload) + 10}"], "none": [],
                 "twice": [exact, exact]}.get(how, [f"Content-Length: {how}"])
        head += [f"{k}: {v}" for k, v in extra]
        raw = "\r\n".join(head).encode("utf-8", "replace") + b"\r\n\r\n" + payload
        before, asked = owner.front.counts["client_disconnects"], owner.asked
        with contextlib.redirect_stderr(stderr):
            reply = _exchange(port, raw, half_close=how != "exact")
        assert "Traceback" not in stderr.getvalue(), stderr.getvalue()[-2000:]
        if reply:
            assert reply.startswith(b"HTTP/1.1 ") and reply[9:12].isdigit(), f"not an HTTP answer: {reply[:200]!r}"
            status = int(reply[9:12])
            assert status != 500, reply[:300]
            head_of, _, body_of = reply.partition(b"\r\n\r\n")
            if status >= 400 and body_of and b"application/json" in head_of:
                assert b'"error"' in body_of, reply[:300]
        else:                                           # cut without an answer: only a silent client, counted
            assert owner.front.counts["client_disconnects"] > before, f"closed without an answer: {raw[:200]!r}"
        if owner.asked > asked:                         # what reached the front came with one honest length
            assert how == "exact" and len(payload) <= limit, f"{how} length, {len(payload)} bytes reached the front"
        assert owner.front.counts["internal_errors"] == 0, stderr.getvalue()[-2000:]
        health = _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200"), health[:200]

    def closing():
        server.shutdown()
        server.server_close()
        owner.close()

    return check, case, closing


def _exchange(port: int, raw: bytes, half_close: bool = False) -> bytes:
    """Send one request; read the response until it is complete or the server closes. A case with no byte back
    within CASE_TIMEOUT_S is a hang. `half_close` then says no more (SHUT_WR): a body shorter than its declared
    length, or one read "to the end", ends at once instead of at serve.request_timeout_s. The server takes a
    half-close as a hang-up, as nginx's proxy does (ngx_http_upstream_check_broken_connection: a peek that reads 0
    bytes is "client prematurely closed connection", status 499), so an honest request is sent without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=CASE_TIMEOUT_S) as s:
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        got, deadline = b"", time.monotonic() + CASE_TIMEOUT_S
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"no complete answer within {CASE_TIMEOUT_S:.0f} s to {raw[:120]!r}")
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return got
            except TimeoutError:
                raise AssertionError(f"no answer within {CASE_TIMEOUT_S:.0f} s to {raw[:120]!r}") from None
            if not chunk:
                return got
            got += chunk
            head, sep, rest = got.partition(b"\r\n\r\n")
            if not sep:
                continue
            lower = head.lower()
            if b"content-length:" in lower:
                n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                if len(rest) >= n:
                    return got
            elif b"transfer-encoding: chunked" in lower and rest.endswith(b"0\r\n\r\n"):
                return got


def _zmq(cfg, st):
    cfg, owner = _front(cfg)
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    endpoint = f"ipc://{tmp}/ask.sock"
    face = ZmqFront(owner.front, endpoint, load_keys(cfg.serve.api_key, ""))
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=40),
                       st.binary(max_size=20), st.sampled_from(CONTROL))
    request = st.fixed_dictionaries({}, optional={"question": st.one_of(st.text(max_size=80), scalar),
                                                  "key": st.sampled_from(["fuzz-key-0001", "wrong", ""]) | scalar,
                                                  "max_tokens": scalar, "deadline_s": scalar, "client": scalar})
    payload = st.one_of(request.map(msgpack.packb), st.binary(max_size=200),
                        st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) |
                                     st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
                        .map(lambda v: msgpack.packb(v)))
    sock = zmq_client(endpoint, cfg.serve.api_key)         # the key goes in the handshake; a "key" field is ignored

    def check(data):
        sock.send(data)
        while True:
            assert sock.poll(int(CASE_TIMEOUT_S * 1000)), f"no reply within {CASE_TIMEOUT_S:.0f} s to {data[:80]!r}"
            reply = msgpack.unpackb(sock.recv(), raw=False)
            if "delta" in reply:
                continue
            assert ("error" in reply and isinstance(reply.get("code"), int)) or reply.get("done"), reply
            return

    def closing():
        sock.close()
        face.close()
        owner.close()
        _rmtree(tmp)

    return check, payload, closing


# ---- site: the real hub's two links, a real group, strangers on both ----------------------------------------------

GROUP, START = "fuzz0", "fuzz0-s1"
NUMERIC = ["<i4", "<f4", "|u1", "<i8", ">f8", "<c16", "|b1"]
BAD_DTYPES = ["zz", "O", "V8", "<U4", "M8[s]", "m8[ns]", "S3", "f99", "object", 5, -1, [["a", "<i4"]], {"x": 1}, 1.5,
              True, None]
HUGE = [2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1, -1, -2, -2**31, "x", 1.5, None, [2]]


def _site(cfg, st):
    """Strangers write to a real SiteHub's PULL (a PUSH) and ROUTER (a DEALER with a random id) while a real group
    (NodeLink) is connected. A case is (link, frames). The strangers' sockets are past the links' handshake (its
    keys are derived from the run's: a keyless peer never gets a frame queued, which `site_flood` floods), so what
    they send reaches the MAC and the readers behind it. Messages under the run's key are built so that none can be
    valid (a key holder's bug, not a stranger's): each has an array that is not what it says, a header of the wrong
    shape, a bad envelope or a replayed counter; only the wrong-MAC messages may carry valid frames."""
    key = secrets.token_bytes(32)
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    hub = site_link.SiteHub(f"ipc://{tmp}/events", f"ipc://{tmp}/asks", key)
    link = site_link.NodeLink({**hub.endpoints, "key": key, "group": GROUP, "start": START})
    ctx = zmq.Context.instance()
    push, dealer = ctx.socket(zmq.PUSH), ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, secrets.token_hex(16).encode())
    for sock, endpoint in ((push, hub.endpoints["events"]), (dealer, hub.endpoints["asks"])):
        sock.setsockopt(zmq.LINGER, 0)
        site_link.secured(sock, key, server=False)
        sock.connect(endpoint)
    link.hello(START, {})
    got = _site_wait(lambda: hub.recv(0.05), "the group's hello")
    assert got.kind == "hello" and got.group == GROUP, got

    small = st.binary(max_size=24)
    name = st.sampled_from([b"event", b"hello", b"ask", b"record", GROUP.encode(), b"tep", b"", b"\xff\xfe"]) | small
    shape = st.lists(st.integers(0, 5), max_size=3)

    def array(dtype, dims, delta=0):
        n = int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize
        return [["a", dtype, dims], bytes(n + delta if n + delta >= 0 else n - delta)]

    valid = st.builds(array, st.sampled_from(NUMERIC), shape)
    lying = st.builds(array, st.sampled_from(NUMERIC), shape, st.integers(1, 9) | st.integers(-9, -1))
    odd = st.tuples(st.tuples(st.just("a"), st.sampled_from(BAD_DTYPES), shape).map(list), small).map(list)
    huge = st.tuples(st.tuples(st.just("a"), st.sampled_from(NUMERIC),
                               st.tuples(st.lists(st.integers(1, 8), max_size=2), st.sampled_from(HUGE))
                               .map(lambda t: t[0] + [t[1]])).map(list), small).map(list)
    entry = st.sampled_from([["a", "<i4"], "abc", 5, None, ["a", "<i4", [1], "x"]]).map(lambda e: [e, b""])
    hostile = st.sampled_from([0, 1, 1, 2, 2, 3]).flatmap(lambda i: (lying, odd, huge, entry)[i])
    packable = st.integers(-2**63, 2**64 - 1)                 # msgpack's integers
    header = st.dictionaries(st.text(max_size=5), st.one_of(st.none(), packable, st.text(max_size=5)), max_size=3)
    record = st.none() | st.dictionaries(st.text(max_size=5), packable, max_size=2)
    lead = st.tuples(name, st.sampled_from([GROUP.encode(), b"group0", b"\xff"]) | small, name)

    def body(lead, header, arrays, record, extra=0):
        descr = [a[0] for a in arrays]
        return [*lead, msgpack.packb([header, descr, record], use_bin_type=True),
                *(a[1] for a in arrays), *[b"x"] * extra]

    # under the run's key: one hostile array among valid ones, a header of the wrong shape, or frames miscounted
    arrays_bad = st.tuples(st.lists(valid, max_size=2), hostile, st.lists(valid, max_size=2)).map(
        lambda t: t[0] + [t[1]] + t[2])
    wrong_shape = st.sampled_from([b"\xc1", msgpack.packb([1, 2]), msgpack.packb([[], [], None]),
                                   msgpack.packb([{}, {}, None]), msgpack.packb([{}, [], 5]), msgpack.packb("x"),
                                   msgpack.packb([{}, [["a", "<i4", [1]]], None])]) | small.map(lambda b: b"\xc1" + b)
    bad_body = st.one_of(
        st.builds(body, lead, header, arrays_bad, record),
        st.builds(body, lead, header, st.lists(valid, min_size=1, max_size=2), record, st.integers(1, 3)),
        st.tuples(lead, wrong_shape).map(lambda t: [*t[0], t[1]]),
        st.tuples(st.sampled_from([b"\xff", b"\xc3("]), name, name, st.builds(body, lead, header, st.lists(
            valid, max_size=2), record)).map(lambda t: [t[0], t[1], t[2], *t[3][3:]]))         # kind not UTF-8
    envelope = st.tuples(st.text(max_size=10), st.integers(-2**63, 2**63 - 1), st.text(max_size=10),
                         st.integers(-2**63, 2**63 - 1)).map(list)        # [start, its order, DEALER id, counter]
    bad_envelope = st.sampled_from([["x", "y"], "str", [1, 2, 3], [START, "d", "1"], [START, "d", 1, 2], None,
                                    [START, "d", 1], [START, 0, "d", "1"], [START, 0.5, "d", 1], [START, 0, "d", 1, 2],
                                    [START, True, "d", 1]])
    keyed_arrays = st.tuples(envelope, st.builds(body, lead, header, arrays_bad, record)).map(
        lambda t: site_link.seal(key, site_link.UP, *t))                  # the likeliest to break a reader: drawn most
    keyed = st.one_of(
        st.tuples(envelope, bad_body),
        st.tuples(bad_envelope, st.builds(body, lead, header, st.lists(valid, max_size=2), record)),
        st.tuples(st.tuples(st.just(START), st.integers(0, 3), st.text(max_size=10), st.integers(-5, 0)).map(list),
                  # replayed: the live start's, an old counter
                  st.builds(body, st.just([b"event", GROUP.encode(), b"tep"]), header, st.lists(valid, max_size=2),
                            record))).map(lambda t: site_link.seal(key, site_link.UP, *t))
    other = secrets.token_bytes(32)
    good_body = st.builds(body, st.just([b"event", GROUP.encode(), b"tep"]) | lead, header,
                          st.lists(valid, max_size=2), record) | bad_body
    forged = st.tuples(st.sampled_from(["random", "other_key", "down", "truncated", "flipped"]), envelope,
                       good_body, st.integers(0, 63)).map(lambda t: _forge(key, other, *t))
    junk = st.lists(small, min_size=1, max_size=70)
    kinds = {"junk": junk, "forged": forged, "keyed": keyed, "keyed_arrays": keyed_arrays}
    drawn = st.sampled_from(["junk"] * 2 + ["forged"] * 3 + ["keyed"] * 3 + ["keyed_arrays"] * 4).flatmap(kinds.get)
    case = st.tuples(st.sampled_from(["pull", "pull", "pull", "router"]), drawn)
    n = [0]

    def check(c):
        where, frames = c
        n[0] += 1
        before = sum(hub.dropped.values())
        (push if where == "pull" else dealer).send_multipart(frames)
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while sum(hub.dropped.values()) == before:
            assert time.monotonic() < deadline, f"not counted within {CASE_TIMEOUT_S:.0f} s: {frames[:6]!r}"
            with warnings.catch_warnings():                      # numpy's overflow note on a huge shape: dropped
                warnings.simplefilter("ignore", RuntimeWarning)
                got = hub.recv(0.02)
            assert got is None, f"delivered to the front: {got!r} from {where} {frames[:6]!r}"
        assert sum(hub.dropped.values()) == before + 1, f"one message, {dict(hub.dropped)} (was {before} drops)"
        link.relay("tep", Cancel(id=f"up{n[0]}"))               # the real group's event still comes through ...
        got = _site_wait(lambda: hub.recv(0.02), "the group's event after a hostile message")
        assert got.group == GROUP and decode(got).id == f"up{n[0]}", got
        messages.send(hub.asks(GROUP, "tep"), Cancel(id=f"down{n[0]}"))    # ... and its question goes out
        taken = _site_wait(link.take, "the group's question after a hostile message")
        assert [decode(t).id for t in taken] == [f"down{n[0]}"] and not link.dropped, (taken, link.dropped)
        assert not dealer.poll(0), f"the stranger's DEALER got {dealer.recv_multipart()[:3]!r}"

    def closing():
        for sock in (push, dealer):
            sock.close()
        link.close()
        hub.close()
        _rmtree(tmp)

    return check, case, closing


def _forge(key: bytes, other: bytes, how: str, envelope: list, frames: list, at: int) -> list:
    """A message whose MAC is not the run's up the link: random, another key's, the run's key the other way, cut
    short, or right but over frames one of which was then changed."""
    body = [msgpack.packb(envelope), *frames]
    right = site_link.mac(key, site_link.UP, body)
    if how == "random":
        return [secrets.token_bytes(32), *body]
    if how == "other_key":
        return [site_link.mac(other, site_link.UP, body), *body]
    if how == "down":
        return [site_link.mac(key, site_link.DOWN, body), *body]
    if how == "truncated":
        return [right[:at % 32], *body]
    i = 1 + at % (len(body) - 1) if len(body) > 1 else 0
    changed = bytearray(body[i]) + b"\x00" if not body[i] else bytearray(body[i])
    changed[0] ^= 1
    body[i] = bytes(changed)
    return [right, *body]


def _site_wait(get, what: str):
    deadline = time.monotonic() + CASE_TIMEOUT_S
    while time.monotonic() < deadline:
        got = get()
        if got:
            return got
    raise AssertionError(f"{what}: nothing within {CASE_TIMEOUT_S:.0f} s")


FLOOD_GROWTH_MB = 64                        # issue 55's bound on any process's growth under a flood of a link


def _site_flood(cfg, st):
    """One child hosting a real SiteHub and a real group (bench/flood.py Host), flooded once per case: (how, peers,
    twentieths of a second). The child's growth is its peak resident size over its size before the first flood, so
    it accumulates over the cases."""
    host = Host()
    case = st.tuples(st.sampled_from(["messages", "multipart", "replay"]), st.integers(1, 4), st.integers(1, 4))
    seen = [{}]                                             # the child's drops after the case before

    def check(c):
        how, peers, twentieths = c
        before = seen[0]
        got = host.flood(how, twentieths / 20, peers)
        seen[0] = got["dropped"]
        assert got["served"], f"the group was not served after {got}"
        assert got["growth_mb"] <= FLOOD_GROWTH_MB, f"the hub's process grew {got['growth_mb']} MB: {got}"
        refused = {k for k, v in got["dropped"].items() if v != before.get(k, 0)}    # (a replay's tail may land late)
        assert refused <= {"refused: handshake", "stale_start", "replayed"}, f"a keyless peer got past: {got}"
        assert how != "replay" or refused & {"stale_start", "replayed"}, f"replays not refused: {got}"

    return check, case, host.close


# ---- http_smuggle: requests hidden in bodies, lengths that disagree, clients that trickle -------------------------

SMUGGLED = [b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer fuzz-key-0001\r\n\r\n",
            (b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer fuzz-key-0001\r\n'
             b'Content-Length: 15\r\n\r\n{"prompt": "0"}')]
KEY = "Authorization: Bearer fuzz-key-0001"
UNREAD = [("GET", "/healthz", []), ("GET", "/v1/models", [KEY]), ("GET", "/v1/status", [KEY]),
          ("GET", "/nowhere", [KEY]), ("POST", "/nowhere", [KEY]), ("POST", "/v1/chat/completions", []),
          ("POST", "/v1/completions", ["Authorization: Bearer wrong"]), ("POST", "/healthz", [KEY]),
          ("GET", "/v1/chat/completions", [KEY]), ("POST", "/v1/models", [])]
FRAMINGS = ["te", "te_cl", "cl_te", "cl_twice_same", "cl_twice_other", "cl_comma", "cl_plus", "te_obscured",
            "te_identity", "te_folded"]


def _http_smuggle(cfg, st):
    cfg, owner = _front(cfg)
    owner.front.serve = replace(owner.front.serve, request_timeout_s=0.5)     # each trickler costs this much
    server = serve_http(owner.front, "127.0.0.1", 0, load_keys(cfg.serve.api_key, ""))
    port = server.server_address[1]
    wait_s = owner.front.serve.request_timeout_s
    stderr = io.StringIO()
    smuggled = st.tuples(st.sampled_from(["", "\r\n", "\r\n\r\n"]), st.sampled_from(SMUGGLED)).map(
        lambda t: t[0].encode() + t[1])
    unread = st.tuples(st.just("unread"), st.sampled_from(UNREAD), smuggled)
    framed = st.tuples(st.just("framing"), st.sampled_from(FRAMINGS), smuggled)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + KEY.encode() +
            b"\r\nContent-Length: 15\r\n\r\n{\"prompt\": \"0\"}")
    slow = [head, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n"]
    trickle = st.tuples(st.just("trickle"), st.sampled_from(slow), st.sampled_from([0.15, 0.3]))
    kinds = st.sampled_from(["unread"] * 15 + ["framing"] * 15 + ["trickle"])
    case = kinds.flatmap(lambda k: {"unread": unread, "framing": framed, "trickle": trickle}[k])

    def check(c):
        kind = c[0]
        errors_before = owner.front.counts["internal_errors"]
        with contextlib.redirect_stderr(stderr):
            if kind == "trickle":
                _trickled(port, c[1], c[2], wait_s, owner.front)
            else:
                raw = _smuggling(*c[1:]) if kind == "unread" else _conflicting(*c[1:])
                replies = _answers(_read_all(port, raw, wait_s + CASE_TIMEOUT_S))
                statuses = [r[9:12] for r in replies]
                assert len(replies) == 1, f"{len(replies)} answers {statuses} on one connection to {raw[:300]!r}"
                assert b"500" not in statuses, replies[0][:300]
                if kind == "framing":
                    assert replies[0][9:10] == b"4", f"conflicting framing answered {replies[0][:200]!r}"
        assert "Traceback" not in stderr.getvalue(), stderr.getvalue()[-2000:]
        assert owner.front.counts["internal_errors"] == errors_before, stderr.getvalue()[-2000:]
        fresh = _read_all(port, b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' + KEY.encode() +
                          b'\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{"prompt": "0"}', CASE_TIMEOUT_S)
        assert fresh.startswith(b"HTTP/1.1 200"), f"a fresh, honest request after it: {fresh[:300]!r}"

    def closing():
        server.shutdown()
        server.server_close()
        owner.close()

    return check, case, closing


def _smuggling(first: tuple, hidden: bytes) -> bytes:
    """A request the server answers without reading its body (a GET's, or one refused before `_body`), the body
    being a second request: answered, it was smuggled."""
    verb, path, headers = first
    return "\r\n".join([f"{verb} {path} HTTP/1.1", "Host: 127.0.0.1", *headers,
                        f"Content-Length: {len(hidden)}"]).encode() + b"\r\n\r\n" + hidden


def _conflicting(framing: str, hidden: bytes) -> bytes:
    """A keyed POST whose body's end two parsers could disagree on: the request after it is smuggled to one of them."""
    payload = b'{"prompt": "0"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    n, whole = len(payload), len(chunked) + len(hidden)
    heads = {"te": ["Transfer-Encoding: chunked"],
             "te_cl": ["Transfer-Encoding: chunked", f"Content-Length: {whole}"],
             "cl_te": [f"Content-Length: {n}", "Transfer-Encoding: chunked"],
             "cl_twice_same": [f"Content-Length: {whole}", f"Content-Length: {whole}"],
             "cl_twice_other": [f"Content-Length: {n}", f"Content-Length: {whole}"],
             "cl_comma": [f"Content-Length: {n}, {whole}"],
             "cl_plus": [f"Content-Length: +{n}"],
             "te_obscured": ["Transfer-Encoding: xchunked", f"Content-Length: {n}"],
             "te_identity": ["Transfer-Encoding: identity", f"Content-Length: {n}"],
             "te_folded": ["Transfer-Encoding:\tchunked", f"Content-Length: {n}"]}[framing]
    body = (payload if framing in ("cl_plus", "cl_twice_other", "cl_comma") else chunked) + hidden
    return "\r\n".join(["POST /v1/completions HTTP/1.1", "Host: 127.0.0.1", KEY, *heads]).encode() + \
        b"\r\n\r\n" + body


def _trickled(port: int, raw: bytes, every_s: float, wait_s: float, front) -> None:
    """One byte every `every_s` s, a request that cannot arrive whole within `wait_s`: the server must cut it by
    then (with slack for a loaded host), count it, and answer nothing but perhaps a 4xx."""
    before = front.counts["client_disconnects"]
    with socket.create_connection(("127.0.0.1", port), timeout=CASE_TIMEOUT_S) as s:
        t0, got, sent = time.monotonic(), b"", 0
        s.setblocking(False)
        while time.monotonic() - t0 < wait_s + 5.0:
            if sent < len(raw):
                try:
                    s.send(raw[sent:sent + 1])
                    sent += 1
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    break
            time.sleep(every_s)
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        took = time.monotonic() - t0
    assert took < wait_s + 5.0, f"a client trickling a byte every {every_s} s held its connection {took:.1f} s"
    assert sent < len(raw), f"all {len(raw)} bytes went through at one every {every_s} s: no deadline"
    assert not got or got[9:10] == b"4", f"a trickled request answered {got[:200]!r}"
    assert front.counts["client_disconnects"] > before, "a trickling client cut without being counted"


def _read_all(port: int, raw: bytes, within_s: float) -> bytes:
    """Everything the server sends on one connection until it closes it (or stays silent `within_s`)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=within_s) as s:
        try:
            s.sendall(raw)
        except OSError:
            pass
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                return got
            if not chunk:
                return got
            got += chunk


def _answers(data: bytes) -> list[bytes]:
    """The HTTP responses in one connection's bytes, each cut at its Content-Length."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 ") and sep, f"not an HTTP answer: {data[:200]!r}"
        lower = head.lower()
        n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in lower else len(rest)
        out.append(head + sep + rest[:n])
        data = rest[n:]
    return out


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- budget --------------------------------------------------------------------------------------------------------

def _budget(cfg, st):
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    path = tmp / "archive.sqlite"
    build_archive(path, 3000)                               # the archive bench/question_budget.py asks
    max_lines, max_steps = 200, 200 * STEPS
    vocabulary = ["connecting", "connect", "worker-3", "timeout", "closed", "session", "port", "ports", "users",
                  "10.0.3.4", "10.0.3.4:1025", "blk_7919", "INFO", "WARN", "bytes", "ms", "sent", "as", "to", "a",
                  "zebrafish", "HH", "LL", "NR", '"', "*", "NEAR", "AND", "OR", "NOT", "(", ")", "^", ":", "-", "'"]
    forms = ["how many lines say", "how many times did", "which port is used most often", "which ports did",
             "when was the first", "when did the last", "which", "what is the most frequent", "count", "how often",
             "which users", "what port did", "when did", "number of"]
    word = st.sampled_from(vocabulary) | st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12)
    words = st.lists(word, max_size=60).map(" ".join)
    question = st.one_of(st.text(max_size=300), st.tuples(st.sampled_from(forms), words, st.sampled_from(
        ["?", "", " ?", "??"])).map("".join), st.tuples(st.sampled_from(forms), words).map(" ".join))

    def check(q):
        budget = Budget(60.0, max_lines, max_steps=max_steps)
        reply = cited_read(str(path), q, budget=budget, spans=len(q) % 2 == 1)    # the spans reader: every other
        assert reply is None or isinstance(reply, (CitedReply, CitedChoice)), f"a {type(reply).__name__}"
        assert budget.examined <= max_lines, f"{budget.examined} lines read, over {max_lines}"
        assert budget.steps <= max_steps + (1 + 2 * MIN_WEIGHED) * STEPS, f"{budget.steps} steps, over {max_steps}"
        if isinstance(reply, CitedReply) and reply.answer is not None:
            texts = [c.text for c in reply.citations]
            assert texts, f"an answer without a citation: {reply.answer!r}"
            counted = reply.answer.removeprefix("at least ").isdigit()
            assert counted or all(any(part in t for t in texts) for part in reply.answer.split(", ")), \
                f"an answer that is no span of a line it cites: {reply.answer!r}"

    return check, question, lambda: _rmtree(tmp)


# ---- archive and journal: bounded files ----------------------------------------------------------------------------

def _archive(cfg, st):
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
    header = st.sampled_from(["#Fields: ", "#fields\t", "#Version: 1.0", "#separator \\x09", "#Software: x", "#"])
    line = st.one_of(
        st.text(max_size=300),
        st.lists(word, min_size=1, max_size=40).map(lambda ws: "evt " + " ".join(ws)),
        st.tuples(st.sampled_from(["1 ", "a1 ", "x=1 ", "1,", "10.0.0.1:80 "]), st.integers(1, 2048)).map(
            lambda p: (p[0] * p[1])[:4096]),
        st.tuples(header, st.lists(word, max_size=30)).map(lambda p: p[0] + ("\t" if "\t" in p[0] else " ").join(p[1])))
    n = [0]

    def check(lines):
        n[0] += 1
        with Archive(tmp / f"a{n[0]}.sqlite", max_lines=20, flush_every=4, max_values=16, max_templates=8) as a:
            for i, text in enumerate(lines):
                before = a.miner.compared
                a.add(i, "", text)
                assert a.miner.compared - before <= COMPARED + 1, f"{a.miner.compared - before} templates compared"
                assert len(a.miner.templates) <= 8, f"the miner holds {len(a.miner.templates)} templates"
            a.flush()
            per_line = [c for (c,) in a.con.execute("SELECT count(*) FROM vals GROUP BY seq")]
            assert max(per_line, default=0) <= 16, f"a line stored {max(per_line)} values"
            rows = {t for (t,) in a.con.execute("SELECT id FROM templates")}
            used = {t for (t,) in a.con.execute("SELECT template FROM line_templates")}
            assert rows == used, f"template rows {sorted(rows - used)} without a line, {sorted(used - rows)} missing"
            assert set(a.miner.templates) <= rows, "the miner holds a template whose lines are gone"
        (tmp / f"a{n[0]}.sqlite").unlink()

    return check, st.lists(line, max_size=60), lambda: _rmtree(tmp)


def _journal(cfg, st):
    tmp = Path(tempfile.mkdtemp(prefix="ringspec_fuzz_"))
    op = st.one_of(st.tuples(st.just("answer"), st.integers(0, 3000)), st.tuples(st.just("checkpoint"), st.just(0)),
                   st.tuples(st.just("reopen"), st.integers(1, 4)),
                   st.tuples(st.sampled_from(["other", "symlink", "dir"]), st.integers(1, 4)))
    n = [0]

    def check(ops):
        n[0] += 1
        folder = tmp / str(n[0])
        folder.mkdir()
        path, max_bytes = str(folder / "j.jsonl"), 1000
        j, offset, planted, biggest = Journal(path, max_bytes, 3), 0, {}, 0
        try:
            for kind, arg in ops:
                if kind == "answer":
                    rec = {"kind": "answer", "id": "q", "text": "x" * arg}
                elif kind == "checkpoint":
                    offset += 1
                    rec = {"kind": "checkpoint", "source": "/s", "offset": offset, "loop": 0, "seq": offset,
                           "offsets": [offset], "position": 0, "window_offset": 0, "window_loop": 0,
                           "window_seq": 0, "lines": offset, "since": 0}
                elif kind == "reopen":
                    j.close()
                    j = Journal(path, max_bytes, arg)
                    continue
                else:
                    at = Path(f"{path}.{arg}")
                    if at.is_symlink() or at.exists():
                        continue
                    if kind == "symlink":
                        at.symlink_to(folder / "elsewhere")
                    elif kind == "dir":
                        at.mkdir()
                    else:
                        at.write_text('{"kind": "answer", "text": "planted"}\n')
                        if os.geteuid() == 0:
                            os.chown(at, 4321, 4321)
                    planted[str(at)] = kind
                    continue
                biggest = max(biggest, len(json.dumps(rec)) + 1)
                j.append(rec)
        finally:
            j.close()
        carried = 600                                    # the checkpoint a new F starts with, at most
        for each in journal.files(path):
            assert each not in planted, f"{each} was planted, yet it is read"
            size, mode = os.path.getsize(each), os.stat(each).st_mode & 0o777
            assert size <= max_bytes + biggest + carried, f"{each}: {size} bytes"
            assert mode == 0o600, f"{each}: mode {oct(mode)}"
        assert all("planted" not in str(r.get("text")) for r in journal.history(path)), "a planted record read"
        for at, kind in planted.items():
            p = Path(at)
            assert {"symlink": p.is_symlink, "dir": p.is_dir, "other": p.is_file}[kind](), f"{at} changed"
        point = resume_point(path, "/s")
        assert (point.offset if point else 0) == offset, f"resumed at {point and point.offset}, not {offset}"
        _rmtree(folder)

    return check, st.lists(op, max_size=40), lambda: _rmtree(tmp)


# ---- patterns ------------------------------------------------------------------------------------------------------

PATTERN_CHARS = "aZh1 9.:/-_+@=\"'#\\,;()[]?xB\u00e9\t"   # letters, digits and the punctuation the patterns name


def _patterns(cfg, st):
    asked = router.route("which port did gw7 use?")
    unit = st.text(alphabet=st.sampled_from(PATTERN_CHARS), min_size=1, max_size=8)
    case = st.tuples(st.sampled_from(["line", "question"]), unit, st.text(alphabet=st.sampled_from(PATTERN_CHARS),
                                                                            max_size=4))

    def work(kind: str, text: str) -> int:
        with regex_steps.counting(router, line_values, per_char=200) as tally:
            router.route(text) if kind == "question" else line_values.values_of(text)
        return tally.steps

    def check(c):
        kind, piece, tail = c
        steps = {}
        for n in (256, 512):
            text = (piece * (n // len(piece) + 1))[:n - len(tail)] + tail
            try:
                steps[n] = work(kind, text)
                if kind == "line" and n == 512:          # each span's fit reads at most _NEAR characters before it
                    found = line_values.values_of(text)
                    with regex_steps.counting(cited_reader, per_char=200) as fits:
                        for v in found:
                            cited_reader._fit(asked, text[:v.start], v.text, text[v.end:])
                    bound = 12 * cited_reader._NEAR * len(found) + 8 * n
                    assert fits.steps <= bound, f"{len(found)} spans' fits took {fits.steps} steps, over {bound}"
            except regex_steps.TooManySteps as exc:
                raise AssertionError(f"a {kind} of {n} characters ({piece!r} repeated, then {tail!r}): one pattern "
                                     f"call {exc}, past 200 a character") from None
        assert steps[512] <= 2.5 * steps[256] or steps[512] <= 40 * 512, \
            f"a {kind} ({piece!r} repeated, then {tail!r}): {steps[256]} steps at 256 characters, {steps[512]} at 512"

    return check, case, lambda: None


# ---- zmq_flood, http_flood: many clients at the operators' faces, a stand-in owner ----------------------------------

FACE_GROWTH_MB = 64                        # the bound on a process's growth under a flood


def _zmq_flood(cfg, st):
    """Floods of the real zmq face (keys, 4 peers, 4 workers) by peers in this process, each case for a drawn
    while: keyless DEALERs, wrong keys, raw ZMTP peers sending one endless message (bench/flood.py), key holders
    never reading their replies or sending junk. Meanwhile a key holder's question gets a reply; after, it is
    answered; the peers' table stays within its cap and this process's growth within FACE_GROWTH_MB."""
    cfg, owner = _front(replace(cfg, serve=replace(cfg.serve, max_zmq_peers=4, max_waiting=4)))
    key = cfg.serve.api_key
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    face = ZmqFront(owner.front, endpoint, load_keys(key, ""))
    base = proc_status()["vmrss_mb"]
    kinds = ["keyless", "wrong_key", "zmtp", "unread", "junk"]
    case = st.tuples(st.sampled_from(kinds), st.integers(1, 12), st.integers(1, owner.front.serve.max_body_bytes),
                     st.sampled_from([0.05, 0.1, 0.3]))

    def check(c):
        kind, peers, size, seconds = c
        until = time.monotonic() + seconds
        socks, threads, sent = [], [], [0]
        if kind == "zmtp":
            threads = [threading.Thread(target=_zmtp_peer, args=(b"DEALER", endpoint, until, sent), daemon=True)
                       for _ in range(peers)]
            for t in threads:
                t.start()
        else:
            for _ in range(peers):
                sock = zmq_client(endpoint, {"keyless": None, "wrong_key": "wrong-key-0001"}.get(kind, key))
                sock.setsockopt(zmq.SNDHWM, 2)               # the flooders' own queues: this process stays small
                socks.append(sock)
        message = msgpack.packb({"question": "x" * max(1, size - 20)}) if kind == "unread" else \
            secrets.token_bytes(size)
        probe = zmq_client(endpoint, key)
        probe.send(msgpack.packb({"question": "hi", "max_tokens": 2}))
        heard = None
        while time.monotonic() < until or heard is None:
            for sock in socks:
                with contextlib.suppress(zmq.Again):
                    sock.send(message, zmq.NOBLOCK)
            if heard is None and probe.poll(0):
                heard = _zmq_final(probe)
            if heard is None and time.monotonic() > until + CASE_TIMEOUT_S:
                raise AssertionError(f"{kind} x {peers}: a key holder's question got no reply during the flood")
            time.sleep(0.001)
        for t in threads:
            t.join()
        for sock in socks:
            sock.close()
        probe.close()
        assert "error" in heard and isinstance(heard.get("code"), int) or heard.get("done"), heard
        assert len(face.peers) <= face.peers.cap, f"{len(face.peers)} peers held, cap {face.peers.cap}"
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while True:                                           # flooders gone: a question is answered again
            after = zmq_client(endpoint, key)
            after.send(msgpack.packb({"question": "hi", "max_tokens": 2}))
            assert after.poll(int(CASE_TIMEOUT_S * 1000)), f"{kind}: no reply after the flood"
            got = _zmq_final(after)
            after.close()
            if got.get("done"):
                break
            assert got.get("code") in (429, 503) and time.monotonic() < deadline, got
            time.sleep(0.05)
        assert owner.front.counts["internal_errors"] == 0
        grown = proc_status()["vmrss_mb"] - base
        assert grown <= FACE_GROWTH_MB, f"{kind} x {peers} ({size} B): this process grew {grown:.0f} MB"

    def closing():
        face.close()
        owner.close()

    return check, case, closing


def _zmq_final(sock) -> dict:
    """The final reply to the one question asked on `sock` (its deltas skipped)."""
    while True:
        assert sock.poll(int(CASE_TIMEOUT_S * 1000)), "no final reply"
        reply = msgpack.unpackb(sock.recv(), raw=False)
        if "delta" not in reply:
            return reply


def _http_flood(cfg, st):
    """Floods of the real HTTP face (keys, max_connections 8, 4 unkeyed per address, 1 KiB heads) by sockets from
    one to four loopback addresses, held while a key holder's request and /healthz are sent: requests begun and never
    finished, heads past serve.max_head_bytes that never end, keyless requests kept alive, key holders' connections
    kept alive. Then /healthz is 200 and the key holder's request 200 (503 server_busy only when key holders hold
    every keyed place), a head past the bound got 431 or was cut, no 500, and this process grew within
    FACE_GROWTH_MB."""
    cfg, owner = _front(replace(cfg, serve=replace(cfg.serve, max_connections=8, max_connections_per_peer=4,
                                                    max_head_bytes=1024)))
    server = serve_http(owner.front, "127.0.0.1", 0, load_keys(cfg.serve.api_key, ""))
    port = server.server_address[1]
    keyed = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {cfg.serve.api_key}\r\n".encode()
    health = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    sends = {"begun": b"GET /heal", "long_head": b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 3000 + b"\r\n",
             "keyless": b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "keyed": keyed + b"\r\n"}
    base = proc_status()["vmrss_mb"]
    case = st.tuples(st.sampled_from(sorted(sends)), st.integers(1, 24), st.integers(1, 4))
    stderr = io.StringIO()

    def check(c):
        kind, n, addresses = c
        held = []
        with contextlib.redirect_stderr(stderr):
            try:
                for i in range(n):
                    s = socket.create_connection(("127.0.0.1", port), timeout=CASE_TIMEOUT_S,
                                                 source_address=(f"127.0.0.{1 + i % addresses}", 0))
                    held.append(s)
                    with contextlib.suppress(OSError):
                        s.sendall(sends[kind])
                    if kind == "keyed":
                        with contextlib.suppress(OSError):
                            s.recv(65536)                        # its answer (or its 503): then held, keep-alive
                got = _exchange(port, health)
                assert got.startswith(b"HTTP/1.1 200"), f"{kind} x {n}: /healthz got {got[:120]!r}"
                got = _exchange(port, keyed + b"Connection: close\r\n\r\n")
                full = kind == "keyed" and n >= owner.front.serve.max_connections
                assert got.startswith(b"HTTP/1.1 200") or full and got.startswith(b"HTTP/1.1 503"), \
                    f"{kind} x {n} from {addresses} addresses: a key holder got {got[:160]!r}"
                if kind == "long_head":
                    answered = [_read_all_held(s) for s in held[-1:]]
                    assert all(a == b"" or a.startswith(b"HTTP/1.1 431") for a in answered), answered
            finally:
                for s in held:
                    s.close()
        assert "Traceback" not in stderr.getvalue(), stderr.getvalue()[-2000:]
        assert owner.front.counts["internal_errors"] == 0
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while not _exchange(port, keyed + b"Connection: close\r\n\r\n").startswith(b"HTTP/1.1 200"):
            assert time.monotonic() < deadline, f"{kind}: the keyed places were not given back"
            time.sleep(0.05)
        grown = proc_status()["vmrss_mb"] - base
        assert grown <= FACE_GROWTH_MB, f"{kind} x {n}: this process grew {grown:.0f} MB"

    def closing():
        server.shutdown()
        server.server_close()
        owner.close()

    return check, case, closing


def _read_all_held(s: socket.socket) -> bytes:
    """What the server sent on a held socket until it closed it (silent CASE_TIMEOUT_S: TimeoutError, a hang)."""
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk

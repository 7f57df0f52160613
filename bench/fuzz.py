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
    zmq       msgpack and junk messages to the real zmq face -> an error reply with a code, or an answer
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import get_type_hints

import msgpack
import numpy as np
import zmq

from models.gguf import GGUFError, GGUFModel
from models.registry import resolve_gguf
from models.tokenizer import Tokenizer
from pipeline import config
from pipeline.channel import Channel, ChannelSpec
from pipeline.messages import Answer, AnswerDelta, Question, decode
from pipeline.report import Report
from pipeline.serve.auth import load_keys
from pipeline.serve.front import Front
from pipeline.serve.http_api import serve_http
from pipeline.serve.zmq_api import ZmqFront
from pipeline.stream.records import render
from pipeline.stream.sources import Stream, parse

TARGETS = ("records", "config", "gguf", "http", "zmq")
CONTROL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "\x00", "\x1b[2J", "\u202e")
CASE_TIMEOUT_S = 30.0                      # a case with no answer by then is a hang
LENGTHS = ["exact", "short", "none", "twice", "-1", "+5", "1e3", " 12", "0x10", "\u0663", "99999999999"]


@dataclass
class FuzzReport(Report):
    def text(self) -> str:
        rows = [f"{'target':8} {'cases':>6} {'failures':>8}  first failure (shrunk)"]
        for name, row in self.data.items():
            rows.append(f"{name:8} {row['cases']:6d} {row['failures']:8d}  {row.get('failure', '')[:300]}")
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
      zmq      msgpack and junk messages to the real zmq face"""
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
    tok = Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf))
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
    with open(resolve_gguf(cfg.model.gguf), "rb") as f:
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
    return cfg, _Owner(cfg, Tokenizer.from_gguf(resolve_gguf(cfg.model.gguf)))


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
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)

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


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

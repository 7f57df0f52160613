"""`bench --task operator`: what an operator waits for while the stream flows, measured against a real server.

Owns the measurement: it starts `run.py serve` (the real pipeline) replaying a TEP log at a fixed line rate, asks
30-token questions over HTTP with streaming on, one after another, and times each from the request to the first
content delta (TTFT) and to the last (answer tokens/s); then, at a ladder of line rates with a question every few
seconds, whether ingestion keeps up (lines reaching the ring against lines offered, and the backlog at the end).
Never reaches into the server: everything comes from its HTTP answers and /metrics. `run_operator_bench` is `bench
--task operator`: progress on stderr, the tables in `OperatorReport`.
"""
from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.chaos import free_port
from pipeline.config import replay_log
from pipeline.report import Report
from pipeline.stream.records import read_log
from pipeline.watch import wait_for

ROOT = Path(__file__).resolve().parents[1]
WARM_LINES = 150     # about three windows of TEP lines: the archive holds older lines to retrieve
# the model answers every timed question: the cited reader (the default) answers these lookups from the archive in
# ~10 ms with no model call, which is `bench --task answers`' to measure, not this bench's
MODEL_ANSWERS = {"reader": "free"}
QUESTIONS = [        # about 30 tokens each with SmolLM2's tokenizer
    "When did the alarm on {tag} last go {level}, and what does that alarm mean for the reactor and the purge?",
    "Was {tag} in a {level} alarm recently? Tell me the time of the last one and whether it has recovered since.",
    "Which alarms fired around the last {level} alarm of {tag}, and is the plant heading towards a trip now?",
]


def _without_serve(text: str) -> str:
    """A profile's text without its [serve] table (from its header to the next table's)."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("["):
            inside = line.strip() == "[serve]"
        if not inside:
            out.append(line)
    return "".join(out)


class Refused(RuntimeError):
    """The server answered a question with an HTTP error status (the message holds the status and the body)."""


class _Server:
    """`run.py serve` on a free port, replaying `log` at `rate` lines per second over and over."""

    def __init__(self, log: str, rate: float, retrieve: int, config: str | None, workdir: str,
                 warm_lines: int = 20, loop: bool = True, serve: dict | None = None, args: tuple = ()):
        """warm_lines: lines the ring must have taken before measuring (enough that older lines are archived);
        loop: replay the log over and over (else once, from its first line); serve: more [serve] keys (TOML
        literals by value); args: more `run.py serve` flags."""
        self.port = free_port()
        profile = Path(workdir) / f"bench_{rate:g}_{retrieve}.toml"
        base = Path(config).read_text() if config else ""
        own = tomllib.loads(base).get("serve", {})        # the profile's [serve] keys stay, under the bench's own
        base = _without_serve(base)
        keys = {**own, "retrieve": retrieve, "max_waiting": 64, **(serve or {})}
        profile.write_text(base + "\n[serve]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items()))
        self.log = Path(workdir) / f"serve_{rate:g}_{retrieve}.log"
        self.archive = Path(workdir) / f"archive_{rate:g}_{retrieve}.sqlite"
        with open(self.log, "w") as log_file:
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "serve", log, *(["--loop"] if loop
                                          else []), "--rate",
                                          str(rate), "--config", str(profile), "--http", f"127.0.0.1:{self.port}",
                                          "--zmq", "", "--pub", "", "--quiet-lines",
                                          "--archive", str(self.archive), *args],
                                         stdout=subprocess.DEVNULL, stderr=log_file, text=True)
        try:                 # waits while the server works (a loaded host only slows it); fails if it exits or stalls
            wait_for(lambda: (self._lines() or 0) >= warm_lines, "the server coming up", pids=[self.proc.pid],
                     progress=lambda: (self.log.stat().st_size, self._lines()))
        except TimeoutError as e:
            raise RuntimeError(f"{e}: {self.log.read_text()[-2000:]}") from None
        self.t_start = time.monotonic()
        self.lines_at_start = self.health()["lines"]

    def _lines(self) -> int | None:
        try:
            return self.health()["lines"]
        except (OSError, ValueError):
            return None

    def health(self) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/healthz")
        return json.loads(conn.getresponse().read())

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()

    def ask(self, question: str, max_tokens: int) -> dict:
        """One streamed chat answer, timed from the request to the first and the last content delta."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        body = json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                           "stream": True})
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise Refused(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        first = last = None
        final, text = {}, []
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                last = time.perf_counter()
                first = first or last
                text.append(chunk["choices"][0]["delta"]["content"])
            if "usage" in chunk or "error" in chunk:
                final = chunk
        tokens = final.get("usage", {}).get("completion_tokens", 0)
        meta = final.get("ringspec", {})
        return {"ttft_ms": (first - t0) * 1e3 if first else None,
                "tokens_per_s": (tokens - 1) / (last - first) if first and last and last > first else 0.0,
                "completion_tokens": tokens, "prompt_tokens": final.get("usage", {}).get("prompt_tokens", 0),
                "queued_ms": meta.get("queued_ms"), "retrieved": len(meta.get("citations", [])),
                "frame_ms": meta.get("frame_ms"), "prefill_ms": meta.get("prefill_ms"),
                "server_ttft_ms": meta.get("ttft_ms"), "total_ms": (time.perf_counter() - t0) * 1e3,
                "text": "".join(text), "final": final}

    def close(self, at_once: bool = False) -> None:
        """SIGINT: the pipeline drains what was read; at_once: a second SIGINT, so it stops without draining."""
        self.proc.send_signal(2)
        if at_once:
            time.sleep(0.5)
            self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def questions(log: str, n: int) -> list[str]:
    """n questions about tags of the log, 30 tokens or so each, deterministic."""
    tags = sorted({r.tags[0] for r in read_log(log, "csv") if r.tags})
    levels = ["HIGH", "LOW", "HIGH HIGH"]
    return [QUESTIONS[i % len(QUESTIONS)].format(tag=tags[(7 * i) % len(tags)], level=levels[i % len(levels)])
            for i in range(n)]


def latency(log: str, rate: float, n: int, max_tokens: int, retrieve: int, config=None, progress=None,
            warm_lines: int = WARM_LINES) -> dict:
    """TTFT and answer speed of n questions asked one after another while the stream replays at `rate`."""
    with tempfile.TemporaryDirectory(prefix="ringspec_opbench_") as tmp:
        server = _Server(log, rate, retrieve, config, tmp, warm_lines=warm_lines, serve=MODEL_ANSWERS)
        try:
            rows = []
            for i, q in enumerate(questions(log, n)):
                rows.append(server.ask(q, max_tokens))
                if progress:
                    progress(f"retrieve={retrieve}", i + 1, n, rows[-1])
            lag = _lag(server, rate)
        finally:
            server.close()
    ttft = np.array([r["ttft_ms"] for r in rows if r["ttft_ms"] is not None])
    tps = np.array([r["tokens_per_s"] for r in rows if r["tokens_per_s"]])
    return {"rate": rate, "retrieve": retrieve, "questions": n, "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "ttft_p95_ms": float(np.percentile(ttft, 95)), "tokens_per_s_p50": float(np.percentile(tps, 50)),
            "tokens_per_s_p95": float(np.percentile(tps, 5)),     # the slow tail: 95% of answers were faster
            "prompt_tokens_mean": float(np.mean([r["prompt_tokens"] for r in rows])),
            "queued_ms_p50": float(np.median([r["queued_ms"] or 0.0 for r in rows])),
            "frame_ms_p50": float(np.median([r["frame_ms"] or 0.0 for r in rows])),
            "prefill_ms_p50": float(np.median([r["prefill_ms"] or 0.0 for r in rows])),
            "retrieved_mean": float(np.mean([r["retrieved"] for r in rows])), **lag, "rows": rows}


def keeps_up(log: str, rates: list[float], seconds: float, every_s: float, max_tokens: int, retrieve: int,
             config=None, progress=None) -> list[dict]:
    """At each line rate: lines reaching the ring per second against the rate, with a question every `every_s`."""
    out = []
    with tempfile.TemporaryDirectory(prefix="ringspec_opbench_") as tmp:
        for rate in rates:
            server = _Server(log, rate, retrieve, config, tmp, serve=MODEL_ANSWERS)
            try:
                t_end, asked = time.monotonic() + seconds, 0
                while time.monotonic() < t_end:
                    t0 = time.monotonic()
                    server.ask(questions(log, asked + 1)[-1], max_tokens)
                    asked += 1
                    time.sleep(max(0.0, every_s - (time.monotonic() - t0)))
                row = {"rate": rate, "questions": asked, **_lag(server, rate)}
            finally:
                server.close()
            out.append(row)
            if progress:
                progress(row)
    return out


def _lag(server: _Server, rate: float) -> dict:
    """Lines per second that reached the ring since start-up, and what was waiting at the end."""
    h, m = server.health(), server.metrics()
    wall = time.monotonic() - server.t_start
    depth = {k: int(float(v)) for k, v in re.findall(r'^ringspec_queue_depth\{queue="(\w+)"\} (\S+)', m, re.M)}
    drops = sum(int(float(v)) for v in re.findall(r'^ringspec_dropped_lines_total\{[^}]*\} (\S+)', m, re.M))
    lines_per_s = (h["lines"] - server.lines_at_start) / wall
    waiting = depth.get("backlog_lines", 0) + depth.get("lines_channel", 0)
    return {"lines_per_s": lines_per_s, "waiting_lines": waiting, "dropped": drops,
            "kept_up": lines_per_s >= 0.95 * rate and drops == 0}


@dataclass
class OperatorReport(Report):
    """{"latency": [per retrieve k], "keeps_up": [per line rate]}: two tables and the highest rate kept up."""
    rate: float = 0.0             # the stream's lines per second while questions were timed
    k: int = 0                    # the profile's serve.retrieve

    def text(self) -> str:
        out, k = self.data, self.k
        lines = [f"\noperator questions (30 tokens, 30-token answers) while the log replays at {self.rate:g} lines/s:",
                 (f"{'retrieve k':>10s} {'lines got':>9s} {'prompt tok':>10s} {'ttft p50':>9s} {'ttft p95':>9s} "
                  f"{'tok/s p50':>9s} {'tok/s p95':>9s} | {'frame':>6s} {'queued':>6s} {'prefill':>7s} ms p50 | "
                  f"{'lines/s':>7s}")]
        for r in out["latency"]:
            lines.append(f"{r['retrieve']:>10d} {r['retrieved_mean']:9.1f} {r['prompt_tokens_mean']:10.0f} "
                         f"{r['ttft_p50_ms']:9.0f} {r['ttft_p95_ms']:9.0f} {r['tokens_per_s_p50']:9.1f} "
                         f"{r['tokens_per_s_p95']:9.1f} | {r['frame_ms_p50']:6.1f} {r['queued_ms_p50']:6.1f} "
                         f"{r['prefill_ms_p50']:7.1f}        | {r['lines_per_s']:7.1f}")
        lines.append(f"\ningestion while answering a question every 5 s (retrieving up to {k} lines):")
        for r in out["keeps_up"]:
            lines.append(f"  {r['rate']:5g} lines/s offered: {r['lines_per_s']:5.1f} reached the ring, "
                         f"{r['waiting_lines']} waiting, {r['dropped']} dropped: "
                         f"{'keeps up' if r['kept_up'] else 'falls behind'}")
        best = max((r["rate"] for r in out["keeps_up"] if r["kept_up"]), default=None)
        lines.append(f"highest line rate kept up: {best if best is not None else 'none of those tried'}")
        return "\n".join(lines)


def _asked(label, i, n, row) -> None:
    print(f"  {label} question {i}/{n}: ttft {row['ttft_ms'] or 0:6.0f} ms, {row['tokens_per_s']:5.1f} tok/s, "
          f"{row['prompt_tokens']} prompt tokens ({row['retrieved']} retrieved lines)", file=sys.stderr, flush=True)


def _kept(row) -> None:
    print(f"  rate {row['rate']:g} lines/s: {row['lines_per_s']:.1f} lines/s reached the ring, "
          f"{row['waiting_lines']} waiting at the end, {row['dropped']} dropped, {row['questions']} questions",
          file=sys.stderr, flush=True)


def run_operator_bench(cfg, profile: str | None, log: str | None = None, rate: float = 20.0, n_questions: int = 20,
                       rates: str = "4,6,8,10,20", seconds: float = 40.0,
                       warm_lines: int = WARM_LINES) -> OperatorReport:
    """TTFT and answer speed of 30-token questions the model answers (`serve.reader = "free"`) to a real `serve`
    while the log replays at `rate` lines/s, with no retrieval and with the profile's serve.retrieve lines; then, at
    each of `rates` (comma-separated lines/s) for `seconds`, with a question every 5 s: does ingestion keep up?
    `profile` (the path of `cfg`) is the servers'; `log` defaults to the profile's replay.log; `warm_lines`: lines in
    the ring before questions are timed."""
    ladder = [float(r) for r in rates.split(",") if r.strip()]
    if n_questions < 2 or rate <= 0 or not ladder or min(ladder) <= 0:
        raise ValueError("--questions must be >= 2, --rate and every --rates value > 0")
    k, log = cfg.serve.retrieve, log or replay_log(cfg)
    out = {"latency": [latency(log, rate, n_questions, 30, r, profile, _asked, warm_lines) for r in sorted({0, k})]}
    out["keeps_up"] = keeps_up(log, ladder, seconds, 5.0, 30, k, profile, progress=_kept)
    return OperatorReport(out, rate, k)

"""`bench --task ingest`: how fast a log reaches the ring once the ring is full, beside llama.cpp's prompt processing
of the same text at the same context, in one run.

Owns the measurement, per log (the profile's TEP log and two loghub logs from ../shared/data), systems alternated
(who goes first rotates from log to log and repeat to repeat):
  - ringspec_replay: `run.py replay LOG` (the five actors), read from its zmq PUB: each line event's time and
    tokens once 2,000 stream tokens are in (every ring here has wrapped), for `seconds`;
  - ringspec_serve: `run.py serve LOG --loop --rate 1000` (far above what it can take), from /metrics
    (`ringspec_stream_tokens_total`, `ringspec_stream_lines_total`) over `seconds` after the same warm-up; and
    ringspec_serve_questions: the same with an operator's 30-token question every 5 s (30-token answers);
  - llama_cpp: the log's tokens as the ring sees them (each line and its newline), W tokens evaluated untimed, then
    the next 512 timed in one batch, three times, the median (flash attention, the profile's threads): prompt
    processing at a context of W to W + 512 (ringspec's rows see W).
Assessments are off in every ringspec run (no trigger fires): this is the stream's prefill alone; the operator bench
measures it beside answers. Never reaches into a server: everything comes from its PUB socket and HTTP answers.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from bench.chaos import free_port
from bench.operators import ROOT, _Server
from bench.speed import llama_cpp
from models.tokenizer import Tokenizer
from pipeline import config
from pipeline.config import replay_log
from pipeline.report import Report
from pipeline.stream.records import read_log, render
from pipeline.watch import wait_for

SHARED = ROOT.parent / "shared"
LOGHUB = ("loghub/Linux_2k.log", "loghub/Zookeeper_2k.log")
WARM_TOKENS = 2000          # stream tokens before measuring: past every ring's first wrap (serving's: ~1,750 slots)
LLAMA_TIMED = 512           # llama.cpp's timed batch after the window
LLAMA_TIMES = 3             # ... timed this many times (the median)
QUIET = "[replay]\nevery_lines = 1000000\ntrigger_pattern = ''\nidle_s = 0.0\n"   # no assessment during ingest
ASKS = ["What happened in the last lines of the log, and is any component failing or restarting right now?",
        "Which errors or warnings appeared most recently, and did the same source report them before?",
        "Summarise the latest events of this log in two sentences for the operator on duty right now."]
SYSTEMS = ("ringspec_replay", "ringspec_serve", "ringspec_serve_questions", "llama_cpp")


def logs_of(cfg) -> list[str]:
    return [replay_log(cfg)] + [str(SHARED / "data" / name) for name in LOGHUB]


def _profile(base: str | None, workdir: str, model: str) -> str:
    """The base profile with assessments off, and the bench's target (`--model`) where the base names none."""
    text = Path(base).read_text() if base else ""
    if "[replay]" in text:
        raise ValueError(f"{base}: leave out [replay]: the ingest bench turns assessments off")
    if "[model]" not in text:
        text += f"\n[model]\ngguf = {json.dumps(model)}\n"
    elif config.load(base).model.gguf != model:
        raise ValueError(f"{base} has a [model] section: set the model there, not with --model")
    path = Path(workdir) / "ingest.toml"
    path.write_text(text + "\n" + QUIET)
    return str(path)


def replay_rate(log: str, profile: str, seconds: float, workdir: str) -> dict:
    """The actor pipeline replaying `log` as fast as it can: tokens and lines per second into the ring, measured
    from its line events after WARM_TOKENS."""
    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"line")
    sub.connect(f"tcp://127.0.0.1:{port}")
    err = open(Path(workdir) / "replay.err", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "replay", log, "--config", profile, "--quiet-lines",
                             "--pub", f"tcp://127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=err)
    seen, tokens, start = [], 0, None
    try:
        while True:
            if not sub.poll(1000):
                if proc.poll() is not None:
                    break
                continue
            _, body = sub.recv_multipart()
            rec = json.loads(body)
            tokens += rec["n_tokens"]
            if start is None and tokens >= WARM_TOKENS:
                start = (rec["t"], tokens)
            elif start is not None:
                seen.append(rec)
                if rec["t"] - start[0] >= seconds:
                    break
    finally:
        for _ in range(2):                               # drain, then stop now
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sub.close()
        err.close()
    if not seen:
        raise RuntimeError(f"replay of {log}: no line past {WARM_TOKENS} tokens "
                           f"({(Path(workdir) / 'replay.err').read_text()[-1500:]})")
    wall = seen[-1]["t"] - start[0]
    return _rates(sum(r["n_tokens"] for r in seen), len(seen), wall)


def serve_rate(log: str, profile: str, seconds: float, workdir: str, ask_every_s: float = 0.0) -> dict:
    """A real `serve` offered the log far faster than it takes it: tokens and lines per second into the ring over
    `seconds` once WARM_TOKENS are in, with a 30-token question every ask_every_s (0: none)."""
    server = _Server(log, 1000.0, 0, profile, workdir)
    try:
        wait_for(lambda: _counter(server, "stream_tokens") >= WARM_TOKENS, "the ring filling",
                 pids=[server.proc.pid], progress=lambda: _counter(server, "stream_tokens"))
        t0, tok0, lines0 = time.monotonic(), _counter(server, "stream_tokens"), _counter(server, "stream_lines")
        asked, ttft = 0, []
        while time.monotonic() - t0 < seconds:
            if ask_every_s:
                a = time.monotonic()
                ttft.append(server.ask(ASKS[asked % len(ASKS)], 30)["ttft_ms"])
                asked += 1
                time.sleep(max(0.0, min(ask_every_s - (time.monotonic() - a), seconds - (time.monotonic() - t0))))
            else:
                time.sleep(0.5)
        wall = time.monotonic() - t0
        out = _rates(_counter(server, "stream_tokens") - tok0, _counter(server, "stream_lines") - lines0, wall)
        if ask_every_s:
            out.update(questions=asked, ttft_p50_ms=float(np.median([t for t in ttft if t is not None])))
        return out
    finally:
        server.close()


def _counter(server: _Server, name: str) -> int:
    m = re.search(rf"^ringspec_{name}_total (\S+)", server.metrics(), re.M)
    return int(float(m.group(1))) if m else 0


def llama_rate(log: str, gguf: str, window: int, threads: int) -> dict:
    """llama.cpp's prompt processing of the log's tokens at a context of `window` (see the module docstring)."""
    lib = llama_cpp()
    if lib is None:
        return {"skipped": "llama-cpp-python is not installed (pip install '.[bench]')"}
    records = read_log(log)
    tok = Tokenizer.from_gguf(gguf)
    ids = tok.encode(render(records))
    per_line = len(tok.encode(render(records[:200]))) / min(200, len(records))
    if len(ids) < window + LLAMA_TIMED:
        raise ValueError(f"{log}: {len(ids)} tokens, fewer than the {window + LLAMA_TIMED} the comparison needs")
    llm = lib.Llama(model_path=str(gguf), n_ctx=window + LLAMA_TIMED + 8, n_threads=threads, n_threads_batch=threads,
                    n_batch=LLAMA_TIMED, flash_attn=True, verbose=False)
    walls = []
    try:
        llm.eval(list(ids[:window]))
        for _ in range(LLAMA_TIMES):                      # the same batch again: eval drops what follows n_tokens
            llm.n_tokens = window
            t0 = time.perf_counter()
            llm.eval(list(ids[window:window + LLAMA_TIMED]))
            walls.append(time.perf_counter() - t0)
    finally:
        llm.close()
    return _rates(LLAMA_TIMED, LLAMA_TIMED / per_line, float(np.median(walls)))


def _rates(tokens: int, lines: float, wall: float) -> dict:
    return {"tokens_per_s": tokens / wall, "lines_per_s": lines / wall, "tokens": tokens, "lines": lines,
            "seconds": wall}


def run_ingest_bench(cfg, profile: str | None, logs: list[str] | None = None, seconds: float = 40.0,
                     repeats: int = 1, progress=None) -> "IngestReport":
    """Every system on every log, alternated (module docstring); figures averaged over `repeats`."""
    logs = logs or logs_of(cfg)
    gguf = str(cfg.target.gguf)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="ringspec_ingest_") as tmp:
        quiet = _profile(profile, tmp, cfg.model.gguf)
        runs = {
            "ringspec_replay": lambda log: replay_rate(log, quiet, seconds, tmp),
            "ringspec_serve": lambda log: serve_rate(log, quiet, seconds, tmp),
            "ringspec_serve_questions": lambda log: serve_rate(log, quiet, seconds, tmp, ask_every_s=5.0),
            "llama_cpp": lambda log: llama_rate(log, gguf, cfg.cache.window, cfg.model.threads),
        }
        turn = 0
        for log in logs:
            got: dict = {name: [] for name in SYSTEMS}
            for _ in range(repeats):
                for name in SYSTEMS[turn % len(SYSTEMS):] + SYSTEMS[:turn % len(SYSTEMS)]:
                    got[name].append(runs[name](log))
                    if progress:
                        progress(Path(log).name, name, got[name][-1])
                turn += 1
            out[Path(log).name] = {name: _mean(rows) for name, rows in got.items()}
    return IngestReport(out)


def _mean(rows: list[dict]) -> dict:
    if "skipped" in rows[0]:
        return rows[0]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} | {"repeats": len(rows)}


def progress_line(log: str, name: str, row: dict) -> None:
    shown = row.get("skipped") or f"{row['tokens_per_s']:.0f} tok/s, {row['lines_per_s']:.1f} lines/s"
    print(f"  {log} {name}: {shown}", file=sys.stderr, flush=True)


@dataclass
class IngestReport(Report):
    """{log: {system: {tokens_per_s, lines_per_s, ...}}}; a table per log and ringspec over llama.cpp."""

    def text(self) -> str:
        lines = ["\nstream prefill at a full ring (assessments off), beside llama.cpp's prompt processing of the same "
                 "text at the same context:",
                 f"{'log':<20s} {'system':<26s} {'tok/s':>7s} {'lines/s':>8s} {'x llama.cpp':>11s}"]
        for log, systems in self.data.items():
            ref = systems.get("llama_cpp", {}).get("tokens_per_s")
            for name, r in systems.items():
                if "skipped" in r:
                    lines.append(f"{log:<20s} {name:<26s} {r['skipped']}")
                    continue
                ratio = f"{r['tokens_per_s'] / ref:11.2f}" if ref else f"{'':>11s}"
                extra = f"  (ttft p50 {r['ttft_p50_ms']:.0f} ms)" if "ttft_p50_ms" in r else ""
                lines.append(f"{log:<20s} {name:<26s} {r['tokens_per_s']:7.0f} {r['lines_per_s']:8.1f} {ratio}{extra}")
        return "\n".join(lines)


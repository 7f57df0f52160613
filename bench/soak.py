"""The soak: a real log looped through the full pipeline at full speed while memory and quality are sampled.

Owns the sampling (every actor's resident and anonymous memory, resident memory by mapping, open descriptors and
threads from /proc, and the shared-memory segments, every `every_tokens` stream tokens) and the verdict figures:
slopes and spread after a warm-up, the mappings that grew, growth of descriptors, threads and segments, the PPL of
the first and the last complete loop period, the KV pool against its formula. Runs the local launcher in this
process and listens to the output actor's zmq PUB socket; never touches an actor's state. `run_soak` is the `soak`
verb: samples on stderr as they come, the figures in `SoakReport`.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from bench import svg
from bench.chaos import ROOT, Asker, free_port
from bench.pipeline_vs_serial import profile_with
from models.runner import kv_bytes_per_slot
from pipeline.config import replay_log
from pipeline.launch import memory
from pipeline.launch.local_processes import actor_pids
from pipeline.launch.plan import StreamRun
from pipeline.launch.supervise import run_pipeline
from pipeline.report import Report
from pipeline.stream.frame import replay_frame
from pipeline.stream.records import format_of
from pipeline.stream.sources import SourceSpec
from pipeline.watch import dies_with_parent

WARMUP = 0.10        # the first 10% of the tokens are warm-up


def _read(pid: int) -> dict | None:
    try:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "Threads"):
                fields[key] = int(value.split()[0])
        return {"rss_kb": fields["VmRSS"], "anon_kb": fields["RssAnon"], "threads": fields["Threads"],
                "fds": len(os.listdir(f"/proc/{pid}/fd")), "pss_kb": _pss_kb(pid), "mapped_kb": _mapped_kb(pid)}
    except (OSError, KeyError):
        return None


def _mapped_kb(pid: int) -> dict[str, int]:
    """Resident KiB by what backs it (/proc/PID/smaps): each mapped file by its path (a model's weights, a library,
    a shared-memory segment under /dev/shm), and "[anon]" for the heap, stacks and anonymous mappings; mappings
    with nothing resident are left out."""
    out: dict[str, int] = {}
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):      # a mapping's header
            path = head[5].strip() if len(head) == 6 else ""
            name = path if path.startswith("/") else "[anon]"
        elif line.startswith("Rss:"):
            kb = int(line.split()[1])
            if kb:
                out[name] = out.get(name, 0) + kb
    return out


def _pss_kb(pid: int) -> int:
    """Proportional set size: shared pages (libraries, channels) split among the processes mapping them, so the
    actors' sum is what the pipeline holds (what the memory plan counts)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise KeyError("Pss")


def _segments(launcher: int) -> list[str]:
    """The run's shared-memory segments (their names carry the launcher's pid)."""
    mine = f"ringspec_p{launcher}_"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(mine))


class _Listener(threading.Thread):
    """Counts stream tokens and NLL per loop from the PUB socket; samples /proc every `every` tokens.

    launcher: the process whose actors and fork server are sampled (`actor_pids`: this one, or a `serve` process, which
    is then sampled too, as "launcher"); files: paths whose size on disk is sampled with them (the archive)."""

    def __init__(self, endpoint: str, every: int, progress=None, launcher: int | None = None, files=()):
        super().__init__(daemon=True)

        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(endpoint)
        self.every, self.progress = every, progress
        self.launcher, self.files = launcher, list(files)
        self.tokens, self.lines, self.next_sample = 0, 0, 0
        self.samples: list[dict] = []
        self.loops: dict[int, list[float]] = {}          # loop -> [nll sum, count]
        self.assessments = 0
        self.eof: dict | None = None
        self.done = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.done.is_set():
            if not self.sock.poll(200):
                continue
            kind, body = self.sock.recv_multipart()
            event = json.loads(body)
            if kind == b"line":
                self.tokens += event.get("n_tokens", 0)
                self.lines += 1
                acc = self.loops.setdefault(event.get("loop", 0), [0.0, 0])
                acc[0] += event.get("nll_sum", 0.0)
                acc[1] += event.get("nll_n", 0)
                if self.tokens >= self.next_sample:
                    self.sample()
                    self.next_sample += self.every
            elif kind == b"assessment":
                self.assessments += 1
            elif kind == b"eof":                    # not sampled: the model actors are already shutting down
                self.eof = event
                self.done.set()

    def sample(self) -> None:
        launcher = os.getpid() if self.launcher is None else self.launcher
        pids = actor_pids(launcher) | ({"launcher": launcher} if self.launcher is not None else {})
        actors = {name: _read(pid) for name, pid in pids.items()}
        names = _segments(launcher)
        row = {"tokens": self.tokens, "lines": self.lines, "t": time.monotonic() - self.t0, "segments": len(names),
               "segment_names": names, "actors": {k: v for k, v in actors.items() if v is not None}}
        if self.files:
            row["disk_bytes"] = sum(f.stat().st_size for f in self.files if f.exists())
        self.samples.append(row)
        if self.progress:
            self.progress(row)


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y over x."""
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0])


def _grown(rows: list[tuple[int, dict]], top: int = 3) -> dict[str, int]:
    """What backs an actor's resident growth after warm-up: the `top` mappings whose resident KiB grew most from the
    first sample to the last (`_mapped_kb`), largest first; {} when the samples carry no mappings."""
    if len(rows) < 2 or "mapped_kb" not in rows[0][1] or "mapped_kb" not in rows[-1][1]:
        return {}
    first, last = rows[0][1]["mapped_kb"], rows[-1][1]["mapped_kb"]
    grown = {k: last.get(k, 0) - first.get(k, 0) for k in first.keys() | last.keys()}
    return dict(sorted(((k, v) for k, v in grown.items() if v > 0), key=lambda kv: -kv[1])[:top])


def _floor_growth(values: np.ndarray) -> int:
    """How far the floor rose: the least value of the last quarter of the samples minus the least of the first. A
    leak raises the floor; a connection or a thread alive at one sample (a question being answered) does not."""
    if len(values) == 0:
        return 0
    q = max(1, len(values) // 4)
    return int(values[-q:].min() - values[:q].min())


def _archive(samples: list[dict], archive_lines: int) -> dict:
    """The archive's disk use after it first filled (`archive_lines` lines in): its slope per 1,000 tokens and the
    largest size, and how many times its lines were replaced."""
    full = [s for s in samples if s["lines"] >= archive_lines and "disk_bytes" in s]
    x = np.array([s["tokens"] for s in full], float) / 1000.0
    size = np.array([s["disk_bytes"] for s in full], float) / 1024
    return {"archive_lines": archive_lines, "archive_turnovers": samples[-1]["lines"] / archive_lines if samples
            else 0.0, "archive_disk_slope_kib_per_1k_tokens": _slope(x, size),
            "archive_disk_max_mb": float(size.max()) / 1024 if len(size) else 0.0,
            "archive_samples_after_filling": len(full)}


def report(samples: list[dict], loops: dict, tokens: int, kv_pool_bytes: int, kv_formula_bytes: int,
           archive_lines: int | None = None) -> dict:
    # samples with every actor up (the ingest exits at its token limit while the rest still drain), after warm-up
    names = sorted({n for s in samples for n in s["actors"]})
    warm = [s for s in samples if s["tokens"] >= WARMUP * tokens and sorted(s["actors"]) == names]
    per_actor = {}
    for name in names:
        rows = [(s["tokens"], s["actors"][name]) for s in warm if name in s["actors"]]
        x = np.array([t for t, _ in rows], float) / 1000.0

        def get(key, rows=rows):
            return np.array([a[key] for _, a in rows], float)
        per_actor[name] = {"rss_slope_kib_per_1k_tokens": _slope(x, get("rss_kb")),
                           "anon_slope_kib_per_1k_tokens": _slope(x, get("anon_kb")),
                           "rss_spread_kib": float(np.ptp(get("rss_kb"))) if rows else 0.0,
                           "rss_last_mb": float(get("rss_kb")[-1]) / 1024 if rows else 0.0,
                           "fds_growth": _floor_growth(get("fds")), "threads_growth": _floor_growth(get("threads")),
                           "grown_kib": _grown(rows)}
    x = np.array([s["tokens"] for s in warm], float) / 1000.0
    total = np.array([sum(a["rss_kb"] for a in s["actors"].values()) for s in warm], float)
    complete = sorted(k for k in loops if k + 1 in loops)              # the last loop is partial
    ppl = {k: math.exp(loops[k][0] / loops[k][1]) if loops[k][1] else None for k in complete}
    first, last = (ppl[complete[0]], ppl[complete[-1]]) if complete else (None, None)
    out = {"tokens": tokens, "samples": len(samples), "warmup_tokens": int(WARMUP * tokens), "actors": per_actor,
           "rss_slope_kib_per_1k_tokens": _slope(x, total), "rss_spread_kib": float(np.ptp(total)) if len(total)
           else 0.0, "segments_growth": max(s["segments"] for s in warm) - warm[0]["segments"] if warm else 0,
           "loops_complete": len(complete), "ppl_first_loop": first, "ppl_last_loop": last,
           "ppl_last_over_first": last / first if first and last else None, "assessments": None,
           "kv_pool_bytes": int(kv_pool_bytes), "kv_pool_formula_bytes": kv_formula_bytes}
    out["goals"] = {
        "rss_slope_below_1_kib_per_1k_tokens": out["rss_slope_kib_per_1k_tokens"] < 1.0,
        "no_growth_in_fds_threads_segments": out["segments_growth"] == 0 and all(
            a["fds_growth"] <= 0 and a["threads_growth"] <= 0 for a in per_actor.values()),
        "last_loop_ppl_within_10_percent": out["ppl_last_over_first"] is not None and
        abs(out["ppl_last_over_first"] - 1.0) <= 0.10,
        "kv_pool_matches_formula": abs(out["kv_pool_bytes"] - kv_formula_bytes) < 2**20 * 0.001 + 1}
    if archive_lines:
        out.update(_archive(samples, archive_lines))
        out["goals"]["archive_disk_bounded"] = (out["archive_samples_after_filling"] >= 2 and
                                                out["archive_disk_slope_kib_per_1k_tokens"] < 1.0)
        out["goals"]["archive_turned_over_5_times"] = out["archive_turnovers"] >= 5
    return out


def soak(cfg, log: str, tokens: int, every_tokens: int = 5000, progress=None) -> dict:
    """Loop `log` through the pipeline until `tokens` stream tokens went in; sample, then report."""

    cfg = dataclasses.replace(cfg, replay=dataclasses.replace(cfg.replay, score_stream=True),
                              actors=dataclasses.replace(cfg.actors, launcher="local"))
    card = cfg.target.config
    spec = replay_frame(cfg).spec
    kv_formula = kv_bytes_per_slot(card, cfg.model.resolved(cfg.target.card).pool_dtype) * spec.stored_slots
    with tempfile.TemporaryDirectory(prefix="ringspec_soak_") as tmp:
        endpoint = f"ipc://{tmp}/events"
        listener = _Listener(endpoint, every_tokens, progress)
        listener.start()
        t0 = time.perf_counter()
        source = SourceSpec("loop", format_of(log), path=str(Path(log).resolve()), max_tokens=tokens)
        run_pipeline(cfg, [StreamRun("", cfg, source, f"{tmp}/journal.jsonl", "")], tmp, pub=endpoint, quiet_lines=True)
        wall = time.perf_counter() - t0
        listener.done.wait(10.0)
        listener.done.set()
        listener.join(2.0)
        listener.sock.close(0)
    target = next((f for f in (listener.eof or {}).get("figures", []) if f["actor"] == "target"), {})
    out = report(listener.samples, listener.loops, listener.tokens, target.get("kv_pool_mb", 0.0) * 2**20, kv_formula)
    out.update(assessments=listener.assessments, wall_s=wall, log=str(log), sink=spec.sink, ring=spec.ring,
               window=spec.window, series=listener.samples)
    return out


QUESTIONS = ("Which alarm fired last?", "When did PIR108 last go HIGH HIGH?", "Which alarms recovered recently?",
             "What happened to the reactor pressure?", "Summarise the last minute.")
ARCHIVE_LINES = 2000       # serve: the archive's retention, low so that a million tokens replace it many times
LEAVE = ("after the first token", "before the reply", "half a request head")


class _Leaver(threading.Thread):
    """HTTP clients that go away, one every `every_s`, the three kinds in turn: a streamed answer dropped after its
    first token, a question whose asker hangs up before any reply, a request head cut off halfway. Each socket is
    reset, not closed politely (SO_LINGER 0), as a vanished client's would be."""

    def __init__(self, port: int, every_s: float, max_tokens: int):
        super().__init__(daemon=True)
        self.port, self.every_s, self.stop, self.max_tokens = port, every_s, threading.Event(), max_tokens
        self.left = dict.fromkeys(LEAVE, 0)
        self.errors = 0

    def run(self) -> None:
        for i in itertools.count():
            if self.stop.wait(self.every_s):
                return
            kind = LEAVE[i % len(LEAVE)]
            body = json.dumps({"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                               "max_tokens": self.max_tokens, "stream": kind == LEAVE[0]}).encode()
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=120) as sock:
                    sock.sendall(head[:len(head) // 2] if kind == LEAVE[2] else head + body)
                    got = b""
                    while kind == LEAVE[0] and b'"content"' not in got:
                        chunk = sock.recv(4096)
                        if not chunk:
                            break
                        got += chunk
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.left[kind] += 1
            except OSError:
                self.errors += 1


def _metrics(port: int) -> dict[str, float]:
    """The server's /metrics as {"name{labels}": value} (empty if it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def _against_plan(cfg, samples: list[dict]) -> dict:
    """The memory plan (`run.py plan --serve`) beside what the processes held at the last sample with all of them
    up (PSS), per process and in all: the plan's recorded overheads checked against a run."""
    plan = memory.plan(cfg).as_dict()
    full = [s for s in samples if set(plan["processes"]) <= set(s["actors"])]
    if not full:
        return {"plan_bytes": plan["total_bytes"], "measured_pss_bytes": None}
    last = full[-1]["actors"]
    measured = sum(last[p]["pss_kb"] for p in plan["processes"]) * 1024
    return {"plan_bytes": plan["total_bytes"], "measured_pss_bytes": measured,
            "plan_over_measured": plan["total_bytes"] / measured,
            "processes": {p: {"plan_bytes": b, "pss_bytes": last[p]["pss_kb"] * 1024}
                          for p, b in plan["processes"].items()}}


def soak_serve(cfg, config_path: str | None, log: str, tokens: int, every_tokens: int = 5000, progress=None,
               ask_every_s: float = 3.0, leave_every_s: float = 5.0, archive_lines: int = ARCHIVE_LINES) -> dict:
    """`serve` the log in a loop at full speed in its own process, with an operator's question every `ask_every_s`
    after the last answer, a client vanishing every `leave_every_s` and the archive kept to `archive_lines` lines;
    sample the server and every actor, stop it with SIGINT after `tokens` stream tokens (and at least one answer and
    one client of each kind), and report."""
    served = dataclasses.replace(cfg, serve=dataclasses.replace(cfg.serve, enabled=True))
    card = cfg.target.config
    spec = replay_frame(served).spec
    kv_formula = kv_bytes_per_slot(card, cfg.model.resolved(cfg.target.card).pool_dtype) * spec.stored_slots
    with tempfile.TemporaryDirectory(prefix="ringspec_soak_") as tmp:
        tmp = Path(tmp)
        profile = profile_with(config_path, {"replay.score_stream": True, "serve.archive_max_lines": archive_lines},
                               tmp)
        endpoint, port, archive = f"ipc://{tmp}/events", free_port(), tmp / "archive.sqlite"
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), "serve", str(Path(log).resolve()), "--loop", "--rate", "0",
             "--speed", "0", "--quiet-lines", "--config", str(profile), "--http", f"127.0.0.1:{port}", "--zmq", "",
             "--pub", endpoint, "--archive", str(archive)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
            preexec_fn=dies_with_parent)
        err: list[str] = []
        threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
        files = [archive, Path(f"{archive}-wal"), Path(f"{archive}-shm")]
        listener = _Listener(endpoint, every_tokens, progress, launcher=proc.pid, files=files)
        max_tokens = min(16, cfg.serve.max_answer_tokens)
        asker, leaver = Asker(port, QUESTIONS, ask_every_s, max_tokens), _Leaver(port, leave_every_s, max_tokens)
        t0 = time.perf_counter()
        listener.start()
        interrupted = False
        try:
            # until `tokens` went in, a question was asked and every kind of client left once
            while proc.poll() is None and (listener.tokens < tokens or not asker.answered + asker.failed or
                                           not all(leaver.left.values())):
                try:
                    time.sleep(1.0)
                except KeyboardInterrupt:            # Ctrl-C on a long soak: report what was sampled so far
                    interrupted = True
                    break
                if not (asker.is_alive() or asker.stop.is_set()) and listener.tokens:
                    asker.start()                    # once the stream flows: the server is up
                    leaver.start()
            figures = _metrics(port)
        finally:
            asker.stop.set()
            leaver.stop.set()
            listener.done.set()                      # the figures end here, not after the drain
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)   # a terminal's Ctrl-C: drain, exit 0
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            listener.join(2.0)
            listener.sock.close(0)
        wall = time.perf_counter() - t0
    if listener.tokens < tokens and not interrupted:
        raise RuntimeError(f"serve stopped after {listener.tokens:,} tokens (exit {proc.returncode}): "
                           + " | ".join(err[-5:]))
    out = report(listener.samples, listener.loops, listener.tokens, figures.get("ringspec_kv_pool_bytes", 0.0),
                 kv_formula, archive_lines)
    out["goals"]["every_question_answered"] = asker.failed == 0
    out["memory_plan"] = _against_plan(served, listener.samples)
    out.update(assessments=listener.assessments, wall_s=wall, log=str(log), sink=spec.sink, ring=spec.ring,
               window=spec.window, series=listener.samples, mode="serve", exit_code=proc.returncode,
               tokens_asked=tokens, interrupted=interrupted,
               questions_answered=asker.answered, questions_failed=asker.failed,
               clients_left=leaver.left, client_errors=leaver.errors,
               server_client_disconnects=figures.get("ringspec_client_disconnects_total"),
               server_http_requests={k.split("{", 1)[1].rstrip("}"): v for k, v in figures.items()
                                     if k.startswith("ringspec_http_requests_total{")})
    return out


def write_plot(result: dict, path: str) -> str:
    """Resident memory of each actor over stream tokens, as SVG."""
    series = result["series"]
    names = sorted({n for s in series for n in s["actors"]})
    w, h, pad = 720, 360, 50
    xmax = max(1, max(s["tokens"] for s in series))
    ymax = max(1.0, max(a["rss_kb"] for s in series for a in s["actors"].values()) / 1024 * 1.1)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    parts = svg.frame(w, h, "resident memory per actor (MB) over stream tokens", pad, 20, w - 10, h - pad)
    parts += [svg.label(w / 2, h - 12, f"tokens (max {xmax:,})", anchor="middle"),
              svg.label(pad - 6, 24, f"{ymax:.0f}", anchor="end"), svg.label(pad - 6, h - pad, "0", anchor="end")]
    for i, name in enumerate(names):
        pts = " ".join(f"{pad + (s['tokens'] / xmax) * (w - pad - 10):.1f},"
                       f"{h - pad - (s['actors'][name]['rss_kb'] / 1024 / ymax) * (h - pad - 20):.1f}"
                       for s in series if name in s["actors"])
        color = colors[i % len(colors)]
        parts += [svg.polyline(pts, color), svg.label(w - 120, 40 + 14 * i, name, color)]
    svg.save(parts, path)
    return path


@dataclass
class SoakReport(Report):
    """The soak's result: --json prints it without the sample series, --out writes it all."""

    def as_dict(self) -> dict:
        return {k: v for k, v in self.data.items() if k != "series"}

    def saved(self) -> dict:
        return self.data

    def text(self) -> str:
        out = self.data
        lines = [(f"{out['tokens']:,} tokens in {out['wall_s']:.0f} s, {out['assessments']} assessments, "
                 f"{out['samples']} samples; warm-up {out['warmup_tokens']:,} tokens"
                 + (f" (Ctrl-C before the {out['tokens_asked']:,} asked)" if out.get("interrupted") else "")),
                 (f"{'actor':12s} {'rss MB':>7s} {'slope KiB/1k tok':>17s} {'anon slope':>11s} {'spread KiB':>11s} "
                  f"{'fds +':>6s} {'thr +':>6s}")]
        for name, a in out["actors"].items():
            lines.append(f"{name:12s} {a['rss_last_mb']:7.1f} {a['rss_slope_kib_per_1k_tokens']:17.3f} "
                         f"{a['anon_slope_kib_per_1k_tokens']:11.3f} {a['rss_spread_kib']:11.0f} "
                         f"{a['fds_growth']:6d} {a['threads_growth']:6d}")
            if a.get("grown_kib"):
                lines.append(f"{'':12s} grew most: " + ", ".join(f"{os.path.basename(k) or k} +{v:,} KiB"
                                                                  for k, v in a["grown_kib"].items()))
        ratio = out["ppl_last_over_first"]
        lines.append(f"all actors: slope {out['rss_slope_kib_per_1k_tokens']:.3f} KiB per 1,000 tokens, spread "
                     f"{out['rss_spread_kib']:.0f} KiB; segments {out['segments_growth']:+d}; PPL first loop "
                     f"{out['ppl_first_loop'] or float('nan'):.3f}, last {out['ppl_last_loop'] or float('nan'):.3f} "
                     f"({'-' if ratio is None else f'{ratio:.3f}x'}, {out['loops_complete']} complete loops); KV pool "
                     f"{out['kv_pool_bytes']:,} B, formula {out['kv_pool_formula_bytes']:,} B")
        if out.get("mode") == "serve":
            left = ", ".join(f"{v} {k}" for k, v in out["clients_left"].items())
            lines.append(f"serve: {out['questions_answered']} questions answered, {out['questions_failed']} failed; "
                         f"clients left: {left} ({out['client_errors']} errors), the server counted "
                         f"{out['server_client_disconnects']:.0f} disconnects; archive {out['archive_lines']:,} lines "
                         f"replaced {out['archive_turnovers']:.1f} times, disk slope "
                         f"{out['archive_disk_slope_kib_per_1k_tokens']:.3f} KiB per 1,000 tokens after it filled, "
                         f"largest {out['archive_disk_max_mb']:.1f} MB")
            plan = out.get("memory_plan") or {}
            if plan.get("measured_pss_bytes"):
                each = ", ".join(f"{p} {v['plan_bytes'] / 2**20:.0f}/{v['pss_bytes'] / 2**20:.0f}"
                                 for p, v in plan["processes"].items())
                lines.append(f"memory plan against the run (PSS at the last sample), MiB: in all "
                             f"{plan['plan_bytes'] / 2**20:.0f} planned, {plan['measured_pss_bytes'] / 2**20:.0f} held "
                             f"({plan['plan_over_measured']:.2f}x); planned/held: {each}")
        lines.append("goals: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["goals"].items()))
        return "\n".join(lines)


def _printer():
    """Progress on stderr: each sample's tokens, time, summed resident memory, and the segments when they change."""
    seen: list[set] = []

    def progress(row):
        rss = sum(a["rss_kb"] for a in row["actors"].values()) / 1024
        names = set(row["segment_names"])
        change = f" (+{sorted(names - seen[0])} -{sorted(seen[0] - names)})" if seen and names != seen[0] else ""
        seen[:] = [names]
        print(f"  {row['tokens']:>10,} tokens {row['t']:8.0f} s  rss {rss:7.1f} MB  segments {row['segments']}"
              f"{change}", file=sys.stderr, flush=True)
    return progress


def run_soak(cfg, log: str | None, tokens: int, every_tokens: int = 5000, plot: str | None = None,
             config_path: str | None = None, serve: bool = False, ask_every_s: float = 3.0,
             leave_every_s: float = 5.0, archive_lines: int = ARCHIVE_LINES) -> SoakReport:
    """Replays a real log over and over through the local actor pipeline (analyses as configured), samples every
    actor's resident and anonymous memory, descriptors, threads and the shared-memory segments every few thousand
    tokens, and reports slopes after a 10% warm-up, the spread, and the PPL of the last complete loop against the
    first. With serve: the same under `serve`, with questions, vanishing clients and the archive (its disk use after
    it first filled, and how many times it turned over).

    log: the profile's replay.log by default; plot: resident memory per actor over tokens, as SVG to this path."""
    log = log or replay_log(cfg)
    out = (soak_serve(cfg, config_path, log, tokens, every_tokens, _printer(), ask_every_s, leave_every_s,
                      archive_lines) if serve else soak(cfg, log, tokens, every_tokens, _printer()))
    if plot:
        write_plot(out, plot)
    return SoakReport(out)

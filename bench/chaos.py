"""`python run.py chaos`: kill the actors of a real pipeline over and over, then count from its journal, against an
independent reading of the log, what was lost or duplicated.

Owns the fault plan (which actor dies, where and how), the run (a real `replay` or `serve` in its own process with
RINGSPEC_CHAOS set, questions over HTTP while serving) and the accounting. Never reaches into the pipeline: it arms
the named points the actors pass (pipeline/process.py `chaos`: a file per point, claimed by the first process to pass
it) and sends SIGKILL to the pids the launcher lists; everything it reports comes from the journal, the launcher's
stderr and the log file's bytes.

The accounting (README, "Surviving faults"): a line is committed when a durable checkpoint lists its offset; lost =
offered - committed - counted drops; duplicated = offsets committed more than once. Assessments: written = records in
the journal; duplicated = two records for the same (lines, trigger); lost (replay) = assessments a crash-free run
writes (the profile's triggers over the log's lines, `pipeline/stream/triggers.py`) that the journal lacks.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.pipeline_vs_serial import profile_with
from pipeline.config import replay_log
from pipeline.report import Report
from pipeline.stream import records as records_mod
from pipeline.stream.journal import checkpoint_of, history
from pipeline.stream.triggers import Triggers
from pipeline.topology import ROLES
from pipeline.watch import dies_with_parent

ROOT = Path(__file__).resolve().parent.parent
ACTORS = ROLES
POINTS = {          # the named points each actor passes (grep "chaos(" in actors/ and pipeline/decode/deferred.py)
    "ingest": ("ingest.read", "ingest.recovery"),        # a line read (and archived), not yet sent on; re-reading
    "cache_owner": ("owner.verdict", "owner.recovery"),  # a verdict received, not yet committed; refilling the ring
    "target": ("target.verified", "target.prefill"),     # a block judged, its verdict not sent; a prefill
    "draft": ("draft.proposed",),                        # a block drafted, not yet sent
    "output": ("output.written",),                       # an assessment's record durable, not yet shown
}
AFTER_A_RESTART = {"ingest.recovery", "owner.recovery", "target.prefill"}    # armed with a kill: hit while recovering
SERVE_RATE = 4              # lines per second while serving: analyses keep running beside the questions
ASK_EVERY_S = 2.0           # the operator's pause between an answer and the next question (serve)
STALL_S = 300.0             # no new journal record for this long: the run is stopped (and reported)
POINT_WAIT_S = 90.0         # a named point not passed by then is disarmed and reported as not reached
DIED = re.compile(r"ringspec: actor (\w+) \(pid \d+\) died: (.*?); restarting the pipeline")


@dataclass
class Fault:
    actor: str
    point: str | None           # None: SIGKILL at a random moment
    how: str = "kill"           # kill (SIGKILL) | raise (an exception inside the actor)

    def label(self) -> str:
        return f"{self.actor} at {self.point} ({self.how})" if self.point else f"{self.actor} at a random moment"


def plan(kills: int, seed: int) -> list[Fault]:
    """Every named point of every actor once (killed or raised, by the seed), then random-moment SIGKILLs spread
    over the five actors, shuffled. A point passed only while recovering costs two kills (the one that causes the
    restart, chosen at random, and its own)."""
    rng = random.Random(seed)
    named = [Fault(actor, point, rng.choice(("kill", "raise"))) for actor, points in POINTS.items() for point in points]
    cost = sum(2 if f.point in AFTER_A_RESTART else 1 for f in named)
    extra = [Fault(ACTORS[i % len(ACTORS)], None) for i in range(max(0, kills - cost))]
    faults = named + extra
    rng.shuffle(faults)
    return faults


class _Pipeline:
    """The pipeline under test: its process, its stderr as lines, its journal, its armed points and pids."""

    def __init__(self, args: list[str], chaos_dir: Path, journal: Path):
        self.chaos_dir, self.journal = chaos_dir, journal
        env = {**os.environ, "RINGSPEC_CHAOS": str(chaos_dir)}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                                     preexec_fn=dies_with_parent)
        self.err: list[str] = []
        self.deaths: list[tuple[str, str]] = []          # (actor, how it died), as the launcher reported them
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))
            m = DIED.search(line)
            if m:
                self.deaths.append((m.group(1), m.group(2)))

    def committed_records(self) -> int:
        if not self.journal.exists():
            return 0
        return sum(1 for r in history(str(self.journal)) if checkpoint_of(r) is not None)

    def wait_up(self, deaths: int, timeout: float = 180.0) -> bool:
        """Until the pipeline started after death number `deaths` committed a line (or it ended)."""
        base, deadline = None, time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if len(self.deaths) >= deaths:
                now = self.committed_records()
                base = now if base is None else base
                if now > base:
                    return True
            time.sleep(0.2)
        return False

    def arm(self, point: str, how: str) -> None:
        path = self.chaos_dir / point
        path.with_suffix(".tmp").write_text(how)
        os.replace(path.with_suffix(".tmp"), path)

    def disarm(self, point: str) -> bool:
        """True when the point was still armed (not reached)."""
        try:
            os.remove(self.chaos_dir / point)
            return True
        except FileNotFoundError:
            return False

    def sigkill(self, actor: str) -> bool:
        try:
            pid = json.loads((self.chaos_dir / "pids.json").read_text())[actor]
            os.kill(pid, signal.SIGKILL)
            return True
        except (OSError, KeyError, ValueError):
            return False

    def wait_deaths(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.deaths) < n and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        return len(self.deaths) >= n


class Asker(threading.Thread):
    """An operator asking over HTTP, one question after another; a failure (an error reply, a dropped connection)
    is counted, and the next question is asked (the retry an operator would make)."""

    def __init__(self, port: int, questions=("Which alarm fired last?",), pause_s: float = ASK_EVERY_S,
                 max_tokens: int = 12):
        super().__init__(daemon=True)
        self.port, self.answered, self.failed, self.stop = port, 0, 0, threading.Event()
        self.questions, self.pause_s, self.max_tokens = questions, pause_s, max_tokens

    def run(self) -> None:
        for i in itertools.count():
            if self.stop.is_set():
                return
            body = json.dumps({"messages": [{"role": "user", "content": self.questions[i % len(self.questions)]}],
                               "max_tokens": self.max_tokens}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    reply = json.loads(resp.read())
                ok = bool(reply.get("choices"))
            except OSError as exc:
                ok = False
                if isinstance(exc, ConnectionRefusedError) or "refused" in str(exc):
                    self.stop.wait(0.5)          # the server is restarting: not a question that was asked
                    continue
            except ValueError:
                ok = False
            self.answered += ok
            self.failed += not ok
            self.stop.wait(self.pause_s)


def run_chaos(cfg, config_path: str | None, log: str | None, kills: int, seed: int, serve: bool, copies: int,
              progress=print) -> ChaosReport:
    """Replay a log through the real pipeline (or `serve` it with questions flowing) and kill its actors `kills`
    times, with a seed: at every named point each actor passes (a line read, a verdict not yet committed, a block
    judged, a block drafted, an assessment written, while a restart refills the window), by SIGKILL or by an exception
    raised inside the actor, and at random moments. Then count, from the journal and the log's own bytes, the lines
    offered, committed, lost and duplicated, the assessments written, duplicated and lost, the questions answered and
    failed, the restarts and their recovery times. Exit code 1 when a line was lost or duplicated."""
    log = log or replay_log(cfg)
    copies = copies or max(1, math.ceil(kills / (3 if serve else 5)))    # serve: a copy lasts a minute
    faults = plan(kills, seed)
    with tempfile.TemporaryDirectory(prefix="ringspec_chaos_") as tmp:
        tmp = Path(tmp)
        stream = _repeated(Path(log), copies, tmp)
        # the kills are paced (each waits for a commit after the last restart), so a real crash loop still stops it
        profile = profile_with(config_path, {"replay.idle_s": 0.0, "supervise.max_restarts": 8,
                                             "supervise.period_s": 30.0, "supervise.checkpoint_s": 0.5}, tmp)
        journal, chaos_dir = tmp / "journal.jsonl", tmp / "chaos"
        chaos_dir.mkdir()
        port = free_port()
        common = [str(stream), "--quiet-lines", "--journal", str(journal), "--config", str(profile)]
        args = (["serve", *common, "--rate", str(SERVE_RATE), "--http", f"127.0.0.1:{port}", "--zmq", "", "--pub", "",
                 "--archive", str(tmp / "archive.sqlite")] if serve else ["replay", *common])
        t0 = time.monotonic()
        pipe = _Pipeline(args, chaos_dir, journal)
        asker = Asker(port) if serve else None
        unreached, done = [], 0
        try:
            if asker:
                asker.start()
            for i, fault in enumerate(faults):
                if not pipe.wait_up(len(pipe.deaths)):
                    break
                progress(f"chaos: kill {len(pipe.deaths) + 1}: {fault.label()}")
                before = len(pipe.deaths)
                if fault.point in AFTER_A_RESTART:         # a restart first; armed once the launcher reports it
                    killed = pipe.sigkill(random.Random(seed + i).choice(ACTORS))
                    if killed and pipe.wait_deaths(before + 1, POINT_WAIT_S):
                        pipe.arm(fault.point, fault.how)
                    expect = before + 2 if killed else before
                elif fault.point:
                    pipe.arm(fault.point, fault.how)
                    expect = before + 1
                else:
                    time.sleep(random.Random(seed + i).uniform(0.0, 2.0))
                    expect = before + pipe.sigkill(fault.actor)
                if not pipe.wait_deaths(expect, POINT_WAIT_S):
                    if fault.point and pipe.disarm(fault.point):
                        unreached.append(fault.label())
                done += 1
            _finish(pipe, serve)
        finally:
            if asker:
                asker.stop.set()
            if pipe.proc.poll() is None:
                pipe.proc.send_signal(signal.SIGKILL)
            pipe.proc.wait()
        wall = time.monotonic() - t0
        result = account(stream, journal, cfg, serve)
    result.update(mode="serve" if serve else "replay", seed=seed, kills_planned=sum(
        2 if f.point in AFTER_A_RESTART else 1 for f in faults), kills=len(pipe.deaths), faults_run=done,
        deaths_by_actor={a: sum(1 for d, _ in pipe.deaths if d == a) for a in ACTORS},
        unreached_points=unreached, exit_code=pipe.proc.returncode, wall_s=wall, copies=copies,
        questions_answered=asker.answered if asker else None, questions_failed=asker.failed if asker else None,
        stderr_tail=pipe.err[-5:])
    return ChaosReport(result)


def _finish(pipe: _Pipeline, serve: bool) -> None:
    """Replay: the stream runs to its end. Serve: once the stream has ended (after the last restart), drain. A
    pipeline that stops committing for STALL_S is cut short (the accounting then shows what it lost)."""
    last, moved = -1, time.monotonic()
    while pipe.proc.poll() is None and time.monotonic() - moved < STALL_S:
        recs = list(history(str(pipe.journal))) if pipe.journal.exists() else []
        if len(recs) != last:
            last, moved = len(recs), time.monotonic()
        last_restart = max((i for i, r in enumerate(recs) if r.get("kind") == "restart"), default=-1)
        if serve and any(r.get("kind") == "stream_end" for r in recs[last_restart + 1:]):
            os.killpg(pipe.proc.pid, signal.SIGINT)               # a terminal's Ctrl-C: drain, exit 0
            pipe.proc.wait(timeout=120)
            return
        time.sleep(0.5)


def _repeated(log: Path, copies: int, where: Path) -> Path:
    """The log `copies` times over in one file (a CSV's header once), so every line has its own offset."""
    data = log.read_bytes()
    if not data.endswith(b"\n"):
        data += b"\n"
    head, body = (data.split(b"\n", 1) if log.suffix == ".csv" else (None, data))
    out = where / f"chaos{log.suffix}"
    out.write_bytes((head + b"\n" if head is not None else b"") + body * copies)
    return out


def offered(path: Path) -> list[tuple[int, str]]:
    """(byte offset, rendered text) of every record of the log, the offsets read from its bytes here (not through
    the pipeline's sources): a line per record, a CSV's header skipped, empty lines skipped."""
    data = path.read_bytes()
    starts, at = [], 0
    for raw in data.split(b"\n"):
        if raw.strip():
            starts.append(at)
        at += len(raw) + 1
    if path.suffix == ".csv":
        starts = starts[1:]
    texts = [r.text for r in records_mod.read_log(path)]
    if len(texts) != len(starts):
        raise ValueError(f"{path}: {len(starts)} lines but {len(texts)} records: chaos needs one line per record")
    return list(zip(starts, texts))


def account(stream: Path, journal: Path, cfg, serve: bool) -> dict:
    """Lines and assessments from the journal against the log (see the module's docstring)."""
    lines = offered(stream)
    recs = list(history(str(journal))) if journal.exists() else []
    committed: dict[int, int] = {}
    for r in recs:
        point = checkpoint_of(r)
        for off in (point or {}).get("offsets", []):
            committed[off] = committed.get(off, 0) + 1
    offsets = {off for off, _ in lines}
    dropped = sum(r.get("dropped_full", 0) for r in recs if r.get("kind") in ("eof", "stream_end"))
    lost = sorted(offsets - set(committed))
    written = [(r["lines"], r["trigger"]) for r in recs if r.get("kind") == "assessment"]
    duplicated = len(written) - len(set(written))
    lost_assessments = None
    if not serve:
        trig = Triggers.of(cfg.replay)
        expected = {(i, why) for i, (_, text) in enumerate(lines, 1) if (why := trig.after_line(text))}
        lost_assessments = len(expected - set(written))
    recovery = [r["recovery_s"] for r in recs if r.get("kind") == "restart" and r.get("recovery_s") is not None]
    return {"lines_offered": len(lines), "lines_committed": len(committed), "lines_lost": max(0, len(lost) - dropped),
            "lines_duplicated": sum(n - 1 for n in committed.values() if n > 1),
            "lines_foreign": len(set(committed) - offsets), "lines_dropped": {"queue_full": dropped},
            "lost_offsets": lost[:20], "assessments_written": len(written), "assessments_duplicated": duplicated,
            "assessments_lost": lost_assessments,
            "lost_assessment_records": sum(1 for r in recs if r.get("kind") == "lost_assessment"),
            "restarts": sum(1 for r in recs if r.get("kind") == "restart"),
            "recovery_s_p50": float(np.percentile(recovery, 50)) if recovery else None,
            "recovery_s_p95": float(np.percentile(recovery, 95)) if recovery else None,
            "recovery_lines": sum(r.get("lines", 0) for r in recs if r.get("kind") == "recovery")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class ChaosReport(Report):
    indent = 1

    def text(self) -> str:
        d = self.data
        rows = [("kills (planned)", f"{d['kills']} ({d['kills_planned']})"),
                ("deaths by actor", ", ".join(f"{a} {n}" for a, n in d["deaths_by_actor"].items())),
                ("lines offered / committed", f"{d['lines_offered']} / {d['lines_committed']}"),
                ("lines lost / duplicated", f"{d['lines_lost']} / {d['lines_duplicated']}"),
                ("lines dropped (queue full)", d["lines_dropped"]["queue_full"]),
                ("assessments written / duplicated / lost",
                 f"{d['assessments_written']} / {d['assessments_duplicated']} / "
                 f"{'-' if d['assessments_lost'] is None else d['assessments_lost']}"),
                ("restarts journaled", d["restarts"]),
                ("recovery s p50 / p95", "-" if d["recovery_s_p50"] is None else
                 f"{d['recovery_s_p50']:.1f} / {d['recovery_s_p95']:.1f}"),
                ("lines re-read to refill the window", d["recovery_lines"])]
        if d["questions_answered"] is not None:
            rows.append(("questions answered / failed", f"{d['questions_answered']} / {d['questions_failed']}"))
        rows.append(("pipeline exit code", d["exit_code"]))
        width = max(len(k) for k, _ in rows)
        out = [f"chaos ({d['mode']}, seed {d['seed']}, the log {d['copies']}x, {d['wall_s']:.0f} s)"]
        out += [f"  {k:<{width}}  {v}" for k, v in rows]
        if d["unreached_points"]:
            out.append(f"  not reached: {', '.join(d['unreached_points'])}")
        return "\n".join(out)

    @property
    def exit_code(self) -> int:
        d = self.data
        return int(bool(d["lines_lost"] or d["lines_duplicated"] or d["assessments_duplicated"] or d["exit_code"]))

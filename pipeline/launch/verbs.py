"""The `replay` and `serve` verbs: a log through the configured launcher (or, for `replay`, the serial engine in this
process), with the command line's stream options (`StreamOptions`).

Owns what a verb checks before anything starts (a serve's API keys, --rate, --resume's journal) and the run's scratch
directory (stop and drain flags, pids, a journal not asked for), removed at the end. Never starts an actor itself:
supervise.py runs the pipeline.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile

from pipeline.launch import memory
from pipeline.config import replay_log, with_logs
from pipeline.launch.plan import StreamOptions, stream_runs
from pipeline.launch.supervise import run_pipeline
from pipeline.report import Report
from pipeline.serve.auth import load_keys
from pipeline.stream.replay import ReplayReport, printer, replay


def run_replay(cfg, log: str | list[str] | None = None, options: StreamOptions = StreamOptions()) -> Report:
    """Stream a log (plain lines, TEP alarm CSV or JSON lines) through the pipeline: ingest, cache owner, target,
    draft and output actors. Every N lines the model writes a short assessment of what it has seen. SIGINT/SIGTERM
    drain the pipeline (twice: stop now); SIGUSR1 prints every actor's figures.

    sources:
      FILE                 replay a captured file (--speed scales its timing)
      FILE --follow        tail -f FILE, surviving rename and copytruncate rotation
      tcp://HOST:PORT      a line server; clients connect one after another
      -                    standard input
      SRC SRC ...          several streams, one target: each stream has its own ring, owner,
                           draft and journal (F.NAME.jsonl), and its output lines say its name
                           (named after the files; a profile's [[streams]] names them itself)
    launchers (--launcher, or [actors] launcher in the profile):
      local   one process per actor over shared-memory channels (default)
      ray     the same actors as five named Ray actors on one node (--ray-address joins
              a cluster; otherwise a local Ray instance is started and stopped)
      serial  everything in this process (the reference the pipeline must equal, record for
              record in the journal): a file from its start; no --pub, --follow, --resume"""
    cfg = with_logs(cfg, [log] if isinstance(log, str) else list(log or ()))
    if cfg.actors.launcher != "serial":
        with _run_dir() as run_dir:
            run_pipeline(cfg, stream_runs(cfg, options, run_dir), run_dir, pub=options.pub,
                         quiet_lines=options.quiet_lines, resume=_resumes(cfg, options))
        return Report()
    return _serial(cfg, options)


def _serial(cfg, options: StreamOptions) -> Report:
    """`replay --launcher serial`: one stream's file through the serial engine in this process, printed and
    journaled as the pipeline's output actor prints and journals it (--journal); --speed and --rate pace it as
    ingest does. What needs the actors is refused, by name."""
    log = replay_log(cfg)
    if cfg.streams:
        raise ValueError("the serial launcher replays one stream: use --launcher local for several")
    if log.startswith("tcp://") or log == "-" or options.follow:
        raise ValueError("the serial launcher replays a file from its start: use --launcher local for sockets, stdin "
                         "and --follow")
    if options.resume or cfg.replay.resume:
        raise ValueError("the serial launcher has no restarts to resume from: use --launcher local for --resume")
    if options.pub:
        raise ValueError("the serial launcher prints and journals its events; --pub is the output actor's: use "
                         "--launcher local")
    if options.loop:
        raise ValueError("the serial launcher replays a file once: use --launcher local for --loop")
    memory.check(cfg)
    emit = printer(options.quiet_lines, options.journal, cfg.supervise)
    try:
        return ReplayReport(replay(log, options.fmt, cfg, emit, max_lines=cfg.replay.max_lines, speed=options.speed,
                                   rate=options.rate))
    finally:
        emit.close()


def run_serve(cfg, log: str | list[str] | None = None, options: StreamOptions = StreamOptions()) -> Report:
    """Run the pipeline over a log and answer operators' questions while it flows. A question goes ahead of stream
    prefill and analyses, is answered from the current context plus older lines retrieved from the archive (every
    ingested line is indexed in SQLite FTS5), and streams its tokens as they are committed; the stream's lines wait
    in a bounded backlog meanwhile. After the stream ends the server keeps answering until SIGINT/SIGTERM.

    endpoints (HTTP):
      /                         web console: live tail, analyses, chat, gauges
      /v1/chat/completions      OpenAI chat API ("stream": true for server-sent events)
      /v1/completions           OpenAI completions: the prompt continues the log
      /healthz, /metrics        health, Prometheus metrics
    zmq: python run.py ask "when did PIR108 last go HIGH HIGH?"
    A non-loopback --http needs a key: RINGSPEC_API_KEY, --api-key or --api-keys-file (one
    `NAME KEY` line per operator, NAME their turn in the fair queue); clients send
    Authorization: Bearer KEY, and `ask` sends RINGSPEC_API_KEY. zmq binds loopback or ipc only."""
    if cfg.actors.launcher == "serial":
        raise ValueError("serve runs the actor pipeline: use launcher local or ray")
    load_keys(cfg.serve.api_key, cfg.serve.api_keys_file)      # a bad key file is refused before anything starts
    if options.rate < 0:
        raise ValueError("--rate must be >= 0")
    cfg = with_logs(cfg, [log] if isinstance(log, str) else list(log or ()))
    with _run_dir() as run_dir:
        run_pipeline(cfg, stream_runs(cfg, options, run_dir), run_dir, pub=cfg.serve.pub or None,
                     quiet_lines=options.quiet_lines, resume=_resumes(cfg, options))
    return Report()


@contextlib.contextmanager
def _run_dir():
    """The run's scratch directory (stop and drain flags, pids, a journal not asked for), removed at the end."""
    run_dir = tempfile.mkdtemp(prefix="ringspec_run_")
    try:
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _resumes(cfg, options: StreamOptions) -> bool:
    """--resume or [replay] resume: true, which needs the journal its checkpoints are read from."""
    if (options.resume or cfg.replay.resume) and not options.journal:
        raise ValueError("--resume reads the last checkpoint from the journal: give --journal F.jsonl")
    return options.resume or cfg.replay.resume

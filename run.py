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
import sys
from pathlib import Path

from bench import distill, draftscan, operators, perplexity, pipeline_vs_serial, recall, soak, speed
from models.convert import run_convert
from pipeline import config
from pipeline.decode.exactness import doctor
from pipeline.decode.generate import generate, read_text, score
from pipeline.launch import run_replay, run_serve
from pipeline.report import Failure
from pipeline.serve.zmq_api import run_ask

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"


def _verb(sub, name: str, fn, help: str, epilog: bool = False, profile: str = "TOML profile"):
    """A verb whose description is the first paragraph of `fn`'s docstring (with `epilog`, the rest follows the
    options as written); `profile`: the help of its --config ("" = none)."""
    about, _, rest = inspect.getdoc(fn).partition("\n\n")
    extra = {"epilog": rest, "formatter_class": argparse.RawDescriptionHelpFormatter} if epilog else {}
    p = sub.add_parser(name, help=help, description=about, **extra)
    if profile:
        p.add_argument("--config", help=f"{profile} (default: configs/default.toml)")
    return p


_defaults = functools.lru_cache(maxsize=1)(config.load)       # the default profile, for the help's defaults


def _key(p, flag: str, key: str, help: str, **kw) -> None:
    """A flag for profile key `key` (its dest): given, it overrides the profile; left out, the profile's value holds."""
    section, name = key.split(".")
    if "choices" not in kw:
        kw["metavar"] = flag[2:].upper().replace("-", "_")
    value = getattr(getattr(_defaults(), section), name)
    p.add_argument(flag, dest=key, help=f"{help} (default: the profile's {key}, {value!r})", **kw)


def _stream(p, what: str) -> None:
    """The flags replay and serve share: where the lines come from, how fast, how often the model speaks."""
    p.add_argument("file", nargs="?", help="log file, tcp://HOST:PORT or - (default: the profile's replay.log)")
    p.add_argument("--format", choices=("plain", "csv", "jsonl"),
                   help="log format (default: from the file's extension; plain for sockets and stdin)")
    p.add_argument("--follow", action="store_true", help="follow the file as it grows (tail -f), from its end")
    p.add_argument("--speed", type=float, default=0.0, help="replay timing: 0 = as fast as possible, 1 = real time, "
                                                           "10 = ten times faster (serve: when --rate is 0)")
    _key(p, "--max-lines", "replay.max_lines", "stop reading after N lines (0: all)", type=int)
    _key(p, "--every", "replay.every_lines", f"lines between {what}", type=int)
    p.add_argument("--quiet-lines", action="store_true", help=f"print only the {what}, not every log line")
    p.add_argument("--journal", help=f"append-only JSONL journal of {what} and the final figures")


def _model(p) -> None:
    _key(p, "--model", "model.gguf", "GGUF file (\"default\": the bundled SmolLM2-135M-Instruct Q4_1, fetched once)")
    _key(p, "--threads", "model.threads", "ONNX Runtime intra-op threads", type=int)


def _decoding(p) -> None:
    _key(p, "--sink", "cache.sink", "attention-sink slots, with --window", type=int)
    p.add_argument("--window", dest="cache.window", metavar="WINDOW", type=int, help="the ring policy: attend to the "
                   "sinks and the W most recent tokens (default: a plain full cache, sized to the text)")
    _model(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="run.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = top.add_subparsers(dest="verb")

    p = _verb(sub, "replay", run_replay, "run the pipeline over a log with running assessments (the main job)", True)
    _stream(p, "assessments")
    _key(p, "--launcher", "actors.launcher", "local, ray or serial", choices=("local", "ray", "serial"))
    _key(p, "--ray-address", "actors.ray_address", "join this Ray cluster (\"auto\", host:port), not a local one")
    p.add_argument("--pub", help="zmq endpoint to publish every event on (e.g. tcp://127.0.0.1:5599)")
    p.set_defaults(run=lambda a: run_replay(_profile(a), a.file, a.format, a.speed, a.follow, a.journal, a.pub,
                                            a.quiet_lines))

    p = _verb(sub, "serve", run_serve, "the pipeline with operators' questions: OpenAI-compatible HTTP API, web "
                                       "console, zmq questions", True, "TOML profile; [serve] holds the defaults")
    _stream(p, "analyses")
    p.add_argument("--rate", type=float, default=0.0, help="replay at this many lines per second (0: --speed)")
    p.add_argument("--loop", action="store_true", help="replay the file over and over (a demo gateway)")
    _key(p, "--http", "serve.http", "HOST:PORT of the HTTP API and console (\"\" = off)")
    _key(p, "--zmq", "serve.zmq", "zmq request endpoint (\"\" = off)")
    _key(p, "--pub", "serve.pub", "zmq PUB endpoint of analyses and events (\"\" = off)")
    _key(p, "--api-key", "serve.api_key", "required from clients (needed for a non-loopback --http)")
    _key(p, "--archive", "serve.archive", "SQLite FTS5 archive of every line (\"\": $RINGSPEC_HOME/archive/...)")
    _key(p, "--launcher", "actors.launcher", "local or ray", choices=("local", "ray"))
    p.set_defaults(run=lambda a: run_serve(_profile(a, {"serve.enabled": True}), a.file, a.format, a.rate, a.speed,
                                           a.loop, a.follow, a.journal, a.quiet_lines))

    p = _verb(sub, "ask", run_ask, "ask a running `serve` a question over zmq; the answer streams to stdout")
    p.add_argument("question", help="the question, e.g. \"why did the reactor pressure alarm fire?\"")
    _key(p, "--zmq", "serve.zmq", "the server's zmq endpoint")
    p.add_argument("--max-tokens", type=int, help="answer length bound (default: the server's)")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds without a reply")
    p.add_argument("--json", action="store_true", help="print the final reply (text, usage, retrieved lines) as JSON")
    p.set_defaults(run=lambda a: run_ask(_profile(a).serve.zmq, a.question, a.max_tokens, a.timeout, not a.json))

    p = _verb(sub, "eval-recall", recall.run_eval_recall, "questions about events that left the window: retrieval "
              "recall@k and exact answers with and without the archive", profile="TOML profile the model answers with")
    p.add_argument("--logs", default=str(SHARED / "data/tep_alarms"), help="a TEP CSV or a directory of them")
    p.add_argument("--per-log", type=int, default=1, help="questions per log")
    p.add_argument("--max-questions", type=int, default=40, help="answer at most this many (spread over the set)")
    p.add_argument("--k", type=int, default=4, help="lines retrieved per question (default %(default)s: the "
                   "evaluation's own; the server's is the profile's serve.retrieve)")
    p.add_argument("--json", action="store_true", help="print the result, with every answer, as JSON")
    p.set_defaults(run=lambda a: recall.run_eval_recall(_profile(a, {"serve.enabled": True}), a.logs, a.per_log,
                                                        a.max_questions, a.k))

    p = _verb(sub, "generate", generate, "generate from a prompt; --json prints one JSON object")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--prompt-file", help="file holding the prompt (UTF-8)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default %(default)s)")
    for flag, help, kind in (("temperature", "0: greedy", float), ("top-k", "0: all tokens", int),
                             ("top-p", "nucleus mass", float), ("seed", "sampling seed", int)):
        _key(p, f"--{flag}", f"sampling.{flag.replace('-', '_')}", help, type=kind)
    _key(p, "--draft", "draft.kind", "none: target only; suffix: from the text already seen; model: a draft GGUF; "
         "hybrid: suffix when the text matches, else the draft GGUF", choices=("none", "suffix", "model", "hybrid"))
    _key(p, "--draft-model", "draft.model", "draft GGUF sharing the target's tokenizer, for --draft model or hybrid")
    _key(p, "--draft-len", "draft.length", "proposals per verify pass", type=int)
    _key(p, "--siblings", "draft.siblings", "token trees (--draft suffix or hybrid): up to N other first tokens, each "
         "with what followed it in the text, verified beside the chain in the same pass (0: a chain)", type=int)
    _decoding(p)
    p.set_defaults(run=lambda a: generate(a.prompt if a.prompt is not None else read_text(a.prompt_file),
                                          chat=a.chat, max_tokens=a.max_tokens, **_serial(a)))

    p = _verb(sub, "score", score, "teacher-forced mean NLL of a text; --json prints one JSON object")
    p.add_argument("--text-file", required=True, help="the text (UTF-8)")
    _decoding(p)
    p.set_defaults(run=lambda a: score(read_text(a.text_file), **_serial(a)))

    p = _verb(sub, "convert", run_convert, "convert a llama/qwen2 GGUF into an ONNX model directory", profile="")
    p.add_argument("gguf", help="a llama or qwen2 GGUF")
    p.add_argument("--out", dest="out_dir", metavar="OUT", required=True, help="weights.bin, card.json, graphs here")
    p.add_argument("--graph", action="append", default=[], metavar="T,S,R",
                   help="also build the static-shape graph for T rows, S sinks, R ring slots (repeatable)")
    p.set_defaults(run=lambda a: run_convert(a.gguf, a.out_dir, a.graph))

    p = _verb(sub, "bench", speed.run_bench, "speed of every system (ringspec modes, llama.cpp) side by side, one run",
              profile="TOML profile every system's keys are set over (--task operator: the server's)")
    p.add_argument("--task", choices=("log", "analysis", "all", "operator"), default="all", help="see above")
    p.add_argument("--log", help="log to take prompts from (default: the profile's replay.log)")
    p.add_argument("--offsets", type=int, default=5, help="prompts per task, spread over the log (at least 5)")
    p.add_argument("--repeats", type=int, default=3, help="runs of every prompt by every system")
    _key(p, "--window", "cache.window", "ring window (pool: the profile's sinks + W; nothing wraps)", type=int)
    _key(p, "--threads", "model.threads", "ONNX Runtime threads of every system", type=int)
    _key(p, "--draft-model", "draft.model", "the neural draft of the draft and hybrid systems (none: leave them out)")
    p.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out even when installed")
    p.add_argument("--systems", default="", help="comma-separated systems to run (default: all; target_only always)")
    p.add_argument("--unpadded", action="store_true", help="also every ringspec system without the padding rule")
    p.add_argument("--json", action="store_true", help="print {task: {system: figures}, \"_meta\": ...} as JSON")
    p.add_argument("--out", help="also write the result (with run metadata) to this JSON file")
    p.add_argument("--rate", type=float, default=20.0, help="operator: the stream's lines per second")
    p.add_argument("--questions", type=int, default=20, help="operator: questions per configuration")
    p.add_argument("--rates", default="4,6,8,10,20", help="operator: line rates to try for keeping up")
    p.add_argument("--seconds", type=float, default=40.0, help="operator: seconds per line rate")
    p.set_defaults(run=lambda a: operators.run_operator_bench(_profile(a), a.config, a.log, a.rate, a.questions,
                                                              a.rates, a.seconds) if a.task == "operator" else
                   speed.run_bench(_profile(a), a.config, a.log, a.task, a.offsets, a.repeats, a.systems,
                                   not a.no_llama_cpp, a.unpadded))

    p = _verb(sub, "doctor", doctor, "is speculation exact on this CPU? rows probed bit for bit; exit 1 if not")
    _key(p, "--max-rows", "model.max_rows", "largest pass", type=int)
    _key(p, "--accuracy-level", "model.accuracy_level", "MatMulNBits accuracy level", type=int)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    _model(p)
    p.set_defaults(run=lambda a: doctor(_profile(a)))

    p = _verb(sub, "draft-scan", draftscan.run_scan, "acceptance and cost of drafts cut from the target's blocks")
    p.add_argument("candidates", nargs="*", help="block lists (default: six early-exit, strided and range cuts)")
    p.add_argument("--log", help="log to take prompts from (default: the profile's replay.log)")
    p.add_argument("--task", choices=("log", "analysis"), default="log", help="the bench task whose prompts run")
    p.add_argument("--offsets", type=int, default=3, help="prompts, spread over the log")
    _key(p, "--draft-len", "draft.length", "proposals per verify", type=int)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=lambda a: draftscan.run_scan(_profile(a), a.config, a.log, a.candidates, a.offsets, a.task))

    p = _verb(sub, "distill", distill.run_distill, "train a small neural draft on the target's own output (needs the "
                                                   "train extra)", profile="")
    p.add_argument("--logs", default=str(SHARED / "data/tep_alarms"), help="directory of training CSV logs")
    p.add_argument("--held-out", nargs="*", default=[str(ROOT / "data/tep_demo.csv")], help="logs never trained on")
    p.add_argument("--out", dest="gguf_out", metavar="OUT", help="the draft GGUF (default: $RINGSPEC_HOME/drafts/"
                                                                 "distilled.gguf)")
    p.add_argument("--train-logs", type=int, default=distill.Recipe.logs, help="training logs used, spread over --logs")
    p.add_argument("--continuations", type=int, default=distill.Recipe.continuations,
                   help="target continuations per training log and task (about 2.5 s each on two cores)")
    p.add_argument("--steps", type=int, default=distill.Recipe.steps, help="training steps")
    p.add_argument("--vocab", type=int, default=distill.DraftShape.vocab, help="draft sub-vocabulary size")
    p.add_argument("--d-model", type=int, default=distill.DraftShape.d_model, help="width (a multiple of 64)")
    p.add_argument("--layers", type=int, default=distill.DraftShape.n_layers, help="transformer blocks")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(run=lambda a: distill.run_distill(a.logs, a.held_out, a.gguf_out, a.train_logs, a.continuations,
                                                     a.steps, a.vocab, a.d_model, a.layers))

    p = _verb(sub, "pipeline-bench", pipeline_vs_serial.run_compare, "pipelined (actors) vs serial (one process), "
              "same draft, one run", profile="TOML profile for both sides")
    p.add_argument("--log", default=str(SHARED / "data/tep_alarms/filter/text_alarms_filter_5.csv"), help="the log")
    p.add_argument("--max-lines", type=int, default=100, help="lines per run (the bench's own, not replay.max_lines)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=lambda a: pipeline_vs_serial.run_compare(_profile(a), a.config, a.log, a.max_lines, a.repeats))

    p = _verb(sub, "soak", soak.run_soak, "loop a log through the pipeline at full speed; sample memory and quality")
    p.add_argument("--tokens", type=int, required=True, help="stream tokens to push through")
    p.add_argument("--log", help="the log to loop, a period of at least 4 windows (default: the profile's replay.log)")
    p.add_argument("--every", type=int, default=5000, help="sample every N stream tokens")
    p.add_argument("--json", action="store_true", help="print the result without the samples as one JSON object")
    p.add_argument("--out", help="write the full result (samples included) as JSON")
    p.add_argument("--plot", help="resident memory per actor over tokens, .svg")
    p.set_defaults(run=lambda a: soak.run_soak(_profile(a), a.log, a.tokens, a.every, a.plot))

    p = _verb(sub, "eval-stream", perplexity.run_eval, "streaming perplexity of a log under several cache policies")
    p.add_argument("--log", required=True, help="log file (plain lines, TEP alarm CSV or JSON lines), or a "
                   "directory whose files are read as one stream in natural order (filter_2 before filter_10)")
    p.add_argument("--format", choices=("plain", "csv", "jsonl"), help="log format (default: from the extension)")
    p.add_argument("--max-tokens", type=int, default=0, help="score at most N tokens of the stream (0: all)")
    p.add_argument("--sink", help="sinks S (default: the profile's cache.sink); a list (0,1,2,4,8): an ablation")
    p.add_argument("--window", default=str(perplexity.WINDOW), help="window W (default %(default)s, the evaluation's "
                   "own, not the profile's cache.window); a list (128,256,512): an ablation")
    p.add_argument("--modes", default=",".join(perplexity.MODES),
                   help="comma-separated modes (an ablation runs sink per (S, W), plus recompute per W if listed)")
    p.add_argument("--stride", type=int, help="recompute stride (default W//8, at most W/8)")
    p.add_argument("--naive-offset", type=int, default=1_000_000, help="naive: first absolute position")
    p.add_argument("--dense-budget-mb", type=float, default=1024.0, help="dense: KV memory budget in MB")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object: mode -> figures")
    p.add_argument("--out", help="write figures, NLL series and run metadata (_meta) to this JSON file")
    p.add_argument("--plot", help="NLL over position: .svg (labelled) or .png; for an ablation, PPL over S or W (SVG)")
    p.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    _model(p)
    p.set_defaults(run=lambda a: perplexity.run_eval(_profile(a), a.log, a.format, a.sink, a.window, a.modes,
                                                     a.max_tokens, a.stride, a.naive_offset, a.dense_budget_mb,
                                                     a.quiet, a.plot))
    return top


def _profile(args, extra: dict | None = None) -> config.Config:
    """The profile (--config) with every profile-key flag given on the command line (dest "section.key") over it."""
    given = {key: value for key, value in vars(args).items() if "." in key and value is not None}
    return config.load(getattr(args, "config", None), {**given, **(extra or {})})


def _serial(args) -> dict:
    """generate's and score's cfg (the serial engine, in this process) and ring: --window chooses the ring policy
    (sinks: --sink or the profile's); without it a plain full cache."""
    ring = getattr(args, "cache.window") is not None
    if getattr(args, "cache.sink") and not ring:
        raise ValueError("--sink needs --window (the ring policy)")
    return {"cfg": _profile(args, {"actors.launcher": "serial"}), "ring": ring}


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


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        args = args if args.verb else parser().parse_args(["replay"])
        return show(args.run(args), getattr(args, "json", False), getattr(args, "out", None))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, RuntimeError) as exc:   # start-up, input and actor errors: one line, no traceback
        print(f"ringspec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

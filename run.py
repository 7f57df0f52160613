#!/usr/bin/env python3
"""ringspec command line: a thin layer over pipeline/ and models/; each verb parses, calls one function, prints.

  python run.py                      replay the bundled alarm log with running assessments (the main job)
  python run.py replay FILE          the same on your own log
  python run.py generate --prompt .. generate text (optionally with a draft), --json for scripts
  python run.py score --text-file F  teacher-forced mean NLL of a text, full cache or ring policy
  python run.py convert MODEL.gguf   convert a llama/qwen2 GGUF into ONNX graphs + weights + model card
  python run.py bench                every system's decode speed on the same prompts (llama.cpp too), one run
  python run.py eval-stream --log F  streaming perplexity under sink/window/recompute/naive/dense policies
  python run.py pipeline-bench       the actor pipeline vs the serial engine with the same draft, side by side
  python run.py soak --tokens N      a log looped through the pipeline: memory slopes, descriptors, PPL drift
  python run.py serve                the pipeline answering operators: OpenAI-compatible HTTP API, console, zmq
  python run.py ask "question"       ask a running server over zmq; the answer streams as it is decoded
  python run.py distill              train a small neural draft on the target's own output (the train extra)
  python run.py doctor               is speculation exact on this CPU? rows probed bit for bit (exit 1 if not)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import textwrap
from pathlib import Path

from bench import distill, draftscan, perplexity, pipeline_vs_serial, recall_questions, soak, speed
from bench import operators as ob
from bench.distill import Recipe
from bench.recall import answer_rate
from kernels.sampling import SamplingParams
from models.convert import convert, load_card
from models.draftnet import DraftShape
from models.graph import ensure_graph
from models.registry import home
from pipeline import config
from pipeline.decode.exactness import doctor
from pipeline.decode.generate import generate, score
from pipeline.launch import run_pipeline
from pipeline.serve.zmq_api import ask
from pipeline.stream.records import format_of
from pipeline.stream.replay import replay

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))


def _add_model(p):
    p.add_argument("--model", default="default", help="GGUF file (default: the bundled SmolLM2-135M-Instruct Q4_1, "
                                                      "fetched once into the cache)")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (default 2)")


def _add_policy(p):
    p.add_argument("--sink", type=int, default=None, help="attention-sink slots (with --window; default 4)")
    p.add_argument("--window", type=int, default=None,
                   help="ring policy: attend to the sinks and the W most recent tokens (default: a plain full cache)")


def parser() -> argparse.ArgumentParser:

    top = argparse.ArgumentParser(prog="run.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = top.add_subparsers(dest="verb")

    p = sub.add_parser("replay", help="run the pipeline over a log with running assessments (the main job)",
                       description="Stream a log (plain lines, TEP alarm CSV or JSON lines) through the pipeline: "
                                   "ingest, cache owner, target, draft and output actors. Every N lines the model "
                                   "writes a short assessment of what it has seen. SIGINT/SIGTERM drain the "
                                   "pipeline (twice: stop now); SIGUSR1 prints every actor's figures.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=textwrap.dedent("""\
                           sources:
                             FILE                 replay a captured file (--speed scales its timing)
                             FILE --follow        tail -f FILE, surviving rename and copytruncate rotation
                             tcp://HOST:PORT      a line server; clients connect one after another
                             -                    standard input
                           launchers (--launcher, or [actors] launcher in the profile):
                             local   one process per actor over shared-memory channels (default)
                             ray     the same actors as five named Ray actors on one node (--ray-address joins
                                     a cluster; otherwise a local Ray instance is started and stopped)
                             serial  everything in this process (the reference the pipeline must equal)"""))
    p.add_argument("file", nargs="?", help="log file, tcp://HOST:PORT or - (default: the profile's replay.log, "
                                           "the bundled TEP log)")
    p.add_argument("--format", choices=("plain", "csv", "jsonl"),
                   help="log format (default: from the file's extension; plain for sockets and stdin)")
    p.add_argument("--follow", action="store_true", help="follow the file as it grows (tail -f), from its end")
    p.add_argument("--config", help="TOML profile (default: configs/default.toml)")
    p.add_argument("--max-lines", type=int, default=0, help="stop after N lines (0: all)")
    p.add_argument("--every", type=int, help="lines between assessments (overrides replay.every_lines)")
    p.add_argument("--quiet-lines", action="store_true", help="print only the assessments, not every log line")
    p.add_argument("--launcher", choices=("local", "ray", "serial"),
                   help="local, ray or serial (default: the profile's actors.launcher, local)")
    p.add_argument("--ray-address", help="join this Ray cluster (\"auto\", host:port) instead of starting one")
    p.add_argument("--journal", help="append-only JSONL journal of assessments and the final figures")
    p.add_argument("--pub", help="zmq endpoint to publish every event on (e.g. tcp://127.0.0.1:5599)")
    p.add_argument("--speed", type=float, default=0.0, help="replay timing: 0 = as fast as possible, 1 = real "
                                                           "time, 10 = ten times faster")

    p = sub.add_parser("serve", help="the pipeline with operators' questions: OpenAI-compatible HTTP API, web "
                                     "console, zmq questions",
                       description="Run the pipeline over a log and answer operators' questions while it flows. A "
                                   "question goes ahead of stream prefill and analyses, is answered from the current "
                                   "context plus older lines retrieved from the archive (every ingested line is "
                                   "indexed in SQLite FTS5), and streams its tokens as they are committed; the "
                                   "stream's lines wait in a bounded backlog meanwhile. After the stream ends the "
                                   "server keeps answering until SIGINT/SIGTERM.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=textwrap.dedent("""\
                           endpoints (HTTP):
                             /                         web console: live tail, analyses, chat, gauges
                             /v1/chat/completions      OpenAI chat API ("stream": true for server-sent events)
                             /v1/completions           OpenAI completions: the prompt continues the log
                             /healthz, /metrics        health, Prometheus metrics
                           zmq: python run.py ask "when did PIR108 last go HIGH HIGH?"
                           A non-loopback --http needs --api-key (or serve.api_key); clients send
                           Authorization: Bearer KEY."""))
    p.add_argument("file", nargs="?", help="log file, tcp://HOST:PORT or - (default: the profile's replay.log)")
    p.add_argument("--format", choices=("plain", "csv", "jsonl"), help="log format (default: from the extension)")
    p.add_argument("--follow", action="store_true", help="follow the file as it grows (tail -f), from its end")
    p.add_argument("--rate", type=float, default=0.0, help="replay at this many lines per second (0: --speed)")
    p.add_argument("--speed", type=float, default=0.0, help="replay timing when --rate is 0: 1 = real time, "
                                                           "0 = as fast as possible")
    p.add_argument("--loop", action="store_true", help="replay the file over and over (a demo gateway)")
    p.add_argument("--max-lines", type=int, default=0, help="stop reading after N lines (0: all)")
    p.add_argument("--config", help="TOML profile (default: configs/default.toml); [serve] holds the defaults below")
    p.add_argument("--http", help="HOST:PORT of the HTTP API and console (default 127.0.0.1:8080; \"\" = off)")
    p.add_argument("--zmq", help="zmq request endpoint (default tcp://127.0.0.1:7701; \"\" = off)")
    p.add_argument("--pub", help="zmq PUB endpoint of analyses and events (default tcp://127.0.0.1:7702)")
    p.add_argument("--api-key", help="required from clients (needed for a non-loopback --http)")
    p.add_argument("--archive", help="SQLite FTS5 archive of every line (default $RINGSPEC_HOME/archive/"
                                     "stream.sqlite)")
    p.add_argument("--journal", help="append-only JSONL journal of analyses, answers and the final figures")
    p.add_argument("--quiet-lines", action="store_true", help="print only analyses and answers")
    p.add_argument("--every", type=int, help="lines between analyses (overrides replay.every_lines)")
    p.add_argument("--launcher", choices=("local", "ray"), help="local (default) or ray")

    p = sub.add_parser("ask", help="ask a running `serve` a question over zmq; the answer streams to stdout")
    p.add_argument("question", help="the question, e.g. \"why did the reactor pressure alarm fire?\"")
    p.add_argument("--zmq", default="tcp://127.0.0.1:7701", help="the server's zmq endpoint (default %(default)s)")
    p.add_argument("--max-tokens", type=int, help="answer length bound (default: the server's)")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds without a reply")
    p.add_argument("--json", action="store_true", help="print the final reply (text, usage, retrieved lines) as JSON")

    p = sub.add_parser("eval-recall", help="questions about events that left the window: retrieval recall@k and "
                                           "exact answers with and without the archive",
                       description="Build questions over TEP alarm logs whose answers lie only outside the model's "
                                   "window (\"When did AIR003_1 last go LOW?\", answered by a clock time), measure "
                                   "how often the archive (SQLite FTS5) retrieves the answering line among k, and "
                                   "how often the real model's answer contains the right time with and without "
                                   "the retrieved lines.")
    p.add_argument("--logs", default=str(SHARED / "data" / "tep_alarms"), help="a TEP CSV or a directory of them "
                                                                            "(searched recursively)")
    p.add_argument("--per-log", type=int, default=1, help="questions per log")
    p.add_argument("--max-questions", type=int, default=40, help="answer at most this many (spread over the set)")
    p.add_argument("--k", type=int, default=4, help="lines retrieved per question (serve.retrieve)")
    p.add_argument("--json", action="store_true", help="print the result, with every answer, as JSON")

    p = sub.add_parser("generate", help="generate from a prompt; --json prints one JSON object",
                       description="Generate text; greedy unless --temperature > 0. With a draft, output is "
                                   "exactly what the target alone produces (lossless speculative decoding).")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--prompt-file", help="file holding the prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft", choices=("none", "suffix", "model", "hybrid"), default="none",
                   help="none: target only; suffix: draft from the text already seen; model: a draft GGUF; hybrid: "
                        "suffix when the text matches, the draft GGUF otherwise")
    p.add_argument("--draft-model", default="default-draft",
                   help="draft GGUF sharing the target's tokenizer (--draft model or hybrid; default: the bundled "
                        "draft distilled for the default model)")
    p.add_argument("--draft-len", type=int, default=6, help="proposals per verify pass")
    p.add_argument("--siblings", type=int, default=0,
                   help="token trees (--draft suffix or hybrid): up to N other first tokens, each with what followed "
                        "it in the text, verified beside the chain in the same pass (0: a chain)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    _add_policy(p)
    _add_model(p)

    p = sub.add_parser("score", help="teacher-forced mean NLL of a text; --json prints one JSON object")
    p.add_argument("--text-file", required=True)
    p.add_argument("--json", action="store_true")
    _add_policy(p)
    _add_model(p)

    p = sub.add_parser("convert", help="convert a llama/qwen2 GGUF into an ONNX model directory")
    p.add_argument("gguf")
    p.add_argument("--out", required=True, help="output directory (weights.bin, card.json, graphs on demand)")
    p.add_argument("--graph", action="append", default=[], metavar="T,S,R",
                   help="also build the static-shape graph for T rows, S sinks, R ring slots (repeatable)")
    p = sub.add_parser("bench", help="speed of every system (ringspec modes, llama.cpp) side by side, one run",
                       description="Greedy decoding of the same prompts by every system, each in its own worker "
                                   "process confined to the same two cores, alternated per prompt; medians "
                                   "printed. Tasks: log (line-aligned 512-token prefixes, 256 tokens, no wrap) and "
                                   "analysis (the replay's chat frame around a 512-token window, 'summarise the "
                                   "most severe alarms above', 128 tokens). llama.cpp joins when llama-cpp-python "
                                   "is installed (pip install -e '.[bench]'). Exits 3 if a ringspec system's tokens "
                                   "differ from target_only's.")
    p.add_argument("--task", choices=("log", "analysis", "all", "operator"), default="all",
                   help="operator: a real `serve` answering 30-token questions while the log replays at --rate "
                        "lines/s (TTFT and answer tok/s, p50 and p95, with and without retrieval), then the line "
                        "rates of --rates with a question every 5 s: does ingestion keep up?")
    p.add_argument("--log", default=str(ROOT / "data/tep_demo.csv"), help="log to take prompts from")
    p.add_argument("--rate", type=float, default=20.0, help="operator: the stream's lines per second")
    p.add_argument("--questions", type=int, default=20, help="operator: questions per configuration")
    p.add_argument("--rates", default="4,6,8,10,20", help="operator: line rates to try for keeping up")
    p.add_argument("--seconds", type=float, default=40.0, help="operator: seconds per line rate")
    p.add_argument("--config", help="operator: the server's TOML profile (default: configs/default.toml)")
    p.add_argument("--offsets", type=int, default=5, help="prompts per task, spread over the log (at least 5)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--window", type=int, default=1024, help="ring window (pool: 4 sinks + W; nothing wraps)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-model", default="default-draft",
                   help="the neural draft of the draft_serial, hybrid_serial and pipelined_hybrid systems (default: "
                        "the bundled draft distilled for the default model; none leaves them out)")
    p.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out even when installed")
    p.add_argument("--systems", default="", help="comma-separated system names to run (target_only, the "
                   "reference, always runs; default: all)")
    p.add_argument("--unpadded", action="store_true",
                   help="also run every ringspec system without the one-row padding rule (NAME_unpadded), "
                        "alternated with the rest: what exactness on every CPU costs (python run.py doctor)")
    p.add_argument("--json", action="store_true", help="print {task: {system: figures}, \"_meta\": run metadata "
                                                       "(platform, exactness verdicts, goals)} as one JSON object")
    p.add_argument("--out", help="also write the result (with run metadata) to this JSON file")

    p = sub.add_parser("doctor", help="is speculation exact on this CPU? rows probed bit for bit; exit 1 if not",
                       description="Probe whether a row's logits and K/V are the same bits whatever the number of "
                                   "rows in its pass (batch invariance), which greedy identity with a draft needs. "
                                   "Prints the ONNX Runtime version, the CPU and the ISA features this process sees "
                                   "(CPUID / auxiliary vector), each operator family of the graph run alone at the "
                                   "model's shapes (1..64 rows), and the whole pass: rows decoded one pass each "
                                   "against the same rows in blocks of 2-8 and a token tree, at a small position "
                                   "and past 2^31, with the one-row padding rule (what the engine runs) and without "
                                   "it. Exits 0 when the engine's passes are invariant, 1 when not: qualify a new "
                                   "ONNX Runtime or CPU with it. The engine runs the whole-pass probe at start-up.")
    p.add_argument("--max-rows", type=int, default=32, help="largest pass (default 32, the profile's)")
    p.add_argument("--accuracy-level", type=int, default=4, help="MatMulNBits accuracy level (default 4)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    _add_model(p)

    p = sub.add_parser("draft-scan", help="acceptance and cost of drafts cut from the target's blocks",
                       description="Cuts drafts from the default model (a subset of its transformer blocks; "
                                   "embeddings, final norm and head shared), caches them under $RINGSPEC_HOME/drafts "
                                   "and runs each as the serial engine's draft on the bench prompts beside "
                                   "target-only. Candidates: block lists like 0-5,12-29 or strided ranges like "
                                   "0-29:2, separated by spaces.")
    p.add_argument("candidates", nargs="*", help="block lists (default: six early-exit, strided and range cuts)")
    p.add_argument("--log", default=str(ROOT / "data/tep_demo.csv"))
    p.add_argument("--task", choices=("log", "analysis"), default="log")
    p.add_argument("--offsets", type=int, default=3)
    p.add_argument("--draft-len", type=int, default=3, help="proposals per verify")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("distill", help="train a small neural draft on the target's own output (needs the train extra)",
                       description="Builds a training set from TEP logs (rendered as replay renders them) and the "
                                   "target's greedy continuations of them for both bench tasks, chooses the draft's "
                                   "sub-vocabulary (the most frequent target tokens; the rest have draft probability "
                                   "0), trains a small llama on two cores and writes it as a Q8_0 GGUF with a JSON "
                                   "report beside it (vocabulary coverage, the draft's top-1 agreement with the target "
                                   "on held-out continuations, the loss curve). The continuations are cached under "
                                   "$RINGSPEC_HOME/distill. The held-out logs (the bench's, by default) are skipped by "
                                   "content. Measure the result with `bench --draft-model OUT`.")
    p.add_argument("--logs", default=str(SHARED / "data" / "tep_alarms"), help="directory of training CSV logs")
    p.add_argument("--held-out", nargs="*", default=[str(ROOT / "data/tep_demo.csv")],
                   help="logs never trained on (default: the bench's log)")
    p.add_argument("--out", help="the draft GGUF (default: $RINGSPEC_HOME/drafts/distilled.gguf)")
    p.add_argument("--train-logs", type=int, default=Recipe.logs, help="training logs used, spread over --logs")
    p.add_argument("--continuations", type=int, default=Recipe.continuations,
                   help="target continuations per training log and task (about 2.5 s each on two cores)")
    p.add_argument("--steps", type=int, default=Recipe.steps, help="training steps")
    p.add_argument("--vocab", type=int, default=DraftShape.vocab, help="draft sub-vocabulary size")
    p.add_argument("--d-model", type=int, default=DraftShape.d_model)
    p.add_argument("--layers", type=int, default=DraftShape.n_layers)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")

    p = sub.add_parser("pipeline-bench", help="pipelined (actors) vs serial (one process), same draft, one run",
                       description="Replays a log through the serial engine and through the local actor pipeline, "
                                   "alternating, with the same profile (so the same draft); prints medians of "
                                   "decode speed, tokens per verify, the pipeline overhead share (decode wall time "
                                   "outside the target's forward passes) and the draft/verify overlap, and whether "
                                   "every assessment was the same text in every run.")
    p.add_argument("--log", default=str(SHARED / "data/tep_alarms/filter/text_alarms_filter_5.csv"))
    p.add_argument("--config", help="TOML profile for both sides (default: configs/default.toml)")
    p.add_argument("--max-lines", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("soak", help="loop a log through the pipeline at full speed; sample memory and quality",
                       description="Replays a real log over and over through the local actor pipeline (analyses as "
                                   "configured), samples every actor's resident and anonymous memory, descriptors, "
                                   "threads and the shared-memory segments every few thousand tokens, and reports "
                                   "slopes after a 10%% warm-up, the spread, and the PPL of the last complete loop "
                                   "against the first.")
    p.add_argument("--tokens", type=int, required=True, help="stream tokens to push through")
    p.add_argument("--log", default=str(ROOT / "data" / "tep_demo.csv"),
                   help="the log to loop (its loop period should be at least 4 x the window)")
    p.add_argument("--config", help="TOML profile (default: configs/default.toml)")
    p.add_argument("--every", type=int, default=5000, help="sample every N stream tokens")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", help="write the full result (samples included) as JSON")
    p.add_argument("--plot", help="resident memory per actor over tokens, .svg")

    p = sub.add_parser("eval-stream", help="streaming perplexity of a log under several cache policies",
                       description="Teacher-forced NLL of a rendered log under each policy (sink, window, "
                                   "recompute, naive, dense); --json prints one object mapping each mode to its "
                                   "figures (ppl, ppl_post_wrap, ...); run metadata and NLL series go to --out.")
    p.add_argument("--log", required=True, help="log file (plain lines, TEP alarm CSV or JSON lines), or a "
                   "directory whose files are read as one stream in natural order (filter_2 before filter_10)")
    p.add_argument("--format", choices=("plain", "csv", "jsonl"), help="log format (default: from the extension)")
    p.add_argument("--max-tokens", type=int, default=0, help="score at most N tokens of the stream (0: all)")
    p.add_argument("--sink", default="4", help="attention sinks S (default 4); a list (0,1,2,4,8) runs an ablation")
    p.add_argument("--window", default="256", help="window W (default 256); a list (128,256,512) runs an ablation")
    p.add_argument("--modes", default="sink,window,recompute,naive,dense",
                   help="comma-separated modes (an ablation runs sink per (S, W), plus recompute per W if listed)")
    p.add_argument("--stride", type=int, help="recompute stride (default W//8, at most W/8)")
    p.add_argument("--naive-offset", type=int, default=1_000_000, help="naive: first absolute position")
    p.add_argument("--dense-budget-mb", type=float, default=1024.0, help="dense: KV memory budget in MB")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object: mode -> figures")
    p.add_argument("--out", help="write figures, NLL series and run metadata (_meta) to this JSON file")
    p.add_argument("--plot", help="NLL over position: .svg (labelled) or .png; for an ablation, PPL over S or W (SVG)")
    p.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    _add_model(p)
    return top


def _fail(msg: str, code: int = 2) -> int:
    print(f"ringspec: error: {msg}", file=sys.stderr)
    return code


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    verb = args.verb or "replay"
    try:
        return VERBS[verb](args)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, RuntimeError) as exc:   # start-up, input and actor errors: one line, no traceback
        return _fail(str(exc))


def cmd_replay(args) -> int:

    overrides = {"replay.every_lines": args.every} if getattr(args, "every", None) else {}
    if getattr(args, "launcher", None):
        overrides["actors.launcher"] = args.launcher
    if getattr(args, "ray_address", None):
        overrides["actors.ray_address"] = args.ray_address
    cfg = config.load(getattr(args, "config", None), overrides)
    log = getattr(args, "file", None) or str(ROOT / cfg.replay.log if not Path(cfg.replay.log).is_absolute()
                                             else cfg.replay.log)
    fmt = getattr(args, "format", None)
    quiet = getattr(args, "quiet_lines", False)

    def emit(kind, payload):
        if kind == "line" and not quiet:
            print(f"  {payload.text}")
        elif kind == "assessment":
            st = payload["stats"]
            text = payload["text"].replace("\n", "\n   ")
            print(f"\n>> [after line {payload['lines']}, {payload['trigger']}] {text}\n"
                  f"   ({st['generated']} tokens, {st['tokens_per_s']:.0f} tok/s, ttft {st['ttft_ms']:.0f} ms, "
                  f"{st['accepted_per_verify']:.2f} tokens/verify)\n", flush=True)

    max_lines = getattr(args, "max_lines", 0) or cfg.replay.max_lines
    if cfg.actors.launcher != "serial":
        run_pipeline(cfg, _source(log, fmt, max_lines, getattr(args, "speed", 0.0), getattr(args, "follow", False)),
                     journal=getattr(args, "journal", None), pub=getattr(args, "pub", None), quiet_lines=quiet)
        return 0
    if log.startswith("tcp://") or log == "-" or getattr(args, "follow", False):
        raise ValueError("the serial launcher replays files only; use --launcher local for sockets, stdin, --follow")
    totals = replay(log, fmt, cfg, emit, max_lines=max_lines)
    print(f"replayed {totals['lines']} lines ({totals['stream_tokens']} tokens), {totals['assessments']} "
          f"assessments, {totals['tokens_per_s']:.0f} tok/s decode, {totals['wall_s']:.1f} s")
    return 0


def cmd_serve(args) -> int:

    overrides = {"serve.enabled": True}
    for key in ("http", "zmq", "pub", "api_key", "archive"):
        if getattr(args, key) is not None:
            overrides[f"serve.{key}"] = getattr(args, key)
    if args.every:
        overrides["replay.every_lines"] = args.every
    if args.launcher:
        overrides["actors.launcher"] = args.launcher
    cfg = config.load(args.config, overrides)
    if cfg.actors.launcher == "serial":
        raise ValueError("serve runs the actor pipeline: use launcher local or ray")
    log = args.file or str(ROOT / cfg.replay.log if not Path(cfg.replay.log).is_absolute() else cfg.replay.log)
    source = _source(log, args.format, args.max_lines, args.speed, args.follow)
    if args.rate < 0:
        raise ValueError("--rate must be >= 0")
    if args.loop:
        if source["kind"] != "replay":
            raise ValueError("--loop replays a file; it cannot loop a socket, stdin or --follow")
        source["kind"] = "loop"
    source["rate"] = args.rate
    run_pipeline(cfg, source, journal=args.journal, pub=cfg.serve.pub or None, quiet_lines=args.quiet_lines)
    return 0


def cmd_ask(args) -> int:

    def show(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    reply = ask(args.zmq, args.question, args.max_tokens, args.timeout, on_delta=None if args.json else show)
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    meta = reply.get("ringspec", {})
    print()
    for line in meta.get("retrieved", []):
        print(f"  [retrieved: line {line['offset']} at {line['time'] or '?'}] {line['text']}", file=sys.stderr)
    ttft = meta.get("ttft_ms")
    print(f"({reply['usage']['completion_tokens']} tokens, {reply['finish_reason']}, ttft "
          f"{'-' if ttft is None else f'{ttft:.0f}'} ms, total {meta.get('total_ms', 0):.0f} ms)", file=sys.stderr)
    return 0


def _source(log: str, fmt: str | None, max_lines: int, speed: float, follow: bool) -> dict:
    """What the ingest actor reads, from the command line's FILE / tcp://HOST:PORT / - and flags."""


    src = {"max_lines": max_lines}
    if log.startswith("tcp://"):
        host, _, port = log[len("tcp://"):].rpartition(":")
        if not port.isdigit():
            raise ValueError(f"{log}: expected tcp://HOST:PORT")
        return {**src, "kind": "tcp", "host": host or "127.0.0.1", "port": int(port), "format": fmt or "plain"}
    if log == "-":
        return {**src, "kind": "stdin", "path": f"/proc/{os.getpid()}/fd/0", "format": fmt or "plain"}
    if not follow and not Path(log).is_file():
        raise FileNotFoundError(f"log file {log} does not exist")
    return {**src, "kind": "follow" if follow else "replay", "path": str(Path(log).resolve()),
            "format": fmt or format_of(log), "speed": speed}


def cmd_generate(args) -> int:

    prompt = args.prompt if args.prompt is not None else _read_text(args.prompt_file)
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    out = generate(prompt, args.chat, args.max_tokens, params, args.draft, args.draft_model, args.draft_len,
                         _sink(args), args.window, args.model, args.threads, siblings=args.siblings)
    if args.json:
        print(json.dumps(out))
    else:
        print(out["text"])
        st = out["stats"]
        print(f"\n[{st['generated']} tokens, {st['tokens_per_s']:.1f} tok/s, ttft {st['ttft_ms']:.0f} ms, "
              f"{st['accepted_per_verify']:.2f} tokens/verify]", file=sys.stderr)
    return 0


def cmd_score(args) -> int:

    out = score(_read_text(args.text_file), _sink(args), args.window, args.model, threads=args.threads)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['n_tokens']} tokens, mean NLL {out['nll_mean']:.4f}")
    return 0


def cmd_convert(args) -> int:

    card_path = convert(args.gguf, args.out)
    card = load_card(args.out)
    for spec in args.graph:
        T, S, R = (int(x) for x in spec.split(","))
        print(ensure_graph(Path(args.out), card, T, S, R))
    cfg = card["config"]
    print(textwrap.dedent(f"""\
        converted {args.gguf} -> {args.out}
          {cfg['arch']}: {cfg['n_layers']} layers, d={cfg['d_model']}, {cfg['n_heads']} heads / {cfg['n_kv_heads']} kv,
          vocab {cfg['vocab_size']}, weights {card['source']['tensor_types']}; card: {card_path}"""))
    return 0


def cmd_bench(args) -> int:

    if args.task == "operator":
        return _bench_operator(args)
    if args.offsets < 1 or args.repeats < 1:
        raise ValueError("--offsets and --repeats must be at least 1")

    def progress(task, repeat, k, name, res):
        print(f"  {task:8s} repeat {repeat} prompt {k} {name:18s} {res['tokens_per_s']:7.1f} tok/s  ttft "
              f"{res['ttft_ms']:6.0f} ms", file=sys.stderr, flush=True)

    tasks = speed.TASKS if args.task == "all" else (args.task,)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # unwind: the workers are closed on the way out
    try:
        draft = "" if args.draft_model == "none" else args.draft_model
        only = [name.strip() for name in args.systems.split(",") if name.strip()]
        out = speed.bench(args.log, tasks, args.offsets, args.repeats, args.threads, args.window, draft,
                          False if args.no_llama_cpp else None, progress, only, args.unpadded)
    except speed.Disagreement as exc:
        print(f"ringspec: bench: {exc}", file=sys.stderr)
        return 3
    if args.out:
        Path(args.out).write_text(json.dumps(out))
    if args.json:
        print(json.dumps(out))
        return 0
    fmt = lambda v, spec: "-" if v is None else format(v, spec)   # noqa: E731
    for name, verdict in out["_meta"]["exactness"].items():
        if not verdict["invariant"]:
            print(f"{name}: identity with target-only not claimed here: {verdict['where']}")
    for task in tasks:
        print(f"\n{task}: {out['_meta'][task + '_offsets']} offsets, medians of {args.repeats} repeats")
        print(f"{'system':22s} {'tok/s':>7s} {'ttft ms':>8s} {'tok/verify':>10s} {'overhead':>8s} {'peak MB':>8s} "
              f"{'loops':>6s} {'=target':>8s} {'~llama':>7s} {'salvaged':>8s}")
        for name, r in out[task].items():
            print(f"{name:22s} {r['tokens_per_s']:7.1f} {r['ttft_ms']:8.0f} {fmt(r['accepted_per_verify'], '10.2f'):>10s} "
                  f"{fmt(r['overhead_share'], '8.1%'):>8s} {r['peak_mb']:8.0f} {r['loop_share']:6.1%} "
                  f"{r['identical_to_target_only']:>4d}/{r['prompts']:<3d} "
                  f"{fmt(r['agreement_with_llama_cpp'], '7.0%'):>7s} {fmt(r['salvaged_share'], '8.1%'):>8s}")
    if out["_meta"]["goals"]:
        print("\ngoals (decode tok/s ratios):")
    for g in out["_meta"]["goals"]:
        verdict = "met" if g["met"] else f"short by {1 - g['ratio'] / g['goal']:.0%}"
        print(f"  {g['task']:8s} {g['system']:14s} / {g['against']:16s} {g['ratio']:5.2f}x  (goal {g['goal']}x: "
              f"{verdict})")
    return 0


def _bench_operator(args) -> int:

    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if args.questions < 2 or args.rate <= 0 or not rates or min(rates) <= 0:
        raise ValueError("--questions must be >= 2, --rate and every --rates value > 0")

    def asked(label, i, n, row):
        print(f"  {label} question {i}/{n}: ttft {row['ttft_ms'] or 0:6.0f} ms, {row['tokens_per_s']:5.1f} tok/s, "
              f"{row['prompt_tokens']} prompt tokens ({row['retrieved']} retrieved lines)", file=sys.stderr,
              flush=True)

    def kept(row):
        print(f"  rate {row['rate']:g} lines/s: {row['lines_per_s']:.1f} lines/s reached the ring, "
              f"{row['waiting_lines']} waiting at the end, {row['dropped']} dropped, {row['questions']} questions",
              file=sys.stderr, flush=True)

    k = config.load(args.config).serve.retrieve
    out = {"latency": [ob.latency(args.log, args.rate, args.questions, 30, r, args.config, progress=asked)
                       for r in sorted({0, k})]}
    out["keeps_up"] = ob.keeps_up(args.log, rates, args.seconds, 5.0, 30, k, args.config, progress=kept)
    if args.out:
        Path(args.out).write_text(json.dumps(out))
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"\noperator questions (30 tokens, 30-token answers) while the log replays at {args.rate:g} lines/s:")
    print(f"{'retrieve k':>10s} {'lines got':>9s} {'prompt tok':>10s} {'ttft p50':>9s} {'ttft p95':>9s} "
          f"{'tok/s p50':>9s} {'tok/s p95':>9s} | {'frame':>6s} {'queued':>6s} {'prefill':>7s} ms p50 | "
          f"{'lines/s':>7s}")
    for r in out["latency"]:
        print(f"{r['retrieve']:>10d} {r['retrieved_mean']:9.1f} {r['prompt_tokens_mean']:10.0f} "
              f"{r['ttft_p50_ms']:9.0f} {r['ttft_p95_ms']:9.0f} {r['tokens_per_s_p50']:9.1f} "
              f"{r['tokens_per_s_p95']:9.1f} | {r['frame_ms_p50']:6.1f} {r['queued_ms_p50']:6.1f} "
              f"{r['prefill_ms_p50']:7.1f}        | {r['lines_per_s']:7.1f}")
    print(f"\ningestion while answering a question every 5 s (retrieving up to {k} lines):")
    for r in out["keeps_up"]:
        print(f"  {r['rate']:5g} lines/s offered: {r['lines_per_s']:5.1f} reached the ring, {r['waiting_lines']} "
              f"waiting, {r['dropped']} dropped: {'keeps up' if r['kept_up'] else 'falls behind'}")
    best = max((r["rate"] for r in out["keeps_up"] if r["kept_up"]), default=None)
    print(f"highest line rate kept up: {best if best is not None else 'none of those tried'}")
    return 0


def cmd_eval_recall(args) -> int:


    root = Path(args.logs)
    logs = sorted(str(p) for p in (root.rglob("*.csv") if root.is_dir() else [root]))
    if not logs:
        raise FileNotFoundError(f"no TEP CSV logs under {root}")
    if args.per_log < 1 or args.max_questions < 1 or args.k < 1:
        raise ValueError("--per-log, --max-questions and --k must be at least 1")
    questions = recall_questions.build(logs, per_log=args.per_log)
    step = max(1, len(questions) // args.max_questions)
    questions = questions[::step][:args.max_questions]

    def progress(i, n, row):
        print(f"  [{i}/{n}] {row['question']} ({row['answer']}): recalled {row['recalled']}, exact with "
              f"{row['exact_with']}, without {row['exact_without']}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="ringspec_recall_") as tmp:
        recall = {k: recall_questions.recall_at_k(questions, k, tmp)["recall"] for k in (1, 4, 8)}
        out = answer_rate(questions, args.k, tmp, config.load(None, {"serve.enabled": True}), progress=progress)
    out["recall_at"] = recall
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['questions']} questions from {len(logs)} logs, answers outside a 40-line window")
    print("retrieval recall@1/@4/@8: " + " / ".join(f"{recall[k]:.1%}" for k in (1, 4, 8)))
    print(f"exact answers (the right HH:MM:SS in the answer): with the archive ({args.k} lines) "
          f"{out['exact_with_archive']:.1%}, without {out['exact_without_archive']:.1%}  ({out['wall_s']:.0f} s)")
    return 0


def cmd_doctor(args) -> int:

    rep = doctor(args.model, args.threads, args.max_rows, args.accuracy_level)
    if args.json:
        print(json.dumps(rep, indent=1))
        return 0 if rep["exact"] else 1
    pf = rep["platform"]
    print(f"onnxruntime {pf['onnxruntime']}, numpy {pf['numpy']}, Python {pf['python']}, {pf['system']} "
          f"{pf['machine']}\nCPU (as this process sees it): {pf['cpu']}" +
          (f"   (/proc/cpuinfo: {pf['cpuinfo']})" if pf["cpuinfo"] and pf["cpuinfo"] != pf["cpu"] else ""))
    print(f"ISA features (CPUID / auxiliary vector): {' '.join(pf['isa'])}\nAVX-512: "
          f"{' '.join(pf['avx512']) or 'none'}")
    print(f"\noperator families alone, at the model's shapes, {args.threads} threads: a row among 1..64 rows against "
          f"the same row among 64, and a row with 0..9 masked columns appended against none:")
    for op in rep["operators"]:
        bad, what = op["differs_at"], op["varied"]
        verdict = "invariant" if not bad else (f"1 row differs (up to {op['max_abs']:.2g}); 2..64 rows invariant"
                                               if bad == [1] and what == "rows" else
                                               f"differs at {bad} {what} (up to {op['max_abs']:.2g})")
        print(f"  {op['family']:70s} {verdict}\n  {'':4s}{op['shapes']}")
    print("\nwhole pass (the model's graph; rows alone vs in blocks of 2-8 rows and a 4-node tree, at positions "
          "5 and 2^31 - 27):")
    for name, label in (("chain", "chain graph, padding rule on (the engine)"),
                        ("tree", "tree graph, padding rule on (token trees)"),
                        ("chain_unpadded", "chain graph, padding rule off (information)")):
        v = rep["passes"][name]
        print(f"  {label:46s} {'invariant' if v['invariant'] else 'NOT invariant: ' + v['where']}")
    print("\n" + ("exact: speculation changes no output token on this CPU" if rep["exact"] else
                  "NOT exact on this CPU: greedy output with a draft may differ from single-token decoding"))
    return 0 if rep["exact"] else 1


def cmd_draft_scan(args) -> int:

    def progress(spec, row):
        print(f"  {spec:14s} accepted {row['acceptance_rate']:6.1%}  {row['accepted_per_verify']:.2f} tokens/verify  "
              f"draft {row['draft_ms_per_token']:5.1f} ms/token ({row['relative_cost']:.2f} of a target pass)  "
              f"{row['tokens_per_s']:6.1f} tok/s ({row['speedup']:.2f}x)", file=sys.stderr, flush=True)

    out = draftscan.scan(args.log, tuple(args.candidates) or draftscan.DEFAULT_CANDIDATES, args.offsets,
                         args.draft_len, task=args.task, progress=progress)
    if args.json:
        print(json.dumps(out))
        return 0
    rows = out["candidates"]
    print(f"target_only: {rows['target_only']['tokens_per_s']:.1f} tok/s "
          f"({rows['target_only']['target_ms_per_pass']:.1f} ms a token)")
    print(f"{'blocks kept':16s} {'n':>3s} {'accepted':>9s} {'tok/verify':>10s} {'draft ms':>9s} {'cost':>6s} "
          f"{'tok/s':>7s} {'speedup':>8s}")
    for spec, r in rows.items():
        if spec != "target_only":
            print(f"{spec:16s} {r['blocks']:3d} {r['acceptance_rate']:9.1%} {r['accepted_per_verify']:10.2f} "
                  f"{r['draft_ms_per_token']:9.1f} {r['relative_cost']:6.2f} {r['tokens_per_s']:7.1f} "
                  f"{r['speedup']:7.2f}x")
    return 0


def cmd_distill(args) -> int:
    from tqdm import tqdm

    for name in ("steps", "vocab", "d_model", "layers", "train_logs", "continuations"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be at least 1")
    if args.d_model % 64:
        return _fail("--d-model must be a multiple of 64 (heads of 64, Q8_0 blocks of 32)")
    shape = DraftShape(vocab=args.vocab, d_model=args.d_model, n_layers=args.layers, d_ff=3 * args.d_model,
                       n_heads=args.d_model // 64, n_kv_heads=max(1, args.d_model // 128))
    recipe = Recipe(logs=args.train_logs, continuations=args.continuations, steps=args.steps)
    out = Path(args.out) if args.out else home() / "drafts" / "distilled.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    bars: dict = {}

    def progress(stage, done, total, note):
        bar = bars.get(stage) or bars.setdefault(stage, tqdm(total=total, desc=stage, file=sys.stderr))
        bar.update(done - bar.n)
        if note:
            bar.set_postfix_str(note)

    report = distill.distill(args.logs, args.held_out, out, shape, recipe, progress=progress)
    for bar in bars.values():
        bar.close()
    if args.json:
        print(json.dumps(report))
        return 0
    agree = ", ".join(f"{task} {v:.1%}" for task, v in report["agreement"].items())
    cover = report["vocab_coverage"]
    print(f"{report['gguf']} ({report['bytes'] / 1e6:.1f} MB): {shape.n_layers} layers, d {shape.d_model}, "
          f"{shape.vocab} ids")
    print(f"trained on {len(report['logs'])} logs: {report['raw_tokens']} log tokens, {report['continuations']} "
          f"target continuations ({report['continuation_tokens']} tokens); corpus {report['corpus_s']} s, "
          f"training {report['train_s']} s, final loss {report['loss']}")
    print(f"sub-vocabulary covers {cover['eval']:.1%} of the target's held-out output; top-1 agreement with the "
          f"target on it: {agree}")
    print(f"measure it: python run.py bench --draft-model {report['gguf']}")
    return 0


def cmd_pipeline_bench(args) -> int:

    cfg = config.load(args.config)

    def progress(name, repeat, res):
        print(f"  repeat {repeat} {name:9s} decode {res['decode_tok_s']:6.1f} tok/s, {res['tokens_per_verify']:.2f} "
              f"tok/verify, overhead {res['overhead_share']:.1%}, overlap {res['overlap_share']:.0%}, wall "
              f"{res['wall_s']:.1f} s", file=sys.stderr, flush=True)

    out = pipeline_vs_serial.compare(args.log, cfg, args.config, args.max_lines, args.repeats, progress)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{'system':10s} {'decode tok/s':>12s} {'tok/verify':>10s} {'overhead':>9s} {'overlap':>8s} {'draft s':>8s} "
          f"{'wall s':>7s}")
    for name in ("serial", "pipelined"):
        row = out[name]
        print(f"{name:10s} {row['decode_tok_s']:12.1f} {row['tokens_per_verify']:10.2f} {row['overhead_share']:9.1%} "
              f"{row['overlap_share']:8.0%} {row['draft_s']:8.2f} {row['wall_s']:7.1f}")
    print(f"pipelined whole-stream overhead share {out['pipelined']['stream_overhead_share']:.1%}; assessments "
          f"identical in every run: {out['identical']}")
    return 0


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{what} {text!r}: expected an integer or a comma-separated list") from None
    if not values or min(values) < 0:
        raise ValueError(f"--{what} {text!r}: expected non-negative integers")
    return values


def cmd_soak(args) -> int:

    seen: list[set] = []

    def progress(row):
        rss = sum(a["rss_kb"] for a in row["actors"].values()) / 1024
        names = set(row["segment_names"])
        change = f" (+{sorted(names - seen[0])} -{sorted(seen[0] - names)})" if seen and names != seen[0] else ""
        seen[:] = [names]
        print(f"  {row['tokens']:>10,} tokens {row['t']:8.0f} s  rss {rss:7.1f} MB  segments {row['segments']}"
              f"{change}", file=sys.stderr, flush=True)

    out = soak.soak(config.load(args.config), args.log, args.tokens, args.every, progress)
    if args.out:
        Path(args.out).write_text(json.dumps(out))
    if args.plot:
        soak.write_plot(out, args.plot)
    summary = {k: v for k, v in out.items() if k != "series"}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{out['tokens']:,} tokens in {out['wall_s']:.0f} s, {out['assessments']} assessments, {out['samples']} "
          f"samples; warm-up {out['warmup_tokens']:,} tokens")
    print(f"{'actor':12s} {'rss MB':>7s} {'slope KiB/1k tok':>17s} {'anon slope':>11s} {'spread KiB':>11s} "
          f"{'fds +':>6s} {'thr +':>6s}")
    for name, a in out["actors"].items():
        print(f"{name:12s} {a['rss_last_mb']:7.1f} {a['rss_slope_kib_per_1k_tokens']:17.3f} "
              f"{a['anon_slope_kib_per_1k_tokens']:11.3f} {a['rss_spread_kib']:11.0f} {a['fds_growth']:6d} "
              f"{a['threads_growth']:6d}")
    ratio = out["ppl_last_over_first"]
    print(f"all actors: slope {out['rss_slope_kib_per_1k_tokens']:.3f} KiB per 1,000 tokens, spread "
          f"{out['rss_spread_kib']:.0f} KiB; segments {out['segments_growth']:+d}; PPL first loop "
          f"{out['ppl_first_loop'] or float('nan'):.3f}, last {out['ppl_last_loop'] or float('nan'):.3f} "
          f"({'-' if ratio is None else f'{ratio:.3f}x'}, {out['loops_complete']} complete loops); KV pool "
          f"{out['kv_pool_bytes']:,} B, formula {out['kv_pool_formula_bytes']:,} B")
    print("goals: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["goals"].items()))
    return 0


def cmd_eval_stream(args) -> int:

    sinks, windows = _int_list(args.sink, "sink"), _int_list(args.window, "window")
    if len(sinks) > 1 or len(windows) > 1:
        if args.plot and not args.plot.endswith(".svg"):
            raise ValueError(f"--plot {args.plot!r}: an ablation plot is SVG; name it .svg")
        rows = perplexity.ablate(args.log, args.format, sinks, windows, args.max_tokens,
                               "recompute" in args.modes.split(","), args.model, args.threads, not args.quiet)
        if args.out:
            Path(args.out).write_text(json.dumps(rows))
        if args.plot:
            print(f"plot {perplexity.write_ablation_plot(rows, args.plot)}", file=sys.stderr)
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"{'policy':10s} {'S':>3s} {'W':>5s} {'ppl':>9s} {'post-wrap':>10s} {'tok/s':>7s}")
        for row in rows:
            post = "-" if row["ppl_post_wrap"] is None else f"{row['ppl_post_wrap']:.3f}"
            s = "-" if row["sink"] is None else str(row["sink"])
            print(f"{row['policy']:10s} {s:>3s} {row['window']:5d} {row['ppl']:9.3f} {post:>10s} "
                  f"{row['tokens_per_s']:7.1f}")
        return 0
    args.sink, args.window = sinks[0], windows[0]
    out = perplexity.evaluate_stream(args.log, args.format, args.modes.split(","), args.sink, args.window,
                                   args.max_tokens, args.stride, args.naive_offset, args.dense_budget_mb, args.model,
                                   threads=args.threads, progress=not args.quiet)
    if args.out:
        Path(args.out).write_text(json.dumps(out))
    if args.plot:
        print(f"plot {args.plot}: {perplexity.write_plot(out, args.plot)}", file=sys.stderr)
    rows = perplexity.summary(out)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{out['_meta']['n_tokens']} tokens, wrap at {out['_meta']['wrap_position']}; {perplexity.MEMORY_NOTE}")
    for mode, r in rows.items():
        post = "-" if r["ppl_post_wrap"] is None else f"{r['ppl_post_wrap']:.3f}"
        print(f"{mode:10s} ppl {r['ppl']:9.3f}  post-wrap {post:>9s}  {r['tokens_per_s']:7.1f} tok/s  "
              f"rss {r['memory']['rss_after_mb']:.0f} MB peak {r['memory']['peak_mb']:.0f} MB  {r.get('note', '')}"
              f"{r.get('stop_reason', '')}")
    return 0


def _read_text(path: str) -> str:
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
                         f"convert it first, e.g. iconv -f latin1 -t utf-8") from None


def _sink(args):
    if args.window is None:
        if args.sink:
            raise ValueError("--sink needs --window (the ring policy)")
        return None
    return 4 if args.sink is None else args.sink


VERBS = {"replay": cmd_replay, "generate": cmd_generate, "score": cmd_score, "convert": cmd_convert,
         "bench": cmd_bench, "doctor": cmd_doctor, "draft-scan": cmd_draft_scan, "distill": cmd_distill, "eval-stream": cmd_eval_stream, "pipeline-bench": cmd_pipeline_bench,
         "soak": cmd_soak, "serve": cmd_serve, "ask": cmd_ask, "eval-recall": cmd_eval_recall}

if __name__ == "__main__":
    sys.exit(main())

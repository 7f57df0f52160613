"""`python -m bench VERB`: the measurement verbs (benchmarks, evaluations, the soak, the draft's distillation).

`python run.py VERB` hands these verbs over to here (bench/ sits above the CLI, so run.py never imports it); the verbs
parse and print the way run.py's do, with its helpers. Owns only the measurement verbs' parsers; never measures.
"""
from __future__ import annotations

import argparse
import sys

from bench import (agreement, answers, chaos, distill, draftscan, fuzz, ingest, npu, operators, opprofile, perplexity,
                   pipeline_vs_serial, projection, quality, recall, soak, speed, streams)
from models.npu_runner import NPU_DTYPES
from models.runner import KERNELS, KV_DTYPES
from run import MEASURING, ROOT, add_key, add_model_flags, add_verb, given_keys, main, profile_of

SHARED = ROOT.parent / "shared"


def _profile_only(a) -> None:
    """The tasks that start their own `serve` or actors pass them only the profile (--config): a profile-key flag
    (--kernel, --model, ...) would be silently ignored there, so it is refused."""
    flags = [k for k in given_keys(a) if not (a.task == "ingest" and k == "model.gguf")]  # ingest writes --model
    through_actors = a.task == "streams" and not a.target_only
    if flags and (a.task in ("operator", "answers", "ingest") or through_actors):
        raise ValueError(f"bench --task {a.task}: {', '.join(flags)} would not reach the servers and actors it "
                         f"starts, which read only the profile: set {'them' if len(flags) > 1 else 'it'} in the "
                         f"--config file" + (" (or --target-only)" if through_actors else ""))


def _bench(a):
    """`bench`: the task's measurement."""
    _profile_only(a)
    if a.task == "operator":
        return operators.run_operator_bench(profile_of(a), a.config, a.log, a.rate or 20.0, a.questions or 20,
                                            a.rates, a.seconds, a.warm_lines)
    if a.task == "answers":
        return answers.run_answers_bench(profile_of(a), a.config, a.split, a.readers, a.rate or 4.0, a.logs,
                                         a.questions or 0, a.new_tokens or answers.MAX_TOKENS)
    if a.task == "ingest":
        return ingest.run_ingest_bench(profile_of(a), a.config, [x for x in a.logs.split(",") if x], a.seconds,
                                       a.repeats or 1, ingest.progress_line)
    if a.task == "streams":
        return streams.run_streams_bench(profile_of(a), a.streams, a.prompt_tokens, a.new_tokens or 128,
                                         a.repeats or 2, a.config, a.rate or 20.0, a.stream_lines, a.every,
                                         not a.target_only)
    return speed.run_bench(profile_of(a), a.config, a.log, a.task, a.offsets, a.repeats or 3, a.systems,
                           not a.no_llama_cpp, a.unpadded, a.new_tokens, a.native, given_keys(a))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="run.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = top.add_subparsers(dest="verb")

    p = add_verb(sub, "bench", speed.run_bench, MEASURING["bench"],
                 profile="TOML profile every system's keys are set over (--task operator: the server's)")
    p.add_argument("--task", choices=("log", "analysis", "all", "operator", "ingest", "streams", "answers"),
                   default="all", help="see above; answers: trusted answers (bench/answers.py): the committed "
                   "question sets (bench/questions/, gold computed from the raw logs) asked of a real `serve` per log "
                   "and reader while the log streams at --rate lines/s (default 4) from its first line, each once "
                   "the ring holds the lines its gold is computed over; per route and reader, with Wilson 95%% "
                   "intervals: exact answers, citation accuracy and support, answers without a citation, not-found "
                   "precision and recall; TTFT and time to answer p50/p95 with and without a model call; --out "
                   "writes every scored reply. The held-out split with the cited reader takes about 12 minutes here"),
    p.add_argument("--log", help="log to take prompts from (default: the profile's replay.log)")
    p.add_argument("--offsets", type=int, default=5, help="prompts per task, spread over the log (at least 5)")
    p.add_argument("--repeats", type=int, help="runs of every prompt by every system (default 3; ingest: of every "
                   "system on every log, default 1)")
    p.add_argument("--new-tokens", type=int, default=0, help="at most this many tokens per prompt (default: the "
                   "task's, 256 for log, 128 for analysis; answers: 48 per answer)")
    p.add_argument("--warm-lines", type=int, default=operators.WARM_LINES,
                   help="operator: lines in the ring before questions are timed (default %(default)s)")
    add_key(p, "--window", "cache.window", "ring window (pool: the profile's sinks + W; nothing wraps)", type=int)
    add_key(p, "--model", "model.gguf", "the target of every system: a GGUF or a model name (run.py generate "
            "--help lists them)")
    add_key(p, "--threads", "model.threads", "ONNX Runtime threads of every system", type=int)
    add_key(p, "--kernel", "model.kernel", "the pass's kernel of every ringspec system: native (docs/kernel.md), "
            "nbits (MatMulNBits) or auto (native where it reads the model)", choices=KERNELS)
    add_key(p, "--draft-model", "draft.model",
            "the neural draft of the draft and hybrid systems (none: leave them out)")
    p.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out even when installed")
    p.add_argument("--systems", default="", help="comma-separated systems to run (default: all; target_only always)")
    p.add_argument("--unpadded", action="store_true", help="also every ringspec system without the padding rule")
    p.add_argument("--native", action="store_true", help="also every ringspec system on the native kernel "
                   "(NAME_native: [model] kernel = \"native\", our matmul over the GGUF's blocks)")
    p.add_argument("--json", action="store_true", help="print {task: {system: figures}, \"_meta\": ...} as JSON")
    p.add_argument("--out", help="also write the result (with run metadata) to this JSON file")
    p.add_argument("--rate", type=float, help="operator: the stream's lines per second (default 20); streams: "
                   "each stream's (default 20); answers: each log's (default 4)")
    p.add_argument("--questions", type=int, help="operator: questions per configuration (default 20); answers: at "
                   "most this many per log, the earliest (default: all; a smoke run: 3)")
    p.add_argument("--split", choices=answers.SPLITS, default="heldout",
                   help="answers: the questions asked: dev or heldout (the 7 loghub logs and 3 TEP logs of "
                   "../shared/data), fresh (5 more loghub logs in bench/data), fresh2 (4 more there: HPC, Mac, "
                   "OpenStack, Thunderbird), fresh3 (4 logs of other kinds there: a web shop's access log, an IIS W3C "
                   "log, a Zeek http.log, a PostgreSQL log), fresh4 (4 more kinds there: a WinCC S7 channel log, a "
                   "TeamViewer log, a Windows setupapi log, an SSH honeypot log), fresh5 (2 more kinds there: a "
                   "MongoDB mongod log, a Kafka broker server.log), fresh6 and fresh7 (issue 59's unseen splits: log kinds no "
                   "other split has, bench/data/README.md), all (default %(default)s). Each "
                   "fresh split was written apart from the reader and held out until it was measured once (README, "
                   "Operators)")
    p.add_argument("--readers", default="cited", help="answers: comma-separated serve.reader values, one server per "
                   "log each: cited (answer copied from a cited line, or counted), free (the free-text baseline) "
                   "(default %(default)s)"),
    p.add_argument("--rates", default="4,6,8,10,20", help="operator: line rates to try for keeping up")
    p.add_argument("--seconds", type=float, default=40.0, help="operator: seconds per line rate; ingest: seconds "
                   "measured per system and log")
    p.add_argument("--streams", default="1,2,4,8", help="streams: the stream counts to run (bench/streams.py: one "
                   "target carrying N streams' rows per pass against N single-stream runners taking turns; "
                   "default %(default)s)")
    p.add_argument("--stream-lines", type=int, default=48, help="streams: lines each stream is fed through the "
                   "actors, at --rate lines/s (default %(default)s)")
    p.add_argument("--every", type=int, default=16, help="streams: lines between a stream's assessments through the "
                   "actors (default %(default)s)")
    p.add_argument("--target-only", action="store_true", help="streams: the target-only figures alone (not "
                   "through the actors)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="streams: tokens of its log each stream is fed "
                   "before it continues (default %(default)s)")
    p.add_argument("--logs", default="", help="ingest: comma-separated logs (default: the profile's replay.log, "
                   + " and ".join(ingest.LOGHUB) + " from ../shared/data); answers: comma-separated question sets "
                   "(Linux_2k, text_alarms_filter_5, ...; default: all)")
    p.set_defaults(run=_bench)

    p = add_verb(sub, "chaos", chaos.run_chaos, MEASURING["chaos"], profile="TOML profile of the pipeline under test")
    p.add_argument("log", nargs="?", help="the log to replay (default: the profile's replay.log), repeated --copies "
                   "times into one file")
    p.add_argument("--kills", type=int, default=10, help="actor deaths to cause (at least every named point of every "
                   "actor once; default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="which actor dies where, how, and when (default %(default)s)")
    p.add_argument("--serve", action="store_true", help="run `serve` (lines at 4 per second, questions over HTTP) "
                   "instead of `replay`")
    p.add_argument("--copies", type=int, default=0, help="the log this many times over (default: kills / 5)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object (lines_lost, "
                   "lines_duplicated, ...)")
    p.set_defaults(run=lambda a: chaos.run_chaos(profile_of(a), a.config, a.log, a.kills, a.seed, a.serve, a.copies,
                                                 progress=lambda m: print(m, file=sys.stderr, flush=True)))

    p = add_verb(sub, "fuzz", fuzz.run_fuzz, MEASURING["fuzz"], True, profile="TOML profile (its model and [serve])")
    p.add_argument("--cases", type=int, default=200, help="inputs per target (default %(default)s)")
    p.add_argument("--targets", default="", help=f"comma-separated, of {', '.join(fuzz.TARGETS)} (default: all)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis's seed (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print {target: {cases, failures, failure, seconds}}")
    p.set_defaults(run=lambda a: fuzz.run_fuzz(profile_of(a), a.cases, a.targets, a.seed))

    p = add_verb(sub, "export-rknn", npu.run_export, MEASURING["export-rknn"],
                 profile="TOML profile: its draft model, ring and log (configs/rk3588.toml for the board)")
    add_key(p, "--draft-model", "draft.model", "the draft GGUF to convert")
    add_key(p, "--npu-dtype", "draft.npu_dtype", "float16: a model per row bucket; int8: one model for every pass, "
            "its linears in int8 (calibrated on --calibration-log), the rest float16", choices=NPU_DTYPES)
    p.add_argument("--calibration-log", default=str(npu.CALIBRATION_LOG), help="int8: the log whose passes calibrate "
                   "it, one the figures are not measured on (default %(default)s)")
    p.add_argument("--positions", type=int, default=400, help="teacher-forced positions compared (default "
                   "%(default)s)")
    p.add_argument("--greedy", type=int, default=64, help="tokens of each greedy continuation (default %(default)s)")
    p.add_argument("--lines", type=int, default=30, help="log lines replayed for the acceptance (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(run=lambda a: npu.run_export(profile_of(a, here=False), a.positions, a.greedy, a.lines,
                                                a.calibration_log))

    p = add_verb(sub, "eval-quality", quality.run_eval_quality, MEASURING["eval-quality"], True)
    p.add_argument("--logs", type=int, default=0, help="TEP deadband logs to use, in numeric order (default: all 60 "
                   "the draft was not trained on); loghub's three follow (--loghub-lines)")
    p.add_argument("--forms", default="", help="comma-separated, of free, constrained, structured (default: all; "
                   "none: only the surprisal part)")
    p.add_argument("--loghub-lines", type=int, default=quality.LOGHUB_LINES,
                   help="lines of each loghub log (default %(default)s; 0: none)")
    p.add_argument("--surprisal-lines", type=int, default=2000, help="BGL lines whose surprisal is scored against "
                   "their alert labels, beside template and token rarity (default %(default)s, the whole log; 0: none)")
    p.add_argument("--speed-lines", type=int, default=200, help="lines of BGL and of the bundled TEP log fed both "
                   "scored and not, alternating, for scoring's prefill cost (default %(default)s; 0: none)")
    p.add_argument("--json", action="store_true", help="print {tep: {form: figures}, loghub: ..., surprisal: ..., "
                   "logs, wall_s}")
    p.set_defaults(run=lambda a: quality.run_eval_quality(profile_of(a), a.logs, a.forms, quality.progress_line,
                                                          a.loghub_lines, a.surprisal_lines, a.speed_lines))

    p = add_verb(sub, "eval-recall", recall.run_eval_recall, MEASURING["eval-recall"],
                 profile="TOML profile the model answers with")
    p.add_argument("--logs", default=str(SHARED / "data/tep_alarms"), help="a TEP CSV or a directory of them")
    p.add_argument("--per-log", type=int, default=1, help="questions per log")
    p.add_argument("--max-questions", type=int, default=40, help="answer at most this many (spread over the set)")
    p.add_argument("--k", type=int, default=4, help="lines retrieved per question (default %(default)s: the "
                   "evaluation's own; the server's is the profile's serve.retrieve)")
    p.add_argument("--json", action="store_true", help="print the result, with every answer, as JSON")
    p.set_defaults(run=lambda a: recall.run_eval_recall(profile_of(a, {"serve.enabled": True}), a.logs, a.per_log,
                                                        a.max_questions, a.k))

    p = add_verb(sub, "agree", agreement.run_agree, MEASURING["agree"], profile="")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a model name or GGUF (default %(default)s)")
    p.add_argument("--fixture", help="compare against this saved fixture instead of running llama.cpp")
    p.add_argument("--fixture-out", help="save llama.cpp's figures as a fixture (.npz) for the pair tier")
    p.add_argument("--threads", type=int, default=2, help="threads of both runtimes (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.add_argument("--kernel", choices=("nbits", "native"), default="nbits",
                   help="ringspec's linears: MatMulNBits or the native kernel (default %(default)s)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="auto",
                   help="ringspec's K/V pools: auto is the kernel's own, float16 on native, float32 on nbits "
                        "(default %(default)s)")
    p.set_defaults(run=lambda a: agreement.run_agree(a.model, a.fixture, a.fixture_out, a.threads, a.kernel,
                                                     a.kv_dtype))

    p = add_verb(sub, "profile", opprofile.run_profile, MEASURING["profile"])
    add_model_flags(p)
    p.add_argument("--tokens", type=int, default=48, help="tokens decoded and profiled (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(run=lambda a: opprofile.run_profile(profile_of(a), a.tokens))

    p = add_verb(sub, "draft-scan", draftscan.run_scan, MEASURING["draft-scan"])
    p.add_argument("candidates", nargs="*", help="block lists (default: six early-exit, strided and range cuts)")
    p.add_argument("--log", help="log to take prompts from (default: the profile's replay.log)")
    p.add_argument("--task", choices=("log", "analysis"), default="log", help="the bench task whose prompts run")
    p.add_argument("--offsets", type=int, default=3, help="prompts, spread over the log")
    add_key(p, "--draft-len", "draft.length", "proposals per verify", type=int)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=lambda a: draftscan.run_scan(profile_of(a), a.config, a.log, a.candidates, a.offsets, a.task))

    p = add_verb(sub, "distill", distill.run_distill, MEASURING["distill"], profile="")
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

    p = add_verb(sub, "pipeline-bench", pipeline_vs_serial.run_compare, MEASURING["pipeline-bench"],
                 profile="TOML profile for both sides")
    p.add_argument("--log", default=str(SHARED / "data/tep_alarms/filter/text_alarms_filter_5.csv"), help="the log")
    p.add_argument("--max-lines", type=int, default=100, help="lines per run (the bench's own, not replay.max_lines)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side, per policy")
    p.add_argument("--policies", default=",".join(pipeline_vs_serial.POLICIES),
                   help="block policies to compare, comma-separated (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=lambda a: pipeline_vs_serial.run_compare(a.config, a.log, a.max_lines, a.repeats,
                                                                tuple(a.policies.split(","))))

    p = add_verb(sub, "project", projection.run_project, MEASURING["project"], True,
                 profile="TOML profile of the measurements (the bench's and pipeline-bench's own)")
    p.add_argument("--log", help="bench's log (default: the profile's replay.log)")
    p.add_argument("--pipeline-log", default=str(SHARED / "data/tep_alarms/filter/text_alarms_filter_5.csv"),
                   help="pipeline-bench's log (default: its own)")
    p.add_argument("--offsets", type=int, default=5, help="bench prompts per task traced (bench's --offsets)")
    p.add_argument("--repeats", type=int, default=3, help="traces of every prompt by every system (bench's)")
    p.add_argument("--max-lines", type=int, default=100, help="lines of the traced replay (pipeline-bench's)")
    p.add_argument("--from", dest="measured", metavar="M.json", help="the micro-measurements of an earlier run "
                   "(its --out) instead of measuring now")
    p.add_argument("--bench", dest="bench_json", metavar="B.json", help="`bench --json --out` of a separate run")
    p.add_argument("--pipeline-bench", dest="pipeline_json", metavar="P.json",
                   help="`pipeline-bench --policies fixed --json` of a separate run")
    p.add_argument("--json", action="store_true", help="print the result (without the traces) as one JSON object")
    p.add_argument("--out", help="write the result with every micro-measurement and trace (for --from)")
    p.set_defaults(run=lambda a: projection.run_project(a.config, a.log,
                                                        a.pipeline_log, a.measured, a.bench_json, a.pipeline_json,
                                                        a.offsets, a.max_lines, a.repeats))

    p = add_verb(sub, "soak", soak.run_soak, MEASURING["soak"])
    p.add_argument("--tokens", type=int, required=True, help="stream tokens to push through")
    p.add_argument("--log", help="the log to loop, a period of at least 4 windows (default: the profile's replay.log)")
    p.add_argument("--every", type=int, default=5000, help="sample every N stream tokens")
    p.add_argument("--json", action="store_true", help="print the result without the samples as one JSON object")
    p.add_argument("--out", help="write the full result (samples included) as JSON")
    p.add_argument("--plot", help="resident memory per actor over tokens, .svg")
    p.add_argument("--serve", action="store_true", help="run `serve` (its own process, sampled with its actors) "
                   "with an operator's question every --ask-every seconds, a client vanishing mid-request every "
                   "--leave-every seconds, and the archive kept to --archive-lines lines; Ctrl-C ends it early with "
                   "the figures of what was sampled")
    p.add_argument("--ask-every", type=float, default=3.0, help="serve: seconds between an answer and the next "
                   "question (default: %(default)s)")
    p.add_argument("--leave-every", type=float, default=5.0, help="serve: seconds between vanishing clients "
                   "(default: %(default)s)")
    p.add_argument("--archive-lines", type=int, default=soak.ARCHIVE_LINES, help="serve: the archive's retention "
                   "(serve.archive_max_lines; default: %(default)s)")
    p.set_defaults(run=lambda a: soak.run_soak(profile_of(a), a.log, a.tokens, a.every, a.plot, a.config, a.serve,
                                               a.ask_every, a.leave_every, a.archive_lines))

    p = add_verb(sub, "eval-stream", perplexity.run_eval, MEASURING["eval-stream"])
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
    add_model_flags(p)
    p.set_defaults(run=lambda a: perplexity.run_eval(profile_of(a), a.log, a.format, a.sink, a.window, a.modes,
                                                     a.max_tokens, a.stride, a.naive_offset, a.dense_budget_mb,
                                                     a.quiet, a.plot))
    assert set(sub.choices) == set(MEASURING), "run.MEASURING lists exactly the verbs parsed here"
    return top


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], parser))

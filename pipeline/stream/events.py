"""A stream event's two faces, the same for every launcher: its journal record (the typed event's fields and what
the reader adds: the assessment's text, the tags it mentions and those it invents, the time) and its lines on a
terminal (`show`). The output actor and the serial replay both render through here, so their journals compare record
for record.

Owns the record's shape and the console's wording. Never writes a file or a socket: the caller does (the journal:
pipeline/stream/journal.py).
"""
from __future__ import annotations

import sys
import time

from pipeline.decode.exactness import Invariance
from pipeline.messages import Assessment, as_dict
from pipeline.stream.forms import fields_of
from pipeline.stream.identifiers import invented, mentioned
from pipeline.stream.surprise import unusual_mark


def record_of(event, tok, stops) -> dict:
    """The journal record of an event: its fields, its decoded text, its time, and for an assessment the tags it
    mentions and those it invents."""
    record = as_dict(event)
    ids = getattr(event, "ids", None)
    if ids is not None:
        record["text"] = tok.decode([int(t) for t in ids if int(t) not in stops]).strip()
    record["t"] = time.time()
    if isinstance(event, Assessment):
        if event.fields is not None:
            record["fields"] = fields_of(tok, event.fields)
        record["tags_mentioned"] = mentioned(record["text"])
        record["tags_hallucinated"] = invented(record["text"], event.window_tags)
    return record


def named(record: dict, name: str) -> dict:
    """A record of one of several streams carries the stream's name (first, for a reader of the journal)."""
    return {"stream": name, **record} if name else record


def journaled(record: dict) -> bool:
    """The journal takes every event but stream lines (scored lines too: `replay.score_stream`)."""
    return record["kind"] != "line" or record.get("nll_n") is not None


def show(record: dict, quiet_lines: bool = False) -> None:
    """What the operator sees on stdout and stderr, from an event's record (its stream's name first, when it is one
    of several)."""
    who = f"[{record['stream']}] " if record.get("stream") else ""
    match record["kind"]:
        case "start":
            ex, pf = record["exactness"], record["platform"]
            level = "ringspec:" if ex["invariant"] else "ringspec: warning:"
            print(f"{level} {who}target on {pf['cpu']} ({pf['simd']}), "
                  f"onnxruntime {pf['onnxruntime']}: {_exactness_line(ex)}", file=sys.stderr, flush=True)
        case "line" if not quiet_lines:
            print(who + (unusual_mark(record) or f"  {record['text']}"), flush=True)
        case "assessment":
            st = record["stats"]
            text = record["text"].replace("\n", "\n   ")
            print(f"\n>> {who}[after line {record['lines']}, {record['trigger']}; offsets {record['offsets'][0]}-"
                  f"{record['offsets'][1]}] {text}\n"
                  f"   ({st['generated']} tokens, {st['tokens_per_s']:.0f} tok/s, {record['latency_ms']:.0f} ms, "
                  f"{st['accepted_per_verify']:.2f} tokens/verify; tags {len(record['tags_mentioned'])} mentioned, "
                  f"{len(record['tags_hallucinated'])} not in view)\n", flush=True)
        case "answer":
            if record["error"]:
                print(f"\n?? {who}[{record['client']}] {record['question'][:200]!r}: not answered: {record['error']}\n",
                      flush=True)
                return
            text = record["text"].replace("\n", "\n   ")
            ttft = "-" if record["ttft_ms"] is None else f"{record['ttft_ms']:.0f}"
            print(f"\n?? {who}[{record['client']}] {record['question'][:200]}\n=> {text}\n"
                  f"   ({record['completion_tokens']} tokens, ttft {ttft} ms, total {record['total_ms']:.0f} ms, "
                  f"queued {record['queued_ms']:.0f} ms, {record['route']}, {len(record['citations'])} lines cited, "
                  f"{record['finish_reason']}{', client gone' if record.get('client_gone') else ''})\n", flush=True)
        case "capacity":
            print(f"ringspec: warning: {who}the stream goes in at {record['lines_per_s']:.1f} lines/s "
                  f"({record['tokens_per_s']:.0f} tokens/s) while the target works on it, below the profile's "
                  f"replay.line_rate of {record['line_rate']:g}; it had {record['stream_share']:.0%} of the target's "
                  f"recent time (serve.stream_share raises its floor; `bench --task ingest` measures it)",
                  file=sys.stderr, flush=True)
        case "restart":
            took = "" if record["recovery_s"] is None else f", {record['recovery_s']:.1f} s from the death"
            why = f"after {record['cause']}" if record["actor"] else "from the journal (resume)"
            where = "from its start" if record["resumed_after"] is None else f"after offset {record['resumed_after']}"
            print(f"ringspec: {who}resumed {why}: the stream continues {where}{took}",
                  file=sys.stderr, flush=True)
        case "eof":
            end_of_stream(record)


def end_of_stream(record: dict) -> None:
    """The run's last words on stderr: the stream's counts, each actor's figures, the pipeline's summary."""
    name = f" {record['stream']}" if record.get("stream") else ""
    print(f"end of stream{name}: {record['sent']} records, dropped {record['dropped_full']} (queue full), "
          f"{record['invalid_utf8']} invalid UTF-8, {record['nul_bytes']} with NUL, {record['oversized']} "
          f"oversized", file=sys.stderr, flush=True)
    if not record.get("figures"):
        return                                     # the serial replay: one process, no actors' figures
    print(f"{'actor':12s} {'pid':>7s} {'cpus':>6s} {'busy':>6s} {'wall s':>7s} {'RSS MB':>7s} {'thr':>4s} "
          f"{'queue':>5s}",
          file=sys.stderr)
    for f in record.get("figures", []):
        print(f"{f['actor']:12s} {f['pid']:7d} {','.join(map(str, f['cpus'])):>6s} {f['busy_share']:6.0%} "
              f"{f['wall_s']:7.1f} {f['vmrss_mb']:7.0f} {f['threads']:4d} {f.get('inbox_max_depth', 0):5d}",
              file=sys.stderr)
    print_summary(record.get("figures", []))


def print_summary(figures: list[dict]) -> None:
    """The pipeline's run-time figures, for an operator: decode speed, drafting, overlap and overhead. A target that
    serves several streams (it counts its passes by graph) has their forward time together, not this stream's."""
    by = {f["actor"]: f for f in figures}
    owner, target = by.get("cache_owner"), by.get("target")
    if not owner or not target or not owner["decode_s"] or not owner["stream_wall_s"]:
        return
    shared = bool(target.get("passes_by_graph"))
    print(f"decode {owner['tokens_per_s']:.0f} tok/s over {owner['generated']} tokens, "
          f"{owner['accepted_per_verify']:.2f} tokens/verify (acceptance {owner['acceptance_rate']:.0%}); "
          f"KV pool {target['kv_pool_mb']:.1f} MB", file=sys.stderr)
    print(f"draft {owner['draft_s']:.2f} s on verified blocks, {owner['overlap_s']:.2f} s of it while the target "
          f"verified ({owner['overlap_share']:.0%} overlap), {owner['wasted_draft_s']:.2f} s on stale blocks; target "
          f"idle {owner['target_idle_s']:.2f} s between verifies", file=sys.stderr)
    print(f"pipeline overhead share (wall time outside the target's forward passes): decoding "
          f"{owner['decode_overhead_share']:.1%} of {owner['decode_s']:.1f} s (target handling around its passes "
          f"{owner['verify_s'] - owner['verify_forward_s']:.2f} s, between passes {owner['target_idle_s']:.2f} s); "
          + (f"whole stream {1 - target['forward_s'] / owner['stream_wall_s']:.1%} of {owner['stream_wall_s']:.1f} s"
             if not shared else f"the target's passes serve every stream ({target.get('passes', 0)} passes, "
                                f"{target['forward_calls']} streams' shares; by graph, slots: passes "
                                f"{_by_graph(target)})"),
          file=sys.stderr, flush=True)


def _exactness_line(ex: dict) -> str:
    return Invariance(**ex).line()


def _by_graph(target: dict) -> str:
    """The target's passes by the graph that ran them (models/streams.py), e.g. "1: 420, 4: 232"."""
    return ", ".join(f"{slots}: {n}" for slots, n in target.get("passes_by_graph", {}).items())

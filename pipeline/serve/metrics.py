"""/metrics: the front's figures in Prometheus text format (version 0.0.4).

Owns metric names, help texts and types. Reads `Front`'s state; never changes it.
"""
from __future__ import annotations

import numpy as np

from pipeline.serve.views import SURPRISE_BUCKETS, resident_bytes
from pipeline.topology import ROLES, actor_name

QUANTILES = (0.5, 0.95, 0.99)


def render(front) -> str:
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples):
        out.append(f"# HELP ringspec_{name} {help_text}")
        out.append(f"# TYPE ringspec_{name} {kind}")
        for labels, value in samples:
            label = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}" if labels else ""
            out.append(f"ringspec_{name}{label} {_number(value)}")

    views = list(front.views.values())           # one stream: no stream label; several: every series per stream

    def per(value, **labels):
        return [({**v.labels(), **labels}, value(v)) for v in views]

    g = front.gauges()
    metric("decode_tokens_per_second", "gauge", "Generated tokens per second of decode time, all generations so far.",
           per(lambda v: v.status.get("tokens_per_s", 0.0)))
    metric("draft_acceptance_ratio", "gauge", "Accepted share of proposed draft tokens.",
           per(lambda v: v.status.get("acceptance_rate", 0.0)))
    metric("tokens_per_verify", "gauge", "Tokens committed per target verify pass.",
           per(lambda v: v.status.get("accepted_per_verify", 0.0)))
    ex, pf = views[0].start.get("exactness"), views[0].start.get("platform", {})
    metric("batch_invariant", "gauge", "1 when the target's rows are batch invariant on this CPU (the start-up "
           "probe, pipeline/decode/exactness.py); 0: greedy output with a draft may differ from single-token "
           "decoding here.",
           [({}, float("nan") if ex is None else float(ex["invariant"]))])
    metric("platform_info", "gauge", "What the target runs on, as its process sees it (always 1).",
           [({"onnxruntime": pf.get("onnxruntime", ""), "cpu": pf.get("cpu", ""),
              "avx512": ",".join(pf.get("avx512", [])) or "none"}, 1)] if pf else [])
    metric("generated_tokens_total", "counter", "Tokens generated (answers and analyses).",
           per(lambda v: v.status.get("generated", 0)))
    metric("stream_lines_total", "counter", "Stream lines prefilled into the ring.",
           per(lambda v: v.status.get("lines", 0)))
    metric("stream_tokens_total", "counter", "Tokens of the stream lines prefilled into the ring.",
           per(lambda v: v.status.get("stream_tokens", 0)))
    metric("stream_share", "gauge", "The stream's share of the target's time over the last ~30 s, and the least "
           "share it gets while lines wait (serve.stream_share).",
           per(lambda v: v.status.get("stream_share", 1.0), kind="measured") +
           per(lambda v: front.serve.stream_share, kind="minimum"))
    metric("stream_capacity_lines_per_second", "gauge", "Lines/s the stream goes in at while the target works on it "
           "(the last ~30 s; 0 until measured).", per(lambda v: v.status.get("capacity_lines_per_s", 0.0)))
    metric("packed_feeds_total", "counter", "Stream feeds that carried several waiting lines in full passes.",
           per(lambda v: v.status.get("packed_feeds", 0)))
    metric("queue_depth", "gauge", "Waiting work by queue.",
           [q for name, key in (("questions", "queue"), ("backlog_lines", "backlog"), ("lines_channel", "lines_inbox"))
            for q in per(lambda v, key=key: v.status.get(key, 0), queue=name)] +
           [({"queue": "in_flight"}, g["in_flight"])])
    metric("resident_memory_bytes", "gauge", "Resident memory of each actor process on this node.",
           [({"actor": name}, v) for name, v in sorted(resident_bytes(front.pids_files).items())])
    metric("kv_pool_bytes", "gauge", "Bytes of the target's KV pool (sinks + ring), allocated once.",
           per(lambda v: v.status.get("kv_pool_bytes", 0)))
    metric("dropped_lines_total", "counter", "Stream input dropped or repaired, by reason.",
           [({**v.labels(), "reason": k}, n) for v in views for k, n in sorted(v.drops.items())])
    metric("answers_total", "counter", "Operator requests by outcome at the cache owner.",
           [q for k in ("answers", "expired", "cancelled") for q in per(lambda v, k=k: v.status.get(k, 0), outcome=k)])

    actors = list(dict.fromkeys([*(actor_name(role, v.node or "") for role in ROLES for v in views),
                                 *front.restarts]))      # a group's each, and a site's front ("site")
    metric("actor_restarts_total", "counter", "Restarts of the pipeline after an actor's death, by the actor that died "
           "(pipeline/launch/supervise.py).", [({"actor": a}, front.restarts.get(a, 0)) for a in actors])
    metric("analysis_running", "gauge", "1 while an analysis is being written (a question preempts it).",
           per(lambda v: int(v.status.get("analysing", False))))
    metric("analyses_preempted_total", "counter", "Analyses cut short by an operator question (asked again later).",
           per(lambda v: v.status.get("preempted", 0)))
    metric("http_requests_total", "counter", "HTTP requests by endpoint and status code.",
           [({"endpoint": k[1], "code": str(k[2])}, v) for k, v in sorted(front.counts.items(), key=str)
            if isinstance(k, tuple) and k[0] == "requests"])
    metric("client_disconnects_total", "counter", "Requests whose client went away (or went silent for "
           "serve.request_timeout_s) before the answer ended.", [({}, front.counts["client_disconnects"])])
    metric("connections_refused_total", "counter", "HTTP connections refused with 503: keyed connections past "
           "serve.max_connections (pipeline/serve/http_api.py).", [({}, front.counts["connections_refused"])])
    metric("connections_cut_total", "counter", "HTTP connections whose key was not yet checked, cut to make room: "
           "past serve.max_connections_per_peer from their address, or serve.max_connections in all (oldest first).",
           [({}, front.counts["connections_cut"])])
    metric("heads_too_large_total", "counter", "HTTP requests whose line and headers passed serve.max_head_bytes: "
           "431, closed before the rest was read.", [({}, front.counts["heads_too_large"])])
    metric("zmq_refused_total", "counter", "zmq clients refused, by the bound (pipeline/serve/zmq_api.py): no key in "
           "the handshake, past serve.max_zmq_peers, or no worker free (serve.max_waiting).",
           [({"reason": r}, front.counts[f"zmq_{k}"]) for r, k in (("handshake", "handshakes_refused"),
                                                                   ("max_zmq_peers", "peers_refused"),
                                                                   ("busy", "busy"))])
    metric("internal_errors_total", "counter", "Requests whose handling failed inside ringspec: each answered with a "
           "500 naming the error's type and logged on stderr.", [({}, front.counts["internal_errors"])])
    metric("zmq_replies_dropped_total", "counter", "zmq replies that could not be packed (msgpack), dropped and "
           "counted; the request's other replies still go.", [({}, front.counts["zmq_replies_dropped"])])
    metric("answers_lost_total", "counter", "Requests ended with an error because their stream's node group was "
           "started again (a site: pipeline/serve/site_link.py); the asker is told to ask again.",
           [({}, front.counts["answers_lost"])])
    metric("cancels_undelivered_total", "counter", "Cancels of an answer that could not reach its stream's owner "
           "(its node gone from the site).", [({}, front.counts["cancels_undelivered"])])
    metric("line_surprise", "histogram", "Scored stream lines by surprise: the z of a line's mean -log p against its "
           "template's baseline (pipeline/stream/surprise.py; replay.score_stream).", [])
    for v in views:
        at = f'stream="{_escape(v.name)}",' if v.name else ""
        whole = f'{{stream="{_escape(v.name)}"}}' if v.name else ""
        for bound, count in zip([*map(_number, SURPRISE_BUCKETS), "+Inf"], np.cumsum(v.surprise)):
            out.append(f'ringspec_line_surprise_bucket{{{at}le="{bound}"}} {int(count)}')
        out.append(f"ringspec_line_surprise_sum{whole} {_number(v.surprise_sum)}")
        out.append(f"ringspec_line_surprise_count{whole} {int(v.surprise.sum())}")
    for name, values, help_text in (("request_ttft_ms", front.ttft_ms, "Request to first answer token, ms."),
                                    ("request_latency_ms", front.total_ms, "Request to last answer token, ms.")):
        vals = np.fromiter(list(values), float)
        samples = [({"quantile": str(q)}, float(np.quantile(vals, q)) if len(vals) else float("nan"))
                   for q in QUANTILES]
        metric(name, "summary", help_text + f" Quantiles over the last {values.maxlen} answered requests.", samples)
        out.append(f"ringspec_{name}_sum {_number(float(vals.sum()))}")
        out.append(f"ringspec_{name}_count {len(vals)}")
    return "\n".join(out) + "\n"


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    value = float(value)
    if value != value:
        return "NaN"
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)

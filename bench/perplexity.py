"""Streaming perplexity of a log under several cache policies, every one fed the same rendered text (`render`).

Owns the per-policy scoring loops, the resident-memory readings and the NLL-over-position series. Never parses argv
and never prints (progress bars aside, on stderr); builds engines through `make_engine` and touches no engine
internals except `index.evict_to` (naive's position offset); naive's float32 angles are a runner option.

Modes (S sinks, W window, positions counted from the first token of the stream):
  sink       S sinks + the W most recent positions (ringspec's ring policy)
  window     the same with S = 0
  recompute  sliding window with re-computation: each stride chunk is scored by a fresh full-cache pass over the
             W - stride tokens before it plus the chunk, so every scored token has >= W - stride tokens of context
  naive      a plain ring: no sinks, absolute positions starting at `naive_offset`, RoPE angles formed in float32
  dense      full cache until the model's context length or a KV memory budget, then a reported stop

Every mode's `ppl_post_wrap` is over the same tokens, positions >= S + W (the sink ring's first wrap), so the modes
compare on one set; `cache_first_eviction` says where each mode's own cache first drops a position.

`run_eval` is the `eval-stream` verb: one evaluation (`EvalReport`) or, when S or W is a list, an ablation
(`AblationReport`).
"""
from __future__ import annotations

import gc
import math
import struct
import sys
import time
import zlib
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from bench import svg
from models.convert import load_card
from models.handle import Model
from models.registry import converted_dir
from models.runner import kv_bytes_per_slot
from pipeline import config
from pipeline.decode.assemble import make_engine
from pipeline.process import proc_status
from pipeline.report import Report
from pipeline.stream.records import read_log, render

MODES = ("sink", "window", "recompute", "naive", "dense")
WINDOW = 256         # the evaluation's own W (short: a log wraps it); the profile's cache.window is the pipeline's
MEMORY_NOTE = ("all modes run one after another in one process: rss figures are that process's VmRSS; peak is "
               "VmHWM, reset before each mode through /proc/self/clear_refs when the kernel allows it "
               "(peak_is_per_mode), else the process-wide peak so far")


# -- memory --------------------------------------------------------------------------------------------------------

def _engine(gguf: str, sink: int, window: int, chunk: int, threads: int, rope_angles: str = "float64"):
    """A scoring engine: no draft, `chunk` rows a pass, the batch-invariance probe skipped (nothing is generated)."""
    cfg = config.override(config.parse({}), {"model.gguf": str(gguf), "model.threads": threads, "model.max_rows": chunk,
                                             "cache.sink": sink, "cache.window": window, "draft.kind": "none"})
    return make_engine(cfg, check_rows=False, rope_angles=rope_angles)

def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs "5"); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# -- scoring -------------------------------------------------------------------------------------------------------
SCORE_CHUNK = 2048      # tokens per scored feed (the progress bar's step; feeds join: the NLLs are the same)


def _ring_nll(engine, ids: np.ndarray, nll: np.ndarray, bar) -> None:
    """nll[t - 1] = -log p(ids[t]) for t >= 1, streamed through the ring (the graph's in-pass surprisal)."""
    for a in range(0, len(ids), SCORE_CHUNK):
        got = engine.feed(ids[a:a + SCORE_CHUNK], score=True)
        nll[max(a, 1) - 1:a + len(got) - 1] = got[1:] if a == 0 else got
        if bar is not None:
            bar.update(len(got) - (a == 0))


def _recompute_nll(engine, ids: np.ndarray, nll: np.ndarray, bar, window: int, stride: int) -> None:
    """Score [a, a + stride) from a fresh pass over [a - (window - stride), a + stride), for a = 0, stride, ...

    Each pass starts at position 0 of an emptied cache (RoPE scores depend only on position differences), and is one
    `feed` so its chunk boundaries (multiples of max_rows from the pass start) match the streaming modes' while the
    pass starts at 0.
    """
    for a in range(0, len(ids), stride):
        c = max(0, a - (window - stride))
        lo, hi = max(a, 1), min(a + stride, len(ids))
        engine.rollback(0)
        got = engine.feed(ids[c:a + stride], score=True)
        nll[lo - 1:hi - 1] = got[lo - c:hi - c]
        if bar is not None:
            bar.update(hi - lo)


def _angle_error(first: int, last: int, head_dim: int, base: float) -> float:
    """Largest |float32 angle - float64 angle| (radians) over the positions [first, last] (sampled)."""
    pos = np.unique(np.linspace(first, last, 257).astype(np.int64))
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    f32 = pos.astype(np.float32)[:, None] * inv.astype(np.float32)[None, :]
    return float(np.abs(f32.astype(np.float64) - pos[:, None] * inv[None, :]).max())


def _ppl(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(math.exp(values.mean())) if len(values) else None


# -- the evaluation ------------------------------------------------------------------------------------------------
def stream_ids(log: str, fmt: str | None, gguf: str, max_tokens: int = 0) -> np.ndarray:
    """Token ids of the rendered log (the replay's renderer), truncated to max_tokens (0: all)."""
    text = render(read_log(log, fmt))
    ids = np.asarray(Model.of(gguf).tokenizer.encode(text), np.int64)
    return ids[:max_tokens] if max_tokens else ids


def evaluate_stream(log: str, fmt: str | None = None, modes=MODES, sink: int = 4, window: int = WINDOW,
                    max_tokens: int = 0, stride: int | None = None, naive_offset: int = 1_000_000,
                    dense_budget_mb: float = 1024.0, gguf: str = "default", chunk: int = 64, threads: int = 2,
                    progress: bool = True, ids=None) -> dict:
    """Score the rendered log under each mode; returns {"_meta": {...}, "modes": {name: {... "nll": [...]}}}.

    nll[i] is the NLL of the token at stream position i + 1 (None where a mode did not score it: dense past its
    stop). `ids` overrides the log's tokens (tests).
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; choose from {','.join(MODES)}")
    stride = max(1, window // 8) if stride is None else stride
    if "recompute" in modes and not 1 <= stride <= window / 8:
        raise ValueError(f"recompute stride {stride} must be in 1..W/8 = {window / 8:g} (W >= 8)")
    path = Model.of(gguf).gguf
    card = load_card(converted_dir(path))
    cfg = card["config"]
    ids = stream_ids(log, fmt, gguf, max_tokens) if ids is None else np.asarray(ids, np.int64)
    n = len(ids)
    if n < 2:
        raise ValueError(f"the stream has {n} token(s); scoring needs at least 2")
    wrap = sink + window
    kv_bytes = kv_bytes_per_slot(cfg, config.parse({}).model.resolved(card).pool_dtype)   # _engine's
    meta = {"log": str(log), "n_tokens": n, "sink": sink, "window": window, "chunk": chunk, "threads": threads,
            "wrap_position": wrap, "n_scored_post_wrap": max(0, n - wrap),
            "post_wrap_target": 10 * wrap, "post_wrap_target_met": n - wrap >= 10 * wrap,
            "memory_note": MEMORY_NOTE, "context_length": cfg["context_length"],
            "series": "nll[i] is the NLL of the token at position i + 1; null where not scored"}
    results = {}
    for mode in modes:
        nll = np.full(n - 1, np.nan)
        extra: dict = {}
        per_mode_peak = _reset_peak()
        before = proc_status()
        t_build = time.perf_counter()
        engine = None
        if mode in ("sink", "window", "naive"):
            s = sink if mode == "sink" else 0
            engine = _engine(gguf, s, window, chunk, threads, rope_angles="float32" if mode == "naive" else "float64")
            extra["cache_first_eviction"] = s + window
            scored_to = n
        elif mode == "recompute":
            engine = _engine(gguf, 0, window, chunk, threads)
            extra.update(stride=stride, min_context=window - stride, cache_first_eviction=None,
                         note=f"every scored token has >= W - stride = {window - stride} tokens of context "
                              f"(stride {stride} <= W/8 = {window / 8:g}); cost ~W/stride forward rows per token")
            scored_to = n
        else:
            cap = min(cfg["context_length"], int(dense_budget_mb * 2**20 // kv_bytes))
            scored_to = min(n, cap)
            extra.update(context_length=cfg["context_length"], budget_mb=dense_budget_mb,
                         kv_bytes_per_token=kv_bytes, capacity_tokens=cap, cache_first_eviction=None,
                         stopped=scored_to < n, stopped_at=scored_to if scored_to < n else None)
            if scored_to < n:
                why = ("the model's context length" if cap == cfg["context_length"]
                       else f"the KV budget of {dense_budget_mb:g} MB")
                extra["stop_reason"] = f"full cache reached {why}: stopped after {scored_to} tokens"
            if scored_to >= 2:
                dense_window = min(cap, -(-scored_to // 256) * 256)    # rounded up: fewer distinct graphs
                engine = _engine(gguf, 0, dense_window, chunk, threads)
        build_s = time.perf_counter() - t_build
        bar = _bar(mode, max(scored_to - 1, 0), progress)
        t0 = time.perf_counter()
        if engine is not None:
            if mode == "recompute":
                _recompute_nll(engine, ids, nll, bar, window, stride)
            elif mode == "naive":
                engine.index.evict_to(naive_offset)        # S = 0: the ring starts at the offset, nothing to keep
                _ring_nll(engine, ids, nll, bar)
                extra.update(position_offset=naive_offset, rope_angles="float32",
                             max_angle_error_rad=_angle_error(naive_offset, naive_offset + n - 1,
                                                              cfg["head_dim"], cfg["rope_base"]))
            else:
                _ring_nll(engine, ids[:scored_to], nll, bar)
        wall = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        after = proc_status()
        del engine
        gc.collect()
        scored = int((~np.isnan(nll)).sum())
        post = nll[wrap - 1:] if wrap - 1 < len(nll) else nll[:0]
        results[mode] = {
            "ppl": _ppl(nll), "ppl_post_wrap": _ppl(post), "nll_mean": _mean(nll),
            "n_scored": scored, "n_scored_post_wrap": int((~np.isnan(post)).sum()), "wrap_position": wrap,
            "tokens_per_s": scored / wall if wall > 0 else 0.0, "wall_s": wall, "build_s": build_s,
            "memory": {"rss_before_mb": before["vmrss_mb"], "rss_after_mb": after["vmrss_mb"],
                       "peak_mb": after["vmhwm_mb"], "peak_is_per_mode": per_mode_peak},
            **extra, "nll": [None if math.isnan(x) else float(x) for x in nll]}
    if "naive" in results and "window" in results:
        _naive_note(results["naive"], results["window"], naive_offset, cfg["context_length"])
    return {"_meta": meta, "modes": results}


def ablate(log: str, fmt: str | None, sinks, windows, max_tokens: int = 0, recompute: bool = True,
           gguf: str = "default", threads: int = 2, progress: bool = True) -> list[dict]:
    """The sink policy for every (S, W) (S = 0 is the window policy), plus the recompute reference per W: one row
    each, PPL over all tokens and after the first wrap, on the same tokens."""
    ids = stream_ids(log, fmt, gguf, max_tokens)
    rows = []
    for window in windows:
        if recompute:
            ref = summary(evaluate_stream(log, fmt, ["recompute"], 0, window, gguf=gguf, threads=threads,
                                          progress=progress, ids=ids))["recompute"]
            rows.append({"policy": "recompute", "sink": None, "window": window, "ppl": ref["ppl"],
                         "ppl_post_wrap": ref["ppl_post_wrap"], "tokens_per_s": ref["tokens_per_s"]})
        for sink in sinks:
            res = evaluate_stream(log, fmt, ["sink"], sink, window, gguf=gguf, threads=threads, progress=progress,
                                  ids=ids)
            row = summary(res)["sink"]
            rows.append({"policy": "window" if sink == 0 else "sink", "sink": sink, "window": window,
                         "ppl": row["ppl"], "ppl_post_wrap": row["ppl_post_wrap"],
                         "tokens_per_s": row["tokens_per_s"], "n_tokens": res["_meta"]["n_tokens"],
                         "post_wrap_target_met": res["_meta"]["post_wrap_target_met"]})
    return rows


def _mean(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else None


def _naive_note(naive: dict, window: dict, offset: int, ctx: int) -> None:
    a = np.array([np.nan if x is None else x for x in naive["nll"]])
    b = np.array([np.nan if x is None else x for x in window["nll"]])
    diff = np.abs(a - b)
    naive["vs_window_mean_abs_dnll"] = float(np.nanmean(diff))
    naive["vs_window_max_abs_dnll"] = float(np.nanmax(diff))
    naive["note"] = (
        f"positions {offset}..{offset + len(a)} (past the trained context {ctx}) with float32 RoPE angles (max "
        f"angle error {naive['max_angle_error_rad']:.3g} rad). Keys are rotated at their absolute positions and "
        f"RoPE scores depend only on position differences, so a ring that keeps absolute positions is the window "
        f"policy up to angle rounding: the measured gap to `window` (float64 angles, positions from 0) is the cost "
        f"of float32 angles at this offset, not a context-length collapse")


def summary(result: dict) -> dict:
    """The --json object: each mode name -> its figures without the NLL series (run metadata stays in --out)."""
    return {mode: {k: v for k, v in row.items() if k != "nll"} for mode, row in result["modes"].items()}


def _bar(mode: str, total: int, enabled: bool):
    if not enabled:
        return None
    return tqdm(total=total, desc=f"eval-stream {mode}", unit="tok", file=sys.stderr, leave=False)


# -- plot ----------------------------------------------------------------------------------------------------------
COLORS = {"sink": (31, 119, 180), "window": (214, 39, 40), "recompute": (44, 160, 44), "naive": (148, 103, 189),
          "dense": (255, 127, 14)}


def _smoothed(series, span: int) -> np.ndarray:
    x = np.array([np.nan if v is None else v for v in series], np.float64)
    ok = ~np.isnan(x)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    lo = np.maximum(np.arange(len(x)) - span + 1, 0)
    cnt = k[1:] - k[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (c[1:] - c[lo]) / cnt
    out[~ok] = np.nan
    return out


def write_plot(result: dict, path: str, span: int = 64) -> str:
    """NLL over position (trailing mean over `span` tokens) per mode, with the wrap marked: SVG (labelled) when
    `path` ends in .svg, else a PNG drawn with numpy + zlib (no text; the colors are `COLORS`, also returned)."""
    series = {m: _smoothed(r["nll"], span) for m, r in result["modes"].items()}
    n = max(len(s) for s in series.values())
    finite = np.concatenate([s[~np.isnan(s)] for s in series.values()])
    ymax = float(np.nanmax(finite)) * 1.05 if len(finite) else 1.0
    width, height, pad = 900, 400, 50
    fx = lambda i: pad + (width - 2 * pad) * i / max(n - 1, 1)        # noqa: E731
    fy = lambda v: height - pad - (height - 2 * pad) * v / ymax       # noqa: E731
    wrap = result["_meta"]["wrap_position"] - 1
    legend = ", ".join(f"{m}=rgb{COLORS[m]}" for m in series)
    if str(path).endswith(".svg"):
        parts = svg.frame(width, height, f"NLL (nats, trailing mean of {span}) over position; y max {ymax:.2f}", pad,
                          pad, width - pad, height - pad)
        parts.append(svg.label(width / 2, height - 15, f"position (tokens, 0..{n})", anchor="middle"))
        if 0 <= wrap < n:
            parts.append(f'<line x1="{fx(wrap):.1f}" y1="{pad}" x2="{fx(wrap):.1f}" y2="{height - pad}" '
                         f'stroke="gray" stroke-dasharray="4"/>')
        for k, (mode, s) in enumerate(series.items()):
            rgb = "rgb({},{},{})".format(*COLORS[mode])
            step = max(1, n // 1500)                                 # a readable file: <= ~1500 points a line
            pts = " ".join(f"{fx(i):.1f},{fy(s[i]):.1f}" for i in range(0, len(s), step) if not np.isnan(s[i]))
            parts += [svg.polyline(pts, rgb, 1.2), svg.label(width - pad - 100, pad + 16 * k, mode, rgb)]
        svg.save(parts, path)
        return legend
    img = np.full((height, width, 3), 255, np.uint8)
    img[height - pad, pad:width - pad] = 0
    img[pad:height - pad, pad] = 0
    if 0 <= wrap < n:
        img[pad:height - pad:4, int(fx(wrap))] = 128
    for mode, s in series.items():
        i = np.nonzero(~np.isnan(s))[0]
        if len(i) < 2:
            continue
        t = np.linspace(i[0], i[-1], 40 * (width - 2 * pad))        # dense samples along the polyline
        v = np.interp(t, i, s[i])
        img[np.clip(fy(v).astype(int), 0, height - 1), np.clip(fx(t).astype(int), 0, width - 1)] = COLORS[mode]
    _write_png(path, img)
    return legend


def _write_png(path: str, img: np.ndarray) -> None:
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def write_ablation_plot(rows: list[dict], path: str) -> str:
    """Post-wrap PPL of an ablation as SVG, log-scaled: over W (one line per S, and recompute) when several windows
    ran, else over S (recompute as a level line)."""
    windows = sorted({r["window"] for r in rows})
    sinks = sorted({r["sink"] for r in rows if r["sink"] is not None})
    over_w = len(windows) > 1
    xs = windows if over_w else sinks
    lines: dict[str, dict] = {}
    for r in rows:
        if r["ppl_post_wrap"] is None:
            continue
        name = "recompute" if r["sink"] is None else ("window (S=0)" if r["sink"] == 0 else f"sink S={r['sink']}")
        if over_w:
            lines.setdefault(name, {})[r["window"]] = r["ppl_post_wrap"]
        elif r["sink"] is None:
            lines[name] = dict.fromkeys(xs, r["ppl_post_wrap"])
        else:
            lines.setdefault("sink", {})[r["sink"]] = r["ppl_post_wrap"]
    values = [v for line in lines.values() for v in line.values()]
    lo, hi = math.log(min(values) * 0.95), math.log(max(values) * 1.05)
    width, height, pad = 720, 380, 60
    fx = lambda i: pad + (width - 2 * pad - 110) * i / max(len(xs) - 1, 1)                   # noqa: E731
    fy = lambda v: height - pad - (height - 2 * pad) * (math.log(v) - lo) / max(hi - lo, 1e-9)  # noqa: E731
    palette = ["#2ca02c", "#d62728", "#1f77b4", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    over = "window W" if over_w else f"sinks S, W = {windows[0]}"
    parts = svg.frame(width, height, f"PPL after the first wrap (log scale) over {over}", pad, pad, width - pad - 110,
                      height - pad)
    for i, x in enumerate(xs):
        parts.append(svg.label(fx(i), height - pad + 16, x, anchor="middle"))
    for v in sorted({min(values), max(values), *(round(math.exp(lo + (hi - lo) * k / 4), 2) for k in (1, 2, 3))}):
        parts.append(svg.label(pad - 6, fy(v) + 4, f"{v:.3g}", anchor="end"))
    for k, (name, line) in enumerate(lines.items()):
        color = palette[k % len(palette)]
        pts = " ".join(f"{fx(xs.index(x)):.1f},{fy(v):.1f}" for x, v in sorted(line.items()))
        parts += [svg.polyline(pts, color, 1.8, dash=name == "recompute"),
                  svg.label(width - pad - 100, pad + 16 * k, name, color)]
    svg.save(parts, path)
    return path


def int_list(text: str, what: str) -> list[int]:
    """"4" or "0,1,2,4,8" -> [4] or [0, 1, 2, 4, 8]; `what` names the flag in the error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{what} {text!r}: expected an integer or a comma-separated list") from None
    if not values or min(values) < 0:
        raise ValueError(f"--{what} {text!r}: expected non-negative integers")
    return values


@dataclass
class EvalReport(Report):
    """One evaluation: --json prints each mode's figures (`summary`), --out writes it all (NLL series, _meta)."""

    def as_dict(self) -> dict:
        return summary(self.data)

    def saved(self) -> dict:
        return self.data

    def text(self) -> str:
        meta = self.data["_meta"]
        lines = [f"{meta['n_tokens']} tokens, wrap at {meta['wrap_position']}; {MEMORY_NOTE}"]
        for mode, r in self.as_dict().items():
            post = "-" if r["ppl_post_wrap"] is None else f"{r['ppl_post_wrap']:.3f}"
            lines.append(f"{mode:10s} ppl {r['ppl']:9.3f}  post-wrap {post:>9s}  {r['tokens_per_s']:7.1f} tok/s  "
                         f"rss {r['memory']['rss_after_mb']:.0f} MB peak {r['memory']['peak_mb']:.0f} MB  "
                         f"{r.get('note', '')}{r.get('stop_reason', '')}")
        return "\n".join(lines)


@dataclass
class AblationReport(Report):
    """An ablation's rows (`ablate`), one per policy and (S, W)."""

    def text(self) -> str:
        lines = [f"{'policy':10s} {'S':>3s} {'W':>5s} {'ppl':>9s} {'post-wrap':>10s} {'tok/s':>7s}"]
        for row in self.data:
            post = "-" if row["ppl_post_wrap"] is None else f"{row['ppl_post_wrap']:.3f}"
            s = "-" if row["sink"] is None else str(row["sink"])
            lines.append(f"{row['policy']:10s} {s:>3s} {row['window']:5d} {row['ppl']:9.3f} {post:>10s} "
                         f"{row['tokens_per_s']:7.1f}")
        return "\n".join(lines)


def run_eval(cfg, log: str, fmt: str | None = None, sinks: str | None = None, windows: str = str(WINDOW),
             modes: str = ",".join(MODES), max_tokens: int = 0, stride: int | None = None,
             naive_offset: int = 1_000_000, dense_budget_mb: float = 1024.0, quiet: bool = False,
             plot: str | None = None) -> Report:
    """Teacher-forced NLL of a rendered log under each policy (sink, window, recompute, naive, dense); --json prints
    one object mapping each mode to its figures (ppl, ppl_post_wrap, ...); run metadata and NLL series go to --out.

    The profile gives the model, its threads and the default sinks (cache.sink); `sinks` and `windows` are one
    integer each, or comma-separated lists for an ablation. plot: NLL over position (.svg or .png), or an ablation's
    PPL over S or W (.svg); its path goes to stderr."""
    sink_list = int_list(str(cfg.cache.sink) if sinks is None else sinks, "sink")
    window_list = int_list(windows, "window")
    if len(sink_list) > 1 or len(window_list) > 1:
        if plot and not plot.endswith(".svg"):
            raise ValueError(f"--plot {plot!r}: an ablation plot is SVG; name it .svg")
        rows = ablate(log, fmt, sink_list, window_list, max_tokens, "recompute" in modes.split(","), cfg.model.gguf,
                      cfg.model.threads, not quiet)
        if plot:
            print(f"plot {write_ablation_plot(rows, plot)}", file=sys.stderr)
        return AblationReport(rows)
    out = evaluate_stream(log, fmt, modes.split(","), sink_list[0], window_list[0], max_tokens, stride, naive_offset,
                          dense_budget_mb, cfg.model.gguf, threads=cfg.model.threads, progress=not quiet)
    if plot:
        print(f"plot {plot}: {write_plot(out, plot)}", file=sys.stderr)
    return EvalReport(out)

"""One pass over the rows of several streams: sessions of the several-stream graph at a few sizes, each stream's
pools in a pools-only `Runner` of its own.

Owns the pass: which graph runs it (the smallest size that holds the streams with rows: the target's are the
single-stream graph and one with `model.pass_streams` slots), which slot each stream takes in it (the streams with
rows first, in stream order; the slots left over carry idle streams), the streams' rows concatenated in slot order
(ids, rotation tables, logit rows, targets), each stream's mask, recent section, path and pools bound under its
slot's names (models/graph.py, `streams`), and the outputs handed back (each stream's rows' K/V and `nll` to its
runner, its logits returned). A slot without rows carries two idle rows that see only themselves (their outputs
dropped). Never decides what a stream sees (its mask, from its own `RingIndex`) or keeps (its runner's `store`).

Why a stream's rows get the bits they get alone: its attention runs the single-stream graph's nodes on its own
inputs, and every other operator is batch invariant for 2..64 rows (models/runner.py, `python run.py doctor`). So a
pass carries at most SOFTMAX_ROWS rows in all, and each stream's share keeps the runner's rule (no lone row).

Why several sizes: a slot costs its attention's nodes (~1,200 for SmolLM2) whether it carries rows or idles, so a
pass of one stream's rows costs about twice as much in the 4-stream graph as in the single-stream one (docs/
streams.md, "What a several-stream pass is"); each added size costs a session (its own packed weights and arena:
134-136 MB PSS for SmolLM2, `python run.py bench --task streams`).

Why few slots: a slot also holds ONNX Runtime's state for its nodes (~8 MB for SmolLM2), and a pass rarely finds
more than two streams' rows that fit beside each other (a feed chunk is 32 rows), so the widest graph has fewer slots
than there are streams when asked (`sizes`; the target: `model.pass_streams`, 2 by default). The streams then take
turns in its slots, a slot rebinding the pools of the stream now in it (`_Graph.bind`); an added stream costs its
pools and its runner's small buffers, not a slot (docs/streams.md, "Figures").
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernels.ring import NEG, RingSpec
from models.graph import SOFTMAX_ROWS
from models.runner import Runner, RunnerOptions, open_session


def pack(rows: list[int], slots: int) -> list[int]:
    """Which candidate shares (their row counts, in the order they are owed a pass) one pass of a graph with `slots`
    streams' slots carries: each in turn while a slot is free and the rows fit (SOFTMAX_ROWS in all, every slot
    counted as 2 idle rows until a share fills it, a 1-row share as 2); the first always. One slot: the first only."""
    chosen, budget = [], SOFTMAX_ROWS - 2 * slots
    for i, n in enumerate(rows):
        extra = max(n, 2) - 2
        if chosen and (len(chosen) == slots or extra > budget):
            continue
        chosen.append(i)
        budget -= extra
    return chosen


@dataclass
class Rows:
    """One stream's rows in a pass: `Runner.forward`'s arguments."""
    tokens: np.ndarray
    positions: np.ndarray
    mask: np.ndarray
    logit_rows: np.ndarray | None = None
    recent_slots: np.ndarray | None = None
    path: np.ndarray | None = None
    ring_from: int = 0
    targets: np.ndarray | None = None


class Streams:
    def __init__(self, model_dir: str | os.PathLike, spec: RingSpec, streams: int,
                 opts: RunnerOptions = RunnerOptions(), sizes: tuple[int, ...] | None = None):
        """sizes: the graphs opened, by how many streams' slots each has (default: 1 and `streams`); a pass carries
        at most the largest's (`widest`) streams."""
        if streams < 2:
            raise ValueError(f"streams = {streams}: one stream is a plain Runner")
        sizes = tuple(sorted(set(sizes or (1, streams))))
        if sizes[-1] > streams or sizes[0] < 1:
            raise ValueError(f"graph sizes {sizes}: from 1 up to the {streams} streams")
        if 2 * sizes[-1] > SOFTMAX_ROWS:
            raise ValueError(f"a graph of {sizes[-1]} streams' slots: a pass carries at most {SOFTMAX_ROWS} rows, 2 "
                             f"per slot")
        self.runners = [Runner(model_dir, spec, opts, session=False) for _ in range(streams)]
        first = self.runners[0]
        opts = first.opts                                  # the kernel named ("auto" resolved for this model)
        self.spec, self.opts, self.n, self.widest = spec, opts, streams, sizes[-1]
        cfg = first.cfg
        L, KVH, D, V = cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"], cfg["vocab_size"]
        self.graphs = [_Graph(open_session(Path(model_dir), first.card, spec, opts, c), c) for c in sizes]
        T = SOFTMAX_ROWS                                   # the most rows a pass carries, every stream's together
        self._ids = np.zeros(T, np.int64)
        self._tables = np.zeros((4, T, D // 2), np.float32)
        self._rows = np.zeros(T, np.int64)
        self._targets = np.zeros(T, np.int64)
        self._logits = np.zeros((1, T, V), np.float32)
        self._nll = np.zeros(T, np.float32)
        self._new_kv = np.zeros((2, L * KVH * T * D), np.dtype(opts.pool_dtype))
        self._recent = [Runner.recent_buffer(cfg, opts) for _ in range(self.widest)]   # slot j's stream's section
        S = spec.sink                                      # an idle slot: 2 rows, each seeing only its own column
        self._idle_mask = np.full((2, S + 1 + 2), NEG, np.float32)
        self._idle_mask[0, S + 1] = self._idle_mask[1, S + 2] = 0.0
        self._idle = Rows(np.zeros(2, np.int64), np.zeros(2, np.int64), self._idle_mask, np.zeros(0, np.int64))
        self.forward_s = 0.0
        self.passes = 0                                    # passes run (each stream's runner counts its shares)

    @property
    def passes_by_size(self) -> dict[str, int]:
        """Passes run by each graph, keyed by its slots (as text: figures travel as msgpack maps)."""
        return {str(g.size): g.passes for g in self.graphs}

    def forward(self, parts: list[Rows | None]) -> list[np.ndarray | None]:
        """One pass: parts[n] is stream n's rows (None: none this pass). Returns each stream's logits [M, V] (None
        for an idle stream), views valid until the next pass; each runner's `new_k`/`new_v`/`nll` hold its rows'."""
        if len(parts) != self.n:
            raise ValueError(f"{len(parts)} parts for a pass over {self.n} streams")
        busy = [n for n, p in enumerate(parts) if p is not None]
        if not busy:
            return [None] * self.n
        if len(busy) > self.widest:
            raise ValueError(f"{len(busy)} streams' rows in one pass: its widest graph has {self.widest} slots")
        graph = next(g for g in self.graphs if g.size >= len(busy))
        slots = busy + [n for n, p in enumerate(parts) if p is None][:graph.size - len(busy)]   # slot j: stream
        staged = [self.runners[n].stage(**vars(parts[n] if parts[n] is not None else self._idle),
                                        recent_into=self._recent[j]) for j, n in enumerate(slots)]
        T, M = sum(st.T for st in staged), sum(st.M for st in staged)
        if T > SOFTMAX_ROWS:
            raise ValueError(f"{T} rows in one pass (idle streams count 2): at most {SOFTMAX_ROWS}")
        spans, t, m = [], 0, 0
        for j, (n, st) in enumerate(zip(slots, staged)):
            self._ids[t:t + st.T] = st.ids
            self._tables[:, t:t + st.T] = st.tables
            np.add(st.rows, t, out=self._rows[m:m + st.M])
            self._targets[m:m + st.M] = st.targets
            graph.bind(j, n, self.runners[n], st)
            spans.append((t, m))
            t, m = t + st.T, m + st.M
        rows, targets = self._rows[:max(M, 2)], self._targets[:max(M, 2)]
        if M < 2:                                          # a 1-row head computes its row twice
            rows[M:], targets[M:] = (rows[0], targets[0]) if M else (0, 0)
        io = graph.io
        bind = io.bind_input
        bind("input_ids", "cpu", 0, np.int64, (T,), self._ids.ctypes.data)
        for name, table in zip(("cos", "sin", "cos_sink", "sin_sink"), self._tables[:, :T]):
            bind(name, "cpu", 0, np.float32, table.shape, table.ctypes.data)     # a contiguous row range
        bind("logit_rows", "cpu", 0, np.int64, rows.shape, rows.ctypes.data)
        bind("targets", "cpu", 0, np.int64, targets.shape, targets.ctypes.data)
        cfg = self.runners[0].cfg
        L, KVH, D = cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"]
        logits = self._logits[:, :len(rows)]
        new_k, new_v = (buf[:L * KVH * T * D].reshape(L, KVH, T, D) for buf in self._new_kv)
        for name, a in (("logits", logits), ("nll", self._nll[:len(rows)]),
                        ("new_k", new_k.reshape(L * KVH, T, D)), ("new_v", new_v.reshape(L * KVH, T, D))):
            io.bind_output(name, "cpu", 0, a.dtype, a.shape, a.ctypes.data)
        t0 = time.perf_counter()
        graph.session.run_with_iobinding(io)
        took = time.perf_counter() - t0
        self.forward_s += took
        self.passes += 1
        graph.passes += 1
        out: list[np.ndarray | None] = [None] * self.n
        for n, st, (t, m) in zip(slots, staged, spans):
            if parts[n] is not None:
                self.runners[n].took(took, st, new_k[:, :, t:t + st.T], new_v[:, :, t:t + st.T],
                                     self._nll[m:m + st.M])
                out[n] = logits[0, m:m + st.M]
        return out

    def run(self, passes: list) -> list:
        """Pass coroutines, one per stream (None: idle), each yielding its `Rows` once and returning its result
        (pipeline/decode/local.py `prefill_pass`, `verify_pass`), run as one pass; returns their results."""
        logits = self.forward([None if c is None else next(c) for c in passes])
        results = []
        for c, got in zip(passes, logits):
            if c is None:
                results.append(None)
                continue
            try:
                c.send(got)
            except StopIteration as done:
                results.append(done.value)
            else:
                raise RuntimeError("a pass coroutine asked for a second pass")
        return results


class _Graph:
    """One size of the several-stream graph: its session, its binding and what each of its slots has bound (the
    stream whose sink pools are there, and that stream's ring view), so a pass rebinds only what moved."""

    def __init__(self, session, size: int):
        self.session, self.size, self.io = session, size, session.io_binding()
        self.passes = 0
        self._slots: list[tuple[int, tuple[int, int]] | None] = [None] * size    # (stream, ring view) per slot

    def bind(self, slot: int, stream: int, runner: Runner, st) -> None:
        """Stream `stream`'s share of this pass (`st`, staged by its `runner`) bound at `slot`."""
        tag = f".s{slot}" if self.size > 1 else ""
        held = self._slots[slot]
        if held is None or held[0] != stream:
            runner.bind_sinks(self.io, tag)
        runner.bind_stream(self.io, st, tag, ring=held != (stream, (st.ring_from, st.ring_width)))
        self._slots[slot] = (stream, (st.ring_from, st.ring_width))

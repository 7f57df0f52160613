"""One pass over the rows of several streams: one session of the several-stream graph, each stream's pools in a
pools-only `Runner` of its own.

Owns the pass: the streams' rows concatenated in stream order (ids, rotation tables, logit rows, targets), each
stream's mask, recent section, path and pools bound under its names (models/graph.py, `streams`), and the outputs
handed back (each stream's rows' K/V and `nll` to its runner, its logits returned). The graph has a fixed stream
count: a stream with no rows this pass rides as two idle rows that see only themselves (their outputs dropped).
Never decides what a stream sees (its mask, from its own `RingIndex`) or keeps (its runner's `store`).

Why a stream's rows get the bits they get alone: its attention runs the single-stream graph's nodes on its own
inputs, and every other operator is batch invariant for 2..64 rows (models/runner.py, `python run.py doctor`). So a
pass carries at most SOFTMAX_ROWS rows in all, and each stream's share keeps the runner's rule (no lone row).
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
                 opts: RunnerOptions = RunnerOptions()):
        if streams < 2:
            raise ValueError(f"streams = {streams}: one stream is a plain Runner")
        if 2 * streams > SOFTMAX_ROWS:
            raise ValueError(f"{streams} streams: a pass carries at most {SOFTMAX_ROWS} rows, 2 per idle stream")
        self.spec, self.opts, self.n = spec, opts, streams
        self.runners = [Runner(model_dir, spec, opts, session=False) for _ in range(streams)]
        first = self.runners[0]
        cfg = first.cfg
        L, KVH, D, V = cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"], cfg["vocab_size"]
        self.session = open_session(Path(model_dir), first.card, spec, opts, streams)
        self._io = self.session.io_binding()
        for n, runner in enumerate(self.runners):
            runner.bind_sinks(self._io, f".s{n}")
        T = SOFTMAX_ROWS                                   # the most rows a pass carries, every stream's together
        self._ids = np.zeros(T, np.int64)
        self._tables = np.zeros((4, T, D // 2), np.float32)
        self._rows = np.zeros(T, np.int64)
        self._targets = np.zeros(T, np.int64)
        self._logits = np.zeros((1, T, V), np.float32)
        self._nll = np.zeros(T, np.float32)
        self._new_kv = np.zeros((2, L * KVH * T * D), np.dtype(opts.kv_dtype))
        S = spec.sink                                      # an idle stream: 2 rows, each seeing only its own column
        self._idle_mask = np.full((2, S + 1 + 2), NEG, np.float32)
        self._idle_mask[0, S + 1] = self._idle_mask[1, S + 2] = 0.0
        self._idle = Rows(np.zeros(2, np.int64), np.zeros(2, np.int64), self._idle_mask, np.zeros(0, np.int64))
        self.forward_s = 0.0
        self.passes = 0                                    # passes run (each stream's runner counts its shares)

    def forward(self, parts: list[Rows | None]) -> list[np.ndarray | None]:
        """One pass: parts[n] is stream n's rows (None: none this pass). Returns each stream's logits [M, V] (None
        for an idle stream), views valid until the next pass; each runner's `new_k`/`new_v`/`nll` hold its rows'."""
        if len(parts) != self.n:
            raise ValueError(f"{len(parts)} parts for a pass over {self.n} streams")
        staged = [r.stage(**vars(p if p is not None else self._idle)) for r, p in zip(self.runners, parts)]
        T, M = sum(st.T for st in staged), sum(st.M for st in staged)
        if T > SOFTMAX_ROWS:
            raise ValueError(f"{T} rows in one pass (idle streams count 2): at most {SOFTMAX_ROWS}")
        spans, t, m = [], 0, 0
        for n, (runner, st) in enumerate(zip(self.runners, staged)):
            self._ids[t:t + st.T] = st.ids
            self._tables[:, t:t + st.T] = st.tables
            np.add(st.rows, t, out=self._rows[m:m + st.M])
            self._targets[m:m + st.M] = st.targets
            runner.bind_stream(self._io, st, f".s{n}")
            spans.append((t, m))
            t, m = t + st.T, m + st.M
        rows, targets = self._rows[:max(M, 2)], self._targets[:max(M, 2)]
        if M < 2:                                          # a 1-row head computes its row twice
            rows[M:], targets[M:] = (rows[0], targets[0]) if M else (0, 0)
        bind = self._io.bind_input
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
            self._io.bind_output(name, "cpu", 0, a.dtype, a.shape, a.ctypes.data)
        t0 = time.perf_counter()
        self.session.run_with_iobinding(self._io)
        took = time.perf_counter() - t0
        self.forward_s += took
        self.passes += 1
        out = []
        for runner, st, p, (t, m) in zip(self.runners, staged, parts, spans):
            if p is None:
                out.append(None)
                continue
            runner.took(took, st, new_k[:, :, t:t + st.T], new_v[:, :, t:t + st.T], self._nll[m:m + st.M])
            out.append(logits[0, m:m + st.M])
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


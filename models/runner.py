"""One model on ONNX Runtime: its session, its sink and ring KV pools, and preallocated I/O buffers.

Owns the K/V data (pools allocated once, bound in place through IOBinding) and the forward call. Never decides which
position is committed or visible: callers pass the per-row mask (from a `RingIndex`) and say which new rows to store
at which slots. Payload buffers are allocated once; a call makes only views and small index arrays.

Batch invariance (`RunnerOptions.batch_invariant`, on by default): no operator ever sees a single row. A 1-row pass
gets a padding row beside it (same token and position, masked both ways: it sees only itself, no row sees it) and a
1-row head gets its row twice. Why: ONNX Runtime's `MatMulNBits` computes a 1-row input with another kernel than a
2-or-more-row one (1e-6 apart on an AVX2-only EPYC, 2 and 1 threads, accuracy levels 0 and 4), and int8 activation
rounding grows that to 0.05 logits; every row of a 2..64-row pass is bit-identical to the same row in any other, for
every operator family of both graphs (`models/opcheck.py`; `python run.py doctor`). With the rule a row's logits and
K/V do not depend on how many rows share its pass, which greedy identity needs; the engine checks that at start-up
(`pipeline/decode/exactness.py`). The native kernel (`kernel = "native"`) computes a lone row as it does among others,
so on it the rule pads nothing (`Runner.padded`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from kernels.ring import NEG, RingSpec
from kernels.rope import rope_inv_freq, rope_tables, rope_tables_float32, sink_query_positions
from models.convert import load_card
from models.graph import SOFTMAX_ROWS, ensure_graph
from models.native import NativeSession, unreadable


@dataclass
class Staged:
    """One stream's share of a pass, in its runner's buffers (`Runner.stage`); T rows bound, M logit rows asked."""
    T: int                      # rows, the padding row of a 1-row pass included
    M: int
    pad: bool                   # a 1-row pass: row 1 is its padding row
    ids: np.ndarray             # int64 [T]
    tables: tuple               # cos, sin, cos_sink, sin_sink: float32 [T, D/2] each
    mask: np.ndarray            # float32 [T, pool columns + m + W]
    rows: np.ndarray            # int64 [M]: the rows whose logits are asked, in this stream's numbering
    targets: np.ndarray         # int64 [M]: each logit row's next token (0: none given)
    recent_k: np.ndarray        # [L * KVH, m, D]
    recent_v: np.ndarray
    path: np.ndarray | None     # int64 [T, W] (a tree graph), else None
    ring_from: int              # the ring slots the pass reads: [ring_from, ring_from + ring_width)
    ring_width: int


KV_DTYPES = ("auto", "float16", "float32")      # RunnerOptions.kv_dtype's choices
KERNELS = ("auto", "native", "nbits")           # RunnerOptions.kernel's choices


@dataclass(frozen=True)
class RunnerOptions:
    threads: int = 2
    max_rows: int = 32          # largest block/chunk one pass may carry
    max_recent: int = 64        # largest "recent" section (committed positions passed beside the new rows)
    accuracy_level: int = 4     # MatMulNBits int8 activations: the fast exact-weight path (docs/design.md)
    rope_angles: str = "float64"  # "float32" only for the naive baseline of eval-stream (docs/design.md says: don't)
    kv_dtype: str = "auto"      # K/V pools: "float16" | "float32" | "auto" = the kernel's own (`pool_dtype`)
    spin: bool = True           # ORT's intra-op threads spin between ops (fast alone; steals cores from neighbours)
    trees: bool = False         # the token-tree graph (models.graph): every pass lays rows out along their root path
    batch_invariant: bool = True  # no operator sees one row (see the module docstring); off only to measure its cost
    profile: str = ""           # a file prefix: ONNX Runtime's profiler records every node (bench/opprofile.py)
    kernel: str = "auto"        # the pass: "native" (models/native.py) | "nbits" (ONNX Runtime's MatMulNBits) |
    # "auto": native where it reads the model here (`resolved`), else nbits

    def __post_init__(self):
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype = {self.kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel = {self.kernel!r}: expected one of {', '.join(KERNELS)}")

    def resolved(self, card: dict) -> RunnerOptions:
        """These options for the model of `card`, the kernel named: "auto" is the native pass unless
        `models.native.unreadable` says why not (no compiler at install, a float32 or float16 linear)."""
        if self.kernel != "auto":
            return self
        return replace(self, kernel="nbits" if unreadable(card) else "native")

    @property
    def pool_dtype(self) -> str:
        """The K/V pools' type: kv_dtype if named, else the kernel's: float16 on the native pass (its attention reads
        a float16 pool in place: half the bytes a token, as llama.cpp's default cache; docs/kernel.md), float32 on
        MatMulNBits (ONNX Runtime casts a float16 pool to float32 every pass: docs/speed.md)."""
        if self.kv_dtype != "auto":
            return self.kv_dtype
        if self.kernel == "auto":
            raise ValueError("the pools' type follows the kernel: resolve \"auto\" with the model's card first "
                             "(RunnerOptions.resolved)")
        return "float16" if self.kernel == "native" else "float32"


def open_session(model_dir: Path, card: dict, spec: RingSpec, opts: RunnerOptions,
                 streams: int = 1) -> ort.InferenceSession:
    """The session of the dynamic graph for these pools and options (`streams`: a pass over that many streams' rows,
    models/streams.py), built on first use; with `kernel = "native"`, the native pass speaking its contract."""
    opts = opts.resolved(card)
    threads = min(opts.threads, len(os.sched_getaffinity(0)))      # no more than the CPUs it may use (either kernel)
    if opts.kernel == "native":
        return NativeSession(Path(model_dir), card, spec.sink, spec.ring, threads, opts.pool_dtype, opts.trees,
                             streams)
    graph = ensure_graph(Path(model_dir), card, None, spec.sink, spec.ring, opts.accuracy_level, opts.pool_dtype,
                         tree=opts.trees, streams=streams)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.spin else "0")
    so.enable_mem_pattern = False      # ORT keeps a memory pattern per input-shape set it meets, without bound
    if opts.profile:
        so.enable_profiling = True
        so.profile_file_prefix = opts.profile
    return ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])


def kv_bytes_per_slot(cfg: dict, kv_dtype: str) -> int:
    """Bytes of one pool slot: K and V of one position in every layer, in pools of `kv_dtype` (`pool_dtype`)."""
    return 2 * cfg["n_layers"] * cfg["n_kv_heads"] * cfg["head_dim"] * np.dtype(kv_dtype).itemsize


class Runner:
    def __init__(self, model_dir: str | os.PathLike, spec: RingSpec, opts: RunnerOptions = RunnerOptions(),
                 session: bool = True, shares: Runner | None = None):
        """session=False: pools and staging buffers only, for a stream whose passes another session runs
        (models/streams.py); `forward` then cannot be called. shares: a runner of the same model, pools and options
        whose session this one runs its passes on (several streams' drafts in one process: the weights loaded once),
        with pools, buffers and a binding of its own."""
        self.card = load_card(model_dir)
        opts = opts.resolved(self.card)
        self.model_dir, self.spec, self.opts = Path(model_dir), spec, opts
        cfg = self.cfg = self.card["config"]
        L, KVH, D = cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"]
        S, R, T = spec.sink, spec.ring, opts.max_rows
        if T > SOFTMAX_ROWS:
            raise ValueError(f"max_rows = {T}: a pass carries at most {SOFTMAX_ROWS} rows (models/graph.py)")
        self.vocab = cfg["vocab_size"]
        if shares is not None and (shares.model_dir, shares.spec, shares.opts) != (self.model_dir, spec, opts):
            raise ValueError("a runner shares the session of a runner of the same model, pools and options only")
        self.session = self._share(shares) if shares is not None else self._open() if session else None

        kv = np.dtype(opts.pool_dtype)
        self.sink_k = np.zeros((L, S, KVH, D), kv)       # [layer, slot, kv head, D]: a slot prefix is
        self.sink_v = np.zeros_like(self.sink_k)                  # contiguous, so a pass binds only what it reads
        self.mirror = self._mirror_slots()           # the ring's first slots again after its end: a pass's view of
        self.ring_k = np.zeros((L, R + self.mirror, KVH, D), kv)   # the ring is one slice (RingIndex.pool_view)
        self.ring_v = np.zeros_like(self.ring_k)
        self.inv_freq = rope_inv_freq(D, cfg["rope_base"])
        self._ids = np.zeros(T, np.int64)
        self._pos = np.zeros(T, np.int64)
        self._sink_pos = np.zeros(T, np.int64)
        self._tables = np.zeros((4, T, D // 2), np.float32)           # cos, sin, cos_sink, sin_sink
        self._mask = np.zeros(T * (S + R + opts.max_recent + T), np.float32)
        self._pad_mask = np.zeros(2 * (S + R + opts.max_recent + 2), np.float32)   # a 1-row pass and its padding
        self._recent = self.recent_buffer(self.cfg, opts) if session else None   # pools only: its pass's owner's
        self._rows = np.zeros(max(T, 2), np.int64)
        self._logits = np.zeros((1, max(T, 2) if session else 0, self.vocab), np.float32)
        self._targets = np.zeros(max(T, 2), np.int64)               # each logit row's next token (graph `nll`)
        self._nll = np.zeros(max(T, 2), np.float32)
        self.nll = self._nll[:0]                                  # the last forward's `nll` [M]
        # flat: each call views a contiguous [L, KVH, T, D] (none without a session: its pass's owner has them)
        self._new_kv = np.zeros((2, L * KVH * max(T, 2) * D if session else 0), kv)
        self.new_k = self.new_v = self._new_kv[:, :0]
        self._path = np.zeros(max(T, 2) ** 2, np.int64)
        self._chain_paths = np.tile(np.arange(max(T, 2), dtype=np.int64), (max(T, 2), 1))   # chain row r: 0..r, pad
        self._io = self._binding() if session else None
        self._ring_bound = (-1, -1)                   # the ring view bound to this runner's binding
        if self._io is not None:                      # none: pools only, or a runner that feeds whole pools
            self.bind_sinks(self._io, "")
        # the padding rule; the native kernel computes a lone row as it does among others (models/native.py)
        self.padded = opts.batch_invariant and opts.kernel != "native"
        self.forward_calls = 0
        self.forward_rows = 0
        self.forward_s = 0.0          # wall time inside ONNX Runtime (the pipeline's "model" share)

    def _mirror_slots(self) -> int:
        """Ring slots kept twice (`RingSpec.mirror`): a view of the ring is then one slice wherever it starts."""
        return self.spec.mirror

    def _open(self) -> ort.InferenceSession:
        return open_session(self.model_dir, self.card, self.spec, self.opts)

    def _share(self, other: Runner):
        return other.session

    def _binding(self):
        return self.session.io_binding()

    def _bind_in(self, name: str, array: np.ndarray) -> None:
        self._io.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)

    def _bind_out(self, name: str, array: np.ndarray) -> None:
        self._io.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)

    def mask_buffer(self) -> np.ndarray:
        """A flat scratch buffer large enough for any pass's mask (RingIndex.visible_mask fills a prefix of it)."""
        return self._mask

    def forward(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                logit_rows: np.ndarray | None = None, recent_slots: np.ndarray | None = None,
                path: np.ndarray | None = None, ring_from: int = 0, targets: np.ndarray | None = None) -> np.ndarray:
        """Run T rows (tokens at int64 positions) against the pools.

        mask: float32 [T, P + m + T], C-contiguous (RingIndex.visible_mask): the pass reads the S sink slots and
        the P - S ring slots from `ring_from` on (RingIndex.pool_view: the same for every pass that holds a row).
        recent_slots: the pool slots of m committed positions handed to the pass as the "recent" section (their
        K/V are copied out of the pool, in the given order, to sit just before the new rows).

        path: int64 [T, W] for a token tree (`models.graph`, tree): row r's root path, rows padded with any row;
        the mask's last W columns are then by depth (column j: the path's j-th row).

        targets: int64 [M], the token after each logit row: `self.nll` [M] is then each one's -log p (models/graph.py;
        without targets it holds the surprisal of token 0, meaningless).

        Returns logits [M, V] for `logit_rows` (default: every row); the rows' K/V are in `new_k/new_v`
        ([L, KVH, T, D]) until the next call. Nothing is written into the pools here (see `store`).
        """
        st = self.stage(tokens, positions, mask, logit_rows, recent_slots, path, ring_from, targets)
        rows, nexts = st.rows, st.targets
        if self.padded and st.M < 2:                  # a 1-row head computes its row twice
            rows, nexts = self._rows[:2], self._targets[:2]
            rows[st.M:], nexts[st.M:] = (rows[0], nexts[0]) if st.M else (0, 0)
        self._bind_in("input_ids", st.ids)
        for name, table in zip(("cos", "sin", "cos_sink", "sin_sink"), st.tables):
            self._bind_in(name, table)
        view = (st.ring_from, st.ring_width)
        self.bind_stream(self._io, st, "", ring=view != self._ring_bound)   # the ring rebound only when it moves
        self._ring_bound = view
        self._bind_in("logit_rows", rows)
        self._bind_in("targets", nexts)
        logits = self._logits[:, :len(rows)]
        self._bind_out("logits", logits)
        self._bind_out("nll", self._nll[:len(rows)])
        L, KVH, D = self.cfg["n_layers"], self.cfg["n_kv_heads"], self.cfg["head_dim"]
        new_k, new_v = (buf[: L * KVH * st.T * D].reshape(L, KVH, st.T, D) for buf in self._new_kv)
        self._bind_out("new_k", new_k.reshape(L * KVH, st.T, D))
        self._bind_out("new_v", new_v.reshape(L * KVH, st.T, D))
        t0 = time.perf_counter()
        self.session.run_with_iobinding(self._io)
        self.took(time.perf_counter() - t0, st, new_k, new_v, self._nll[:st.M])
        return logits[0, :st.M]

    def stage(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray,
              logit_rows: np.ndarray | None = None, recent_slots: np.ndarray | None = None,
              path: np.ndarray | None = None, ring_from: int = 0, targets: np.ndarray | None = None,
              recent_into: np.ndarray | None = None) -> Staged:
        """This stream's share of a pass (`forward`'s arguments), written into this runner's buffers: checked, a
        1-row pass given its padding row, rotation tables made, the recent positions' K/V gathered (into
        `recent_into`, a `recent_buffer` of the pass's owner, or this runner's own). Nothing bound."""
        T = len(tokens)
        if T > self.opts.max_rows:
            raise ValueError(f"{T} rows exceed max_rows={self.opts.max_rows}")
        if path is not None and not self.opts.trees:
            raise ValueError("a token tree needs a runner opened with RunnerOptions(trees=True) (the tree graph)")
        if mask.dtype != np.float32 or not mask.flags.c_contiguous or mask.shape[0] != T:
            raise ValueError(f"mask must be C-contiguous float32 with {T} rows, got {mask.dtype} {mask.shape}")
        T_cols = T if path is None else path.shape[1]
        if self.opts.trees and path is not None and (path.shape[0] != T or not 0 < T_cols <= T):
            raise ValueError(f"path must be [{T}, W <= {T}], got {path.shape}")
        m = 0 if recent_slots is None else len(recent_slots)
        pool_columns = mask.shape[1] - m - T_cols
        pad = self.padded and T == 1
        if pad:                   # the padding row: row 0's token and position, seeing only itself, seen by no row
            mask = self._padded(mask, chain=path is None)
            T, T_cols = 2, T_cols + (path is None)
            if path is not None:
                path = self._chain_paths[:2, :1]
        bound = None
        if self.opts.trees:
            bound = self._path[:T * T_cols].reshape(T, T_cols)
            bound[:] = self._chain_paths[:T, :T] if path is None else path
        ids, pos, sink_pos = self._ids[:T], self._pos[:T], self._sink_pos[:T]
        ids[:] = tokens                       # a padded pass: broadcast, the padding row is a copy of row 0
        pos[:] = positions
        cos, sin, cos_s, sin_s = (t[:T] for t in self._tables)
        tables = rope_tables if self.opts.rope_angles == "float64" else rope_tables_float32
        tables(pos, self.inv_freq, cos, sin)
        if self.spec.sink:
            sink_query_positions(pos, self.spec.sink, self.spec.window, out=sink_pos)
            tables(sink_pos, self.inv_freq, cos_s, sin_s)
        M = T - pad if logit_rows is None else len(logit_rows)
        rows, nexts = self._rows[:M], self._targets[:M]
        rows[:] = np.arange(M) if logit_rows is None else logit_rows
        nexts[:] = 0 if targets is None else targets
        recent_k, recent_v = self._recent_kv(recent_slots, self._recent if recent_into is None else recent_into)
        self._check_pool(pool_columns, ring_from)
        return Staged(T, M, pad, ids, (cos, sin, cos_s, sin_s), mask, rows, nexts, recent_k, recent_v, bound,
                      ring_from, pool_columns - self.spec.sink)

    def bind_sinks(self, io, tag: str) -> None:
        """Bind the sink pools to `io` under the graph's names + `tag` (they never move: once per binding and
        slot, unless another stream's pools were bound there: models/streams.py)."""
        for l in range(self.cfg["n_layers"] if self.spec.sink else 0):
            for name, pool in ((f"sink_k.{l}{tag}", self.sink_k), (f"sink_v.{l}{tag}", self.sink_v)):
                io.bind_input(name, "cpu", 0, pool.dtype, pool[l].shape, pool[l].ctypes.data)

    def bind_stream(self, io, st: Staged, tag: str, ring: bool) -> None:
        """Bind this stream's mask, recent section, path and (`ring`: its view moved, or another stream's pools were
        bound there) ring view to `io` (the binding `bind_sinks` was given) under the graph's names + `tag`."""
        io.bind_input(f"mask{tag}", "cpu", 0, st.mask.dtype, st.mask.shape, st.mask.ctypes.data)
        for name, a in ((f"recent_k{tag}", st.recent_k), (f"recent_v{tag}", st.recent_v)) + \
                (((f"path{tag}", st.path),) if st.path is not None else ()):
            io.bind_input(name, "cpu", 0, a.dtype, a.shape, a.ctypes.data)
        if ring:
            for l in range(self.cfg["n_layers"]):
                for name, pool in ((f"ring_k.{l}{tag}", self.ring_k), (f"ring_v.{l}{tag}", self.ring_v)):
                    a = pool[l, st.ring_from:st.ring_from + st.ring_width]
                    io.bind_input(name, "cpu", 0, a.dtype, a.shape, a.ctypes.data)

    def took(self, seconds: float, st: Staged, new_k: np.ndarray, new_v: np.ndarray, nll: np.ndarray) -> None:
        """After a pass: this stream's rows' K/V ([L, KVH, T, D] views, padding row included) and `nll`, kept until
        the next pass for `store`; the call counters."""
        self.new_k, self.new_v, self.nll = new_k[:, :, :st.T - st.pad], new_v[:, :, :st.T - st.pad], nll
        self.forward_s += seconds
        self.forward_calls += 1
        self.forward_rows += st.T - st.pad

    def reserve(self) -> None:
        """Run the largest pass this runner takes once (max_rows rows, max_recent recent positions, every pool slot,
        every row's logits; the pools are read, not written), so ONNX Runtime's arena is at its high-water mark
        before the first real pass and a long run's resident memory is flat from its start (docs/stream-quality.md,
        "A million tokens under serve"). The call counters are left as they were."""
        S, R, T, m = self.spec.sink, self.spec.ring, self.opts.max_rows, self.opts.max_recent
        width = S + R + m + T
        mask = self._mask[:T * width].reshape(T, width)
        mask.fill(0.0)
        counters = self.forward_calls, self.forward_rows, self.forward_s
        self.forward(self._ids[:T], np.arange(T), mask, recent_slots=np.minimum(np.arange(m), S + R - 1) if m else None)
        self.forward_calls, self.forward_rows, self.forward_s = counters

    def _padded(self, mask: np.ndarray, chain: bool) -> np.ndarray:
        """A 1-row mask [1, P + m + W] as the mask of the row and its padding row (`forward`). A chain gains the
        padding row's column, masked for row 0 as a later row of a block is; a tree's columns are by depth, and the
        padding row's one-node path is itself. The padding row sees only its own column, the last."""
        width = mask.shape[1] + chain
        out = self._pad_mask[:2 * width].reshape(2, width)
        out.fill(NEG)
        out[0, :mask.shape[1]] = mask[0]
        out[1, -1] = 0.0
        return out

    def _check_pool(self, columns: int, first: int = 0) -> None:
        """A pass may read `columns - S` ring slots from `first` on."""
        width = columns - self.spec.sink
        if not 0 < width <= self.spec.ring or not 0 <= first < self.spec.ring or \
                first + width > self.spec.ring + self.mirror:
            raise ValueError(f"the mask gives {columns} pool columns from ring slot {first}; this pool has "
                             f"{self.spec.sink} sink slots and {self.spec.ring} ring slots ({self.mirror} mirrored)")

    @staticmethod
    def recent_buffer(cfg: dict, opts: RunnerOptions) -> np.ndarray:
        """Room for a pass's recent section: K and V of max_recent positions in every layer (a stream's pass has
        one; models/streams.py holds one per slot of its widest graph, its streams' runners none)."""
        return np.zeros((2, cfg["n_layers"] * cfg["n_kv_heads"] * opts.max_recent * cfg["head_dim"]),
                        np.dtype(opts.pool_dtype))

    def _recent_kv(self, slots, into: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The recent section's K and V [L * KVH, m, D], gathered from the pool slots `slots` into `into`."""
        L, KVH, D = self.cfg["n_layers"], self.cfg["n_kv_heads"], self.cfg["head_dim"]
        m = 0 if slots is None else len(slots)
        if m > self.opts.max_recent:
            raise ValueError(f"{m} recent positions exceed max_recent={self.opts.max_recent}")
        k, v = (buf[: L * KVH * m * D].reshape(L, KVH, m, D) for buf in into)
        if m:
            self._gather_recent(np.asarray(slots), k, v)
        return k.reshape(L * KVH, m, D), v.reshape(L * KVH, m, D)

    def _gather_recent(self, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """The K/V of pool `slots` (positions in order: the sink slots, if any, first) into k and v [L, KVH, m, D],
        a run of consecutive slots at a time (recent positions are consecutive: a run, or a few where the sinks end
        and the ring wraps), straight from the pool's [L, slot, KVH, D] layout; no temporary."""
        S, m = self.spec.sink, len(slots)
        cuts = (np.flatnonzero((np.diff(slots) != 1) | (slots[1:] == S)) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, m]):
            first = int(slots[a])
            for out, sink_pool, ring_pool in ((k, self.sink_k, self.ring_k), (v, self.sink_v, self.ring_v)):
                run = sink_pool[:, first:first + b - a] if first < S else ring_pool[:, first - S:first - S + b - a]
                np.copyto(out[:, :, a:b], run.transpose(0, 2, 1, 3))

    def store(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Copy the K/V of new rows `rows` (from the last forward) into pool `slots` (sink slots first, then ring)."""
        S = self.spec.sink
        rows, slots = np.asarray(rows), np.asarray(slots)
        sink = slots < S
        if sink.any():
            self.sink_k[:, slots[sink]] = self.new_k[:, :, rows[sink]].transpose(0, 2, 1, 3)
            self.sink_v[:, slots[sink]] = self.new_v[:, :, rows[sink]].transpose(0, 2, 1, 3)
        ring = ~sink
        if ring.any():
            j = slots[ring] - S
            self.ring_k[:, j] = self.new_k[:, :, rows[ring]].transpose(0, 2, 1, 3)
            self.ring_v[:, j] = self.new_v[:, :, rows[ring]].transpose(0, 2, 1, 3)
            twice = j < self.mirror                  # and in the mirror, for views that run past the ring's end
            if twice.any():
                self.ring_k[:, j[twice] + self.spec.ring] = self.ring_k[:, j[twice]]
                self.ring_v[:, j[twice] + self.spec.ring] = self.ring_v[:, j[twice]]

    @property
    def pool_bytes(self) -> int:
        return self.sink_k.nbytes * 2 + self.ring_k.nbytes * 2

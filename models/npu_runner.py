"""A model run through fixed-shape graphs, as an NPU runs it: the `Runner` interface over the portable graph.

Owns the bucketing of a pass onto fixed shapes (rows padded up to the next of `buckets(max_rows)`, each padding row
seeing only itself; the whole ring bound, the slots the caller's mask leaves out masked; the recent section padded to
STATIC_RECENT, masked), the pools (host arrays, handed to the graph whole at every pass, as an NPU takes them), and
the backend that runs a bucket's graph:

  "rknn"  the board's NPU through rknn-toolkit-lite2 (`.rknn` files from `python run.py export-rknn`), or, where that
          package is absent (x86), rknn-toolkit2's simulator, which builds the same graph from its portable ONNX
  "ort"   ONNX Runtime on the portable ONNX: what the NPU graph computes, in float32 on the CPU (tests, agreement)

and the NPU's number format (`NPU_DTYPES`): "float16", one model per bucket; or "int8", one model for every pass (the
largest bucket, smaller passes padded to it: one copy of the weights), its linears' weights and inputs in int8 (the
toolkit's w8a8, calibrated on recorded passes) and every other operation in float16 (attention's mask, softmax and
norms do not survive int8: measured, docs/gateway.md).

Only one process may hold the NPU (models/npu.py): the rknn backend takes the host's NPU lock before it opens it.
Never decides what is committed or visible: as `Runner`, the caller passes the mask and says which rows to store.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from kernels.ring import NEG, RingSpec
from kernels.rope import rope_tables, sink_query_positions
from models.graph import STATIC_RECENT, build_graph
from models.npu import NpuLock
from models.runner import Runner, RunnerOptions

BUCKETS = (1, 4, 16, 64)      # row counts a pass is padded up to (capped at max_rows, which is always one)
FP16_NEG = np.float32(-3.0e4)   # the mask's "never" on an NPU computing in float16 (NEG, -1e30, is -inf there)


NPU_DTYPES = ("float16", "int8")


def buckets(max_rows: int, dtype: str = "float16") -> tuple[int, ...]:
    """The row counts a pass is padded up to: int8's one model serves every pass (each bucket would be another copy
    of the weights, and its calibration another build)."""
    if dtype == "int8":
        return (max_rows,)
    return tuple(sorted({b for b in BUCKETS if b < max_rows} | {max_rows}))


def portable_path(model_dir: Path, T: int, sink: int, ring: int) -> Path:
    return Path(model_dir) / "portable" / f"T{T}_S{sink}_R{ring}.onnx"


def rknn_path(model_dir: Path, T: int, sink: int, ring: int, dtype: str = "float16") -> Path:
    return Path(model_dir) / "rknn" / f"T{T}_S{sink}_R{ring}{'' if dtype == 'float16' else '_' + dtype}.rknn"


def calibration_path(model_dir: Path, T: int, sink: int, ring: int) -> Path:
    """The int8 model's calibration set: a list of recorded passes' inputs (`export-rknn` writes it)."""
    return Path(model_dir) / "rknn" / f"calibration_T{T}_S{sink}_R{ring}" / "dataset.txt"


def ensure_portable(model_dir: Path, card: dict, T: int, sink: int, ring: int) -> Path:
    """The portable graph of one bucket, built beside the model on first use."""
    path = portable_path(model_dir, T, sink, ring)
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        part = path.with_suffix(f".part{time.monotonic_ns()}")
        # The weights beside the graph: a 0.5B's float32 weights pass protobuf's 2 GB, one file's limit.
        onnx.save(build_graph(card, T, sink, ring, portable_from=Path(model_dir)), part, save_as_external_data=True,
                  all_tensors_to_one_file=True, location=path.with_suffix(".weights").name)
        part.replace(path)
    return path


class StaticRunner(Runner):
    def __init__(self, model_dir, spec: RingSpec, opts: RunnerOptions = RunnerOptions(), backend: str = "ort",
                 shares: StaticRunner | None = None, dtype: str = "float16"):
        """shares: a runner of the same graphs whose buckets this one runs on (several streams' drafts in one
        process: the NPU opened once, by the first, which holds the lock), with pools of its own. dtype: the NPU's
        number format (NPU_DTYPES), which also sets the buckets; ONNX Runtime runs the same buckets in float32."""
        if backend not in ("ort", "rknn"):
            raise ValueError(f"backend {backend!r}: expected ort or rknn")
        if dtype not in NPU_DTYPES:
            raise ValueError(f"NPU dtype {dtype!r}: expected one of {', '.join(NPU_DTYPES)}")
        self.dtype = dtype
        if shares is not None and shares.backend != backend:
            raise ValueError(f"a {backend} runner cannot share a {shares.backend} runner's graphs")
        self.backend = backend
        self.neg = NEG if backend == "ort" else FP16_NEG
        self.npu_lock = NpuLock() if backend == "rknn" and shares is None else None
        if self.npu_lock:
            self.npu_lock.acquire(f"draft model {Path(model_dir).name}")
        try:
            # the graphs take the pools as float32 host arrays, whatever the CPU pass's own type would be; its passes
            # are graphs (ONNX Runtime's or the NPU's), never the native pass
            super().__init__(model_dir, spec, dataclasses.replace(opts, kv_dtype="float32", kernel="nbits"),
                             shares=shares)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let the NPU go (the process's exit does too)."""
        if self.npu_lock:
            self.npu_lock.release()

    def _open(self):
        """One graph per bucket; `session` maps a bucket to a callable(feeds list) -> [logits, new_k, new_v]."""
        L, KVH, D = (self.card["config"][k] for k in ("n_layers", "n_kv_heads", "head_dim"))
        S, R = self.spec.sink, self.spec.ring
        self._names: list[str] = []
        self._feeds: dict[int, dict[str, np.ndarray]] = {}
        opener = _ort_bucket if self.backend == "ort" else _rknn_bucket(self)
        sessions = {}
        for T in buckets(self.opts.max_rows, self.dtype):
            path = ensure_portable(self.model_dir, self.card, T, S, R)
            run, names = opener(path, T, S, R)
            self._names = names
            sessions[T] = run
            f = {"input_ids": np.zeros(T, np.int64),
                 "mask": np.full((T, S + R + STATIC_RECENT + T), self.neg, np.float32),
                 "logit_rows": np.zeros(T, np.int64),
                 "recent_k": np.zeros((L * KVH, STATIC_RECENT, D), np.float32),
                 "recent_v": np.zeros((L * KVH, STATIC_RECENT, D), np.float32)}
            f.update({n: np.zeros((T, D // 2), np.float32) for n in ("cos", "sin", "cos_sink", "sin_sink")})
            f.update(pos=np.zeros(T, np.int64), sink_pos=np.zeros(T, np.int64))    # host only, not graph inputs
            self._feeds[T] = f
        return sessions

    def _share(self, other: StaticRunner):
        self._names, self._feeds = other._names, other._feeds     # the feeds are scratch, filled at every pass
        return other.session

    def _mirror_slots(self) -> int:             # the pools go whole: a view's columns are placed in the wide mask
        return 0

    def _binding(self):                        # the pools go to each pass whole (see forward): nothing to bind
        return None

    def _bind_in(self, name, array):
        pass

    def forward(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                logit_rows: np.ndarray | None = None, recent_slots: np.ndarray | None = None,
                path: np.ndarray | None = None, ring_from: int = 0) -> np.ndarray:
        """As `Runner.forward`, on the smallest bucket that holds the rows (a chain's pass; no tree)."""
        T = len(tokens)
        if path is not None:
            raise ValueError("a fixed-shape runner runs chains: a token tree needs the ONNX Runtime runner")
        if T > self.opts.max_rows:
            raise ValueError(f"{T} rows exceed max_rows={self.opts.max_rows}")
        m = 0 if recent_slots is None else len(recent_slots)
        if m > STATIC_RECENT:
            raise ValueError(f"{m} recent positions exceed the fixed graph's {STATIC_RECENT}")
        S, R = self.spec.sink, self.spec.ring
        Tb = next(b for b in self.session if b >= T)
        f = self._feeds[Tb]
        P = mask.shape[1] - m - T          # pool columns the caller's mask covers: S + ring slots from ring_from on
        if not S < P <= S + R or not 0 <= ring_from < R:
            raise ValueError(f"the mask gives {P} pool columns from ring slot {ring_from}; this pool has {S} sink "
                             f"and {R} ring slots")
        wide, new = f["mask"], S + R + STATIC_RECENT
        wide.fill(self.neg)
        np.maximum(mask[:, :S], self.neg, out=wide[:T, :S])
        cut = min(P - S, R - ring_from)             # the view's slots up to the ring's end, then from its start
        np.maximum(mask[:, S:S + cut], self.neg, out=wide[:T, S + ring_from:S + ring_from + cut])
        np.maximum(mask[:, S + cut:P], self.neg, out=wide[:T, S:S + P - S - cut])
        np.maximum(mask[:, P:P + m], self.neg, out=wide[:T, S + R:S + R + m])
        np.maximum(mask[:, P + m:], self.neg, out=wide[:T, new:new + T])
        pad = np.arange(T, Tb)
        wide[pad, new + pad] = 0.0                   # a padding row sees only itself; no row sees it
        f["input_ids"][:T], f["input_ids"][T:] = tokens, tokens[0]
        pos = f["pos"]
        pos[:T], pos[T:] = positions, positions[0]
        rope_tables(pos, self.inv_freq, f["cos"], f["sin"])
        if S:
            sink_query_positions(pos, S, self.spec.window, out=f["sink_pos"])
            rope_tables(f["sink_pos"], self.inv_freq, f["cos_sink"], f["sin_sink"])
        M = T if logit_rows is None else len(logit_rows)
        rows = f["logit_rows"]
        rows[:M] = np.arange(M) if logit_rows is None else logit_rows
        rows[M:] = rows[0]
        if m:                                       # the padded columns beyond m are masked
            L, KVH, D = self.cfg["n_layers"], self.cfg["n_kv_heads"], self.cfg["head_dim"]
            k, v = (f[n].reshape(L, KVH, STATIC_RECENT, D)[:, :, :m] for n in ("recent_k", "recent_v"))
            self._gather_recent(np.asarray(recent_slots), k, v)
        pools = {}
        for l in range(self.cfg["n_layers"]):
            if S:
                pools[f"sink_k.{l}"], pools[f"sink_v.{l}"] = self.sink_k[l], self.sink_v[l]
            pools[f"ring_k.{l}"], pools[f"ring_v.{l}"] = self.ring_k[l], self.ring_v[l]
        feeds = [f[n] if n in f else pools[n] for n in self._names]
        t0 = time.perf_counter()
        logits, new_k, new_v = self.session[Tb](feeds)
        self.forward_s += time.perf_counter() - t0
        self.forward_calls += 1
        self.forward_rows += T
        L, KVH, D = self.cfg["n_layers"], self.cfg["n_kv_heads"], self.cfg["head_dim"]
        self.new_k = np.asarray(new_k, np.float32).reshape(L, KVH, Tb, D)[:, :, :T]
        self.new_v = np.asarray(new_v, np.float32).reshape(L, KVH, Tb, D)[:, :, :T]
        return np.asarray(logits, np.float32).reshape(Tb, -1)[:M]



def _ort_bucket(path: Path, T: int, S: int, R: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return (lambda feeds: session.run(["logits", "new_k", "new_v"], dict(zip(names, feeds)))), names


def _rknn_bucket(runner: StaticRunner):
    """The NPU's opener: the board's runtime where rknn-toolkit-lite2 is installed, else the toolkit's simulator
    (the runner holds the host's NPU lock by now)."""
    def open_bucket(path: Path, T: int, S: int, R: int):
        names = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]
        rknn = _on_board(rknn_path(runner.model_dir, T, S, R, runner.dtype)) or \
            _on_simulator(path, runner.dtype, calibration_path(runner.model_dir, T, S, R))
        return (lambda feeds: rknn.inference(inputs=feeds, data_format="nchw")), names   # no input is 4-D
    return open_bucket


def _on_board(source: Path):
    """rknn-toolkit-lite2's runtime on the board's NPU, running `source` (.rknn); None where it is not installed."""
    try:
        from rknnlite.api import RKNNLite
    except ImportError:
        return None
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing: build it with `python run.py export-rknn` (x86)")
    rknn = RKNNLite(verbose=False)
    _check(rknn.load_rknn(str(source)), f"load {source}")
    status = rknn.init_runtime(core_mask=RKNNLite.NPU_CORE_0)
    if status != 0:
        raise RuntimeError(f"rknn: the NPU runtime did not start (status {status}): the rknn backend needs an RK3588 "
                           f"with Rockchip's NPU driver (rknpu) and its runtime library librknnrt.so; on any other "
                           f"machine set [draft] backend = \"onnx\" (--draft-backend onnx)")
    return rknn


# The toolkit's builds this process holds, by (portable graph, dtype, calibration set): the simulator runs only what
# its own process built, not a .rknn file, so `export-rknn`'s export, agreement and acceptance runners share one build
# a bucket (each built its own before: three builds, hours for the 0.5B). Value: [the toolkit, its simulator started].
_BUILT: dict[tuple[str, str, str], list] = {}
_builds = 0                                        # the toolkit's builds in this process (export-rknn reports it)


def toolkit_builds() -> int:
    return _builds


def _build_key(path: Path, dtype: str, dataset: Path | None) -> tuple[str, str, str]:
    calibrated = dtype == "int8" and dataset                 # float16 builds read no calibration set
    return str(Path(path).resolve()), dtype, str(Path(dataset).resolve()) if calibrated else ""


def _on_simulator(path: Path, dtype: str = "float16", dataset: Path | None = None):
    """rknn-toolkit2's simulator (x86) running the portable ONNX as `export_rknn` built it in this process, or as it
    builds it (the simulator runs what it built, not a .rknn file); started once a build."""
    key = _build_key(path, dtype, dataset)
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = [_toolkit(path, dtype, dataset), False]
    if not built[1]:
        _check(built[0].init_runtime(), "start the simulator")
        built[1] = True
    return built[0]


def export_rknn(path: Path, out: Path, dtype: str = "float16", dataset: Path | None = None) -> None:
    """The portable ONNX at `path` converted for the RK3588's NPU in `dtype` and written to `out` (.rknn); the build
    is kept for this process's simulator (`_on_simulator`): always a new one, as the graph or calibration set may have
    changed on disk since an earlier build."""
    key = _build_key(path, dtype, dataset)
    old = _BUILT.pop(key, None)
    if old is not None:
        old[0].release()
    rknn = _toolkit(path, dtype, dataset)
    _check(rknn.export_rknn(str(out)), f"export {out}")
    _BUILT[key] = [rknn, False]


def _toolkit(path: Path, dtype: str = "float16", dataset: Path | None = None):
    """rknn-toolkit2 (x86) with the portable ONNX at `path` built for the RK3588: in float16 (no quantization), or
    int8 with float16 around it (`dataset`: the calibration set, `calibration_path`).

    int8: the toolkit's RK3588 offers w8a8 only (w8a16 and w4a16 are refused for this platform), and a model all in
    w8a8 puts attention's mask (-3e4) and scores on one int8 scale, which wipes the scores out. So the toolkit's
    hybrid quantization: its first step calibrates every tensor, then every tensor but the linears' (its `Conv`
    nodes: the weights) is listed in `custom_quantize_layers` as float16, and its second step builds that."""
    try:
        from rknn.api import RKNN
    except ImportError:
        raise RuntimeError("the rknn backend needs rknn-toolkit-lite2 (on the board) or rknn-toolkit2 (x86: its "
                           "simulator and converter; bench/build-rknn-env.sh builds its venv)") from None
    global _builds
    _builds += 1
    rknn = RKNN(verbose=False)
    rknn.config(target_platform="rk3588")
    _check(rknn.load_onnx(str(path)), f"load {path}")
    if dtype == "float16":
        _check(rknn.build(do_quantization=False), f"build {path} (float16)")
        return rknn
    if dataset is None or not Path(dataset).exists():
        raise FileNotFoundError(f"the int8 NPU model needs its calibration set {dataset}: `python run.py "
                                f"export-rknn` (x86) records it")
    with tempfile.TemporaryDirectory(prefix="ringspec-rknn-") as work:
        here = os.getcwd()
        os.chdir(work)                           # the hybrid steps write their files in the working directory
        try:
            _check(rknn.hybrid_quantization_step1(dataset=str(dataset), proposal=False), f"calibrate {path} (int8)")
            stem = Path(path).stem
            model = onnx.ModelProto()
            model.ParseFromString(Path(f"{stem}.model").read_bytes())     # the toolkit's graph: ONNX's protobuf
            cfg = Path(f"{stem}.quantization.cfg")
            text = cfg.read_text()
            calibrated = {t.strip("'\"") for t in re.findall(r"^    (\S+):$", text, re.M)}  # quantize_parameters'

            keep = [t for n in model.graph.node if n.op_type != "Conv" for t in n.output if t in calibrated]
            cfg.write_text(text.replace("custom_quantize_layers: {}", "custom_quantize_layers:\n" + "".join(
                f"    {json.dumps(t)}: float16\n" for t in keep), 1))
            rknn.release()
            rknn = RKNN(verbose=False)
            _check(rknn.hybrid_quantization_step2(model_input=f"{stem}.model", data_input=f"{stem}.data",
                                                  model_quantization_cfg=str(cfg)), f"build {path} (int8)")
        finally:
            os.chdir(here)
    return rknn


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"rknn: could not {what} (status {status})")

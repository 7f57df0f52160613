"""Y = X W^T with W in GGUF blocks exactly as stored: ringspec's own quantized matmul (kernels/native/).

Owns the Python face of the native kernel: which GGUF types it reads, the checks that give a readable error before
any byte is touched, and the per-call scratch. Never chooses a path by the number of rows: the path is the CPU's best
(`paths()`, chosen once) unless a caller names one (tests, `doctor`), and every path's bits equal the scalar
reference's (kernels/native/qmm.h states the order of operations; tests/kernels/test_qmatmul.py holds them to it).

X is quantized per row to int8 in blocks of 32 (the 32-weight types) or 256 (the K-quants), as llama.cpp's Q8_0/Q8_1
and Q8_K (the 32-blocks' scale rounded to float16 as theirs): |x - d*q| <= amax/254 per value, amax the block's largest
|x| (and 2^-11 relative for a 32-block's rounded scale). Measured on the default model against llama.cpp's logits
(tests/models/test_native.py): mean NLL -0.08% from llama.cpp's (MatMulNBits: +0.12%).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:
    from . import _qmm
except ImportError as e:                 # not built: no compiler at install time (setup.py says so then)
    _qmm, MISSING = None, f"the native kernel is not built ({e}): install a C compiler and rerun `pip install -e .`"
else:
    MISSING = ""

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")      # qmm.h's enum order
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCK_WEIGHTS = {t: 256 if t.endswith("_K") else 32 for t in TYPES}
ACT_BLOCK = BLOCK_WEIGHTS                # the activation block of a type's family
# Where a block keeps its float16 scales (byte offsets): d, and the second one (Q4_1/Q5_1's m, the K-quants' dmin).
SCALE_AT = {"Q4_0": (0,), "Q8_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2),
            "Q5_K": (0, 2), "Q6_K": (208,)}


def available() -> bool:
    return _qmm is not None


def paths() -> list[str]:
    """The paths this CPU runs, best first ("scalar" last: the reference)."""
    if _qmm is None:
        raise RuntimeError(MISSING)
    return [name for name, _ in _qmm.paths()]


_PATH_IDS = {"scalar": 0, "avx2": 1, "avx512": 2, "avx512_vnni": 3, "neon_dotprod": 4}


class Scratch:
    """The quantized activations' buffer, grown to the largest call and reused (no allocation per token)."""

    def __init__(self):
        self.buf = np.zeros(0, np.uint8)

    def get(self, M: int, K: int) -> np.ndarray:
        need = _qmm.scratch_bytes(M, K)
        if self.buf.nbytes < need:
            self.buf = np.zeros(need, np.uint8)
        return self.buf


def matmul(w: np.ndarray, qtype: str, x: np.ndarray, out: np.ndarray, threads: int = 1, path: str = "",
           scratch: Scratch | None = None, col: int = 0) -> str:
    """out[m, col + n] = sum_k x[m, k] w[n, k]; w: uint8 [N, K/block * block bytes] (a GGUF tensor's rows as stored),
    x: float32 [M, K] C-contiguous, out: float32 [M, >= col + N] C-contiguous (other columns untouched). threads
    split the output columns only. path: "" for the best this CPU runs. Returns the path that ran."""
    return matmul_parts([(w, qtype, col)], x, out, threads, path, scratch)


def matmul_parts(parts: list[tuple[np.ndarray, str, int]], x: np.ndarray, out: np.ndarray, threads: int = 1,
                 path: str = "", scratch: Scratch | None = None) -> str:
    """`matmul` of up to four weights (w, qtype, col) over one input, in one call: x quantized once a family, the
    weights' columns shared out to the threads together (a fused projection's parts, side by side in `out`)."""
    if x.ndim != 2:
        raise ValueError(f"x must be a float32 matrix, got {x.dtype}{list(x.shape)}")
    return run(weights(parts, x.shape[1]), x, out, threads, path, scratch)


@dataclass(frozen=True)
class Weights:
    """Up to four GGUF tensors read over one input of K columns, checked once (`weights`): a pass's linear."""
    K: int
    N: int                      # out's columns they write: the last part's col + rows
    operands: tuple             # ((type index, w, rows, col), ...): the C side's form


def weights(parts: list[tuple[np.ndarray, str, int]], K: int) -> Weights:
    """(w, qtype, col) parts checked against an input of K columns, for `run`."""
    if _qmm is None:
        raise RuntimeError(MISSING)
    if not 1 <= len(parts) <= 4:
        raise ValueError(f"one to four weights a call, got {len(parts)}")
    operands = []
    for w, qtype, col in parts:
        if qtype not in BLOCK_BYTES:
            raise ValueError(f"{qtype} is not a type the native kernel reads ({', '.join(TYPES)})")
        if K % BLOCK_WEIGHTS[qtype]:
            raise ValueError(f"K = {K} is not a whole number of {qtype} blocks ({BLOCK_WEIGHTS[qtype]} weights)")
        row = K // BLOCK_WEIGHTS[qtype] * BLOCK_BYTES[qtype]
        if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != row:
            raise ValueError(f"w must be uint8 [N, {row}] ({qtype} rows of K = {K}), got {w.dtype}{list(w.shape)}")
        if col < 0:
            raise ValueError(f"col must be >= 0, got {col}")
        operands.append((TYPES.index(qtype), w, w.shape[0], col))
    return Weights(K, max(col + n for _, _, n, col in operands), tuple(operands))


def run(w: Weights, x: np.ndarray, out: np.ndarray, threads: int = 1, path: str = "",
        scratch: Scratch | None = None) -> str:
    """`matmul_parts` of weights checked once: out[m, col + n] for each part; x float32 [M, K] and out float32
    [M, >= N], both C-contiguous (checked at every call: cheap beside the weights')."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.ndim != 2 or out.ndim != 2:
        raise ValueError(f"x and out must be float32 matrices, got {x.dtype}{list(x.shape)}, {out.dtype}{list(out.shape)}")
    M, K = x.shape
    if not x.flags.c_contiguous or not out.flags.c_contiguous or out.shape[0] != M:
        raise ValueError(f"x and out must be C-contiguous with {M} rows")
    if K != w.K:
        raise ValueError(f"x must be [M, {w.K}], got {list(x.shape)}")
    if out.shape[1] < w.N:
        raise ValueError(f"out must hold [{M}, {w.N}] float32, got {list(out.shape)}")
    if path and path not in _PATH_IDS:
        raise ValueError(f"no path {path!r}: {', '.join(_PATH_IDS)}")
    scratch = scratch or Scratch()
    return _qmm.matmul(w.operands, x, M, K, out, out.shape[1], threads, _PATH_IDS[path] if path else -1,
                       scratch.get(M, K))


def rmsnorm(x: np.ndarray, gamma: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """out = x / sqrt(mean(x^2) + eps) * gamma per row of x [T, d] (ggml's order: the sum in double)."""
    _qmm.rmsnorm(x, gamma, eps, x.shape[0], x.shape[1], out)
    return out


def swiglu(gate_up: np.ndarray, out: np.ndarray, path: str = "") -> np.ndarray:
    """gate_up [T, 2F] (gate | up) -> out [T, F] = gate / (1 + exp(-gate)) * up, exp by one formula on every path
    (kernels/native/qmm_ops.c `qmm_expf`: within 2 ulp of exp; `expf`). path: "" for the CPU's best."""
    if path and path not in _PATH_IDS:
        raise ValueError(f"no path {path!r}: {', '.join(_PATH_IDS)}")
    _qmm.swiglu(gate_up, gate_up.shape[0], gate_up.shape[1] // 2, out, _PATH_IDS[path] if path else -1)
    return out


def expf(x: np.ndarray) -> np.ndarray:
    """SwiGLU's exp of float32 x (C-contiguous), as the reference computes it (tests hold it to exp)."""
    out = np.empty_like(x)
    _qmm.expf(x, out, x.size)
    return out


def rows(w: np.ndarray, qtype: str, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
    """A table's rows ids (int64 [T]) dequantized as llama.cpp does -> out float32 [T, K]."""
    _qmm.rows(TYPES.index(qtype), w, w.shape[0], out.shape[1], ids, len(ids), out)
    return out


def nll(logits: np.ndarray, targets: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[m] = -log softmax(logits[m])[targets[m]] (logits [M, V] C-contiguous)."""
    _qmm.nll(logits, logits.shape[0], logits.shape[1], logits.shape[1], targets, out)
    return out

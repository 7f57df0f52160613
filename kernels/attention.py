"""One stream's attention in one layer, on the native kernel: new rows against [sinks | ring | recent | new rows].

Owns the Python face of kernels/native/attn.h: the shapes checked with readable errors before any byte is touched,
the scratch, and a float64 reference (`reference`) the tests hold the native bits to. Never decides what a row sees
(the mask and the path are the runner's: models/runner.py) and never picks a path by the number of rows: the path is
the CPU's best unless a caller names one, and every path's bits equal the reference path's ("scalar").

A row's output depends only on its own query and the columns its mask shows it (attn.h's order of operations), so a
row gets the same bits alone or beside other rows, at any thread count: the native pass needs no padding row for
attention (models/runner.py's padding rule is for ONNX Runtime's kernels).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels import qmatmul
from kernels.ring import NEG


@dataclass(frozen=True)
class Heads:
    H: int                      # query heads
    KVH: int                    # key/value heads (H % KVH == 0: G = H / KVH query heads share one)
    D: int                      # head size, a multiple of 8
    interleaved: bool           # rotation pairs (2i, 2i+1), else (i, i + D/2)

    def __post_init__(self):
        if self.H % self.KVH or self.D % 8:
            raise ValueError(f"{self.H} heads over {self.KVH} kv heads of size {self.D}: the native attention needs "
                             "whole groups and a head size that is a multiple of 8")


class Scratch:
    """The rotated queries, scores and converted rows of a call, grown to the largest and reused."""

    def __init__(self):
        self.buf = np.zeros(0, np.float32)

    def get(self, R: int, H: int, D: int, N: int) -> np.ndarray:
        need = qmatmul._qmm.attention_scratch(R, H, D, N)
        if self.buf.size < need:
            self.buf = np.zeros(need, np.float32)
        return self.buf


def attention(heads: Heads, qkv: np.ndarray, tables: tuple, mask: np.ndarray, recent: tuple, sinks: tuple,
              ring: tuple, new_k: np.ndarray, new_v: np.ndarray, o: np.ndarray, rows: int | None = None,
              first: int = 0, path: np.ndarray | None = None, threads: int = 1, scratch: Scratch | None = None,
              kernel_path: str = "", checked: bool = False) -> str:
    """o[r] = the attention of row r < rows (default: every row) of qkv [T, >= (H + 2 KVH) D] (Q | K | V, bias added),
    rotated by tables (cos, sin, cos_sink, sin_sink: float32 [T, D/2] each), against the columns of mask [rows, N]:
    sinks (k, v) [S, KVH, D], ring (k, v) [C, KVH, D], recent (k, v) [KVH, P, D], then the pass's new rows in order
    (a chain: N = S + C + P + T) or row r's path[r] (a tree, path int64 [T, W]: N = S + C + P + W). Writes every row's
    rotated K and V into new_k, new_v [KVH, >= first + T, D] at rows first.. (the pools' type, float32 or float16;
    C-contiguous, as every array here). Returns the path that ran. checked: this pass already checked a call of the
    same shapes and types (a pass's layers share them: models/native.py checks its first layer's); the C side still
    refuses a buffer shorter than its shapes need."""
    H, KVH, D = heads.H, heads.KVH, heads.D
    T = qkv.shape[0]
    R = T if rows is None else rows
    S, C, P = sinks[0].shape[0], ring[0].shape[0], recent[0].shape[1]
    W = 0 if path is None else path.shape[1]
    if not checked:
        _check(heads, qkv, mask, recent, sinks, ring, new_k, new_v, o, R, first, path, kernel_path)
    scratch = scratch or Scratch()
    # a C-contiguous array's buffer is refused otherwise by the C side (y*/w*), with the name of the argument
    return qmatmul._qmm.attention(
        qkv, qkv.shape[1], (T, R, H, KVH, D, S, C, P, W, int(heads.interleaved), int(new_k.dtype == np.float16)),
        1.0 / np.sqrt(D), tuple(t[:T] for t in tables), mask, path, (*recent, *sinks, *ring),
        new_k.reshape(-1)[first * D:], new_v.reshape(-1)[first * D:], new_k.shape[1], o, o.shape[1],
        scratch.get(R, H, D, S + C + P + (W or T)), threads, qmatmul._PATH_IDS[kernel_path] if kernel_path else -1)


def _check(heads: Heads, qkv, mask, recent, sinks, ring, new_k, new_v, o, R: int, first: int, path,
           kernel_path: str) -> None:
    """`attention`'s arguments, with a readable error for the first that does not fit."""
    if not qmatmul.available():
        raise RuntimeError(qmatmul.MISSING)
    H, KVH, D = heads.H, heads.KVH, heads.D
    T = qkv.shape[0]
    kv = new_k.dtype
    if kv not in (np.float16, np.float32):
        raise ValueError(f"the pools must be float16 or float32, not {kv}")
    arrays = {"recent_k": recent[0], "recent_v": recent[1], "sink_k": sinks[0], "sink_v": sinks[1],
              "ring_k": ring[0], "ring_v": ring[1], "new_v": new_v}
    for name, a in arrays.items():
        if a.dtype != kv:
            raise ValueError(f"{name} is {a.dtype}, new_k {kv}: one pool type a call")
    S, C, P = sinks[0].shape[0], ring[0].shape[0], recent[0].shape[1]
    W = 0 if path is None else path.shape[1]
    N = S + C + P + (W or T)
    if qkv.dtype != np.float32 or qkv.ndim != 2 or qkv.shape[1] < (H + 2 * KVH) * D or not 1 <= R <= T:
        raise ValueError(f"qkv must be float32 [T, >= {(H + 2 * KVH) * D}] with rows <= T, got {qkv.dtype}"
                         f"{list(qkv.shape)} and rows {R}")
    if mask.dtype != np.float32 or mask.shape != (R, N):
        raise ValueError(f"mask must be float32 [{R}, {N}] (S {S} + C {C} + P {P} + {'W' if W else 'T'} "
                         f"{W or T}), got {mask.dtype}{list(mask.shape)}")
    if path is not None and (path.dtype != np.int64 or path.shape[0] != T):
        raise ValueError(f"path must be int64 [{T}, W], got {path.dtype}{list(path.shape)}")
    if o.dtype != np.float32 or o.shape[0] < R or o.shape[1] < H * D:
        raise ValueError(f"o must be float32 [>= {R}, >= {H * D}], got {o.dtype}{list(o.shape)}")
    if new_k.shape[0] != KVH or new_k.shape[1] < first + T or new_k.shape[2] != D or new_k.shape != new_v.shape:
        raise ValueError(f"new_k and new_v must be [{KVH}, >= {first + T}, {D}], got {list(new_k.shape)}, "
                         f"{list(new_v.shape)}")
    if not (new_k.flags.c_contiguous and new_v.flags.c_contiguous):
        raise ValueError("new_k and new_v must be C-contiguous (the pass's whole rows; `first` says where this "
                         "stream's are)")
    if kernel_path and kernel_path not in qmatmul._PATH_IDS:
        raise ValueError(f"no path {kernel_path!r}: {', '.join(qmatmul._PATH_IDS)}")


def reference(heads: Heads, qkv, tables, mask, recent, sinks, ring, path=None, rows=None, new=None) -> tuple:
    """The same attention in float64 with numpy, written from the definition (softmax over the visible columns):
    (o [rows, H D], new K, new V [KVH, T, D] in the pools' type). The tests' independent reference. `new`: the new
    rows' (K, V) as a pool holds them, to attend to instead of this function's own (a float16 pool's rounding of a
    key rotated in float64 and in float32 may differ by an ulp)."""
    H, KVH, D = heads.H, heads.KVH, heads.D
    G, T = H // KVH, qkv.shape[0]
    R = T if rows is None else rows
    kv = recent[0].dtype
    x = qkv.astype(np.float64)
    cos, sin, cos_s, sin_s = (np.asarray(t[:T], np.float64) for t in tables)

    def rot(v, c, s, n):                       # v [T, n*D] -> [T, n, D]
        v = v.reshape(T, n, D).copy()
        if heads.interleaved:
            a, b = v[..., 0::2].copy(), v[..., 1::2].copy()
            v[..., 0::2], v[..., 1::2] = a * c[:, None] - b * s[:, None], b * c[:, None] + a * s[:, None]
        else:
            a, b = v[..., :D // 2].copy(), v[..., D // 2:].copy()
            v[..., :D // 2], v[..., D // 2:] = a * c[:, None] - b * s[:, None], b * c[:, None] + a * s[:, None]
        return v

    q, qs = rot(x[:, :H * D], cos, sin, H), rot(x[:, :H * D], cos_s, sin_s, H)
    k_new = rot(x[:, H * D:(H + KVH) * D], cos, sin, KVH).transpose(1, 0, 2).astype(kv)        # [KVH, T, D]
    v_new = x[:, (H + KVH) * D:(H + 2 * KVH) * D].reshape(T, KVH, D).transpose(1, 0, 2).astype(kv)
    S = sinks[0].shape[0]
    seen_k, seen_v = (k_new, v_new) if new is None else new
    o = np.zeros((R, H * D))
    for r in range(R):
        sect = np.arange(T) if path is None else path[r]
        keys = np.concatenate([sinks[0].transpose(1, 0, 2), ring[0].transpose(1, 0, 2), recent[0],
                               seen_k[:, sect]], axis=1).astype(np.float64)                      # [KVH, N, D]
        vals = np.concatenate([sinks[1].transpose(1, 0, 2), ring[1].transpose(1, 0, 2), recent[1],
                               seen_v[:, sect]], axis=1).astype(np.float64)
        seen = mask[r] > NEG / 2
        for h in range(H):
            kh = h // G
            s = np.concatenate([keys[kh, :S] @ qs[r, h], keys[kh, S:] @ q[r, h]]) / np.sqrt(D) + mask[r]
            e = np.where(seen, np.exp(np.where(seen, s, 0) - s[seen].max()), 0.0)
            o[r, h * D:(h + 1) * D] = e @ vals[kh] / e.sum()
    return o, k_new, v_new

"""Float64 numpy reference of a llama-family decoder (llama, qwen2) read straight from a GGUF file.

It exists to test the real engine against, so it shares no code with it: weights are dequantized with
`gguf.quants.dequantize`, the cache policy is written from its definition (docs/design.md, "Definitions" and "Positions
and RoPE") as a visibility matrix over the tokens given, and there are no slots, rings or KV caches anywhere.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

# llama.cpp's rope type per architecture: llama GGUFs store Q/K rows permuted so adjacent pairs rotate together,
# qwen2 keeps HF's layout and rotates the halves (NeoX).
ROPE_STYLE = {"llama": "interleaved", "qwen2": "neox"}


@dataclass(frozen=True)
class ReferenceConfig:
    arch: str
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int          # leading dims of each head that RoPE rotates (head_dim for every model we ship)
    rope_base: float
    rms_eps: float
    vocab_size: int
    rope_style: str     # "interleaved" (adjacent pairs) or "neox" (half-split pairs)
    tied: bool          # no output.weight: the LM head is token_embd


def _field(reader: GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


class ReferenceModel:
    def __init__(self, config: ReferenceConfig, weights: dict[str, np.ndarray]):
        self.config = config
        self._w = weights

    @classmethod
    def from_gguf(cls, path: str | Path) -> "ReferenceModel":
        reader = GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
        if arch not in ROPE_STYLE:
            raise ValueError(f"{path}: architecture {arch!r} is not llama or qwen2")
        # reader's t.data is numpy-ordered (GGUF shape [in, out] arrives as rows [out, in]), so y = x @ W.T
        weights = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
            tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}
        tied = "output.weight" not in weights
        if tied:
            weights["output.weight"] = weights["token_embd.weight"]
        n_heads = int(_field(reader, f"{arch}.attention.head_count"))
        d_model = int(_field(reader, f"{arch}.embedding_length"))
        head_dim = int(_field(reader, f"{arch}.attention.key_length", d_model // n_heads))
        config = ReferenceConfig(
            arch=arch,
            n_layers=int(_field(reader, f"{arch}.block_count")),
            d_model=d_model,
            d_ff=int(_field(reader, f"{arch}.feed_forward_length")),
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            n_rot=int(_field(reader, f"{arch}.rope.dimension_count", head_dim)),
            rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
            vocab_size=weights["token_embd.weight"].shape[0],
            rope_style=ROPE_STYLE[arch],
            tied=tied,
        )
        return cls(config, weights)

    def with_config(self, **changes) -> "ReferenceModel":
        """The same weights under a changed config (n_layers=k runs only the first k blocks, as a truncated draft)."""
        return ReferenceModel(dataclasses.replace(self.config, **changes), self._w)

    def dequantized(self, name: str) -> np.ndarray:
        """The float64 tensor `name` (GGUF naming, numpy order: a weight is [out, in])."""
        return self._w[name]

    # ------------------------------------------------------------------ building blocks

    def _rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x * w / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.config.rms_eps)

    def _rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """RoPE on x [n, heads, head_dim] with row i at positions[i]; angles u * theta_j formed in float64."""
        c = self.config
        half = c.n_rot // 2
        theta = c.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / c.n_rot)
        angle = positions.astype(np.float64)[:, None] * theta[None, :]          # [n, half]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        out = x.copy()
        if c.rope_style == "interleaved":
            a, b = x[..., 0:c.n_rot:2], x[..., 1:c.n_rot:2]
            out[..., 0:c.n_rot:2] = a * cos - b * sin
            out[..., 1:c.n_rot:2] = a * sin + b * cos
        else:
            a, b = x[..., :half], x[..., half:c.n_rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:c.n_rot] = a * sin + b * cos
        return out

    @staticmethod
    def visibility(positions: np.ndarray, sink: int, window: int | None) -> np.ndarray:
        """[n, n] bool: row i (at u = positions[i]) sees key j iff v = positions[j] <= u and (v < S or v > u - W)."""
        u = positions[:, None]
        v = positions[None, :]
        causal = v <= u
        if window is None:
            return causal
        return causal & ((v < sink) | (v > u - window))

    def _hidden(self, tokens: np.ndarray, positions: np.ndarray, sink: int, window: int | None) -> np.ndarray:
        """Final-normed hidden states [n, d_model] under the sink + window policy."""
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        n = tokens.shape[0]
        if positions.shape != (n,):
            raise ValueError(f"{n} tokens but positions of shape {positions.shape}")
        if n > 1 and not np.all(np.diff(positions) > 0):
            raise ValueError("positions must be strictly increasing")
        if sink < 0 or (window is not None and window < 1):
            raise ValueError(f"need sink >= 0 and window >= 1, got sink={sink}, window={window}")
        visible = self.visibility(positions, sink, window)
        # Sinks keep their own rotation; the query scoring them sits at its position within the cache.
        is_sink = np.zeros(n, dtype=bool) if window is None else positions < sink
        sink_query_pos = positions if window is None else np.minimum(positions, sink + window - 1)
        group = c.n_heads // c.n_kv_heads
        scale = 1.0 / np.sqrt(c.head_dim)

        x = self._w["token_embd.weight"][tokens]
        for layer in range(c.n_layers):
            p = f"blk.{layer}."
            h = self._rms_norm(x, self._w[p + "attn_norm.weight"])
            q = self._linear(h, p + "attn_q").reshape(n, c.n_heads, c.head_dim)
            k = self._linear(h, p + "attn_k").reshape(n, c.n_kv_heads, c.head_dim)
            v = self._linear(h, p + "attn_v").reshape(n, c.n_kv_heads, c.head_dim)
            k = np.repeat(self._rotate(k, positions), group, axis=1)   # head hd uses kv head hd // group
            v = np.repeat(v, group, axis=1)
            k_t = k.transpose(1, 2, 0)                                  # [heads, head_dim, n]
            scores = self._rotate(q, positions).transpose(1, 0, 2) @ k_t   # [heads, n, n]
            if is_sink.any():
                q_sink = self._rotate(q, sink_query_pos).transpose(1, 0, 2)
                scores[:, :, is_sink] = q_sink @ k_t[:, :, is_sink]
            scores = np.where(visible[None], scores * scale, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = (probs @ v.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, c.n_heads * c.head_dim)
            x = x + attn @ self._w[p + "attn_output.weight"].T
            h = self._rms_norm(x, self._w[p + "ffn_norm.weight"])
            gate = h @ self._w[p + "ffn_gate.weight"].T
            up = h @ self._w[p + "ffn_up.weight"].T
            silu = gate * (0.5 + 0.5 * np.tanh(0.5 * gate))   # gate * sigmoid(gate), without exp overflow
            x = x + (silu * up) @ self._w[p + "ffn_down.weight"].T
        return self._rms_norm(x, self._w["output_norm.weight"])

    def _linear(self, h: np.ndarray, name: str) -> np.ndarray:
        y = h @ self._w[name + ".weight"].T
        bias = self._w.get(name + ".bias")
        return y if bias is None else y + bias

    # ------------------------------------------------------------------ public

    def logits(self, tokens, positions, sink: int = 0, window: int | None = None) -> np.ndarray:
        """float64 [n, V]: token i at u = positions[i] attends, among the tokens given, to those at positions < sink
        and to those in [u - window + 1, u]; window None is full causal attention. Positions strictly increase; a
        forward jump stands for tokens evicted from the ring."""
        return self._hidden(tokens, positions, sink, window) @ self._w["output.weight"].T

    def logits_tree(self, context_tokens, context_positions, tree_tokens, parent, sink: int = 0,
                    window: int | None = None) -> np.ndarray:
        """float64 [m, V]: logits after tree node i, computed on the linear sequence context + ancestors(i) + i.

        parent[i] is the index of node i's parent, or -1 for a child of the last context token; a node at depth d
        (roots have d = 0) sits at position context_positions[-1] + 1 + d.
        """
        context_tokens = list(np.asarray(context_tokens, dtype=np.int64))
        context_positions = list(np.asarray(context_positions, dtype=np.int64))
        tree_tokens = np.asarray(tree_tokens, dtype=np.int64)
        parent = np.asarray(parent, dtype=np.int64)
        base = context_positions[-1] + 1 if context_positions else 0
        m = len(tree_tokens)
        paths = []
        for i in range(m):
            path, node = [], i
            while node != -1:
                path.append(node)
                node = int(parent[node])
                if len(path) > m:
                    raise ValueError("parent does not describe a tree")
            paths.append(path[::-1])
        out = np.empty((m, self.config.vocab_size))
        done = np.zeros(m, dtype=bool)
        # One pass per leaf: every prefix of a root-to-leaf sequence is an ancestor path, so its rows are exact too.
        for i in sorted(range(m), key=lambda j: -len(paths[j])):
            if done[i]:
                continue
            path = paths[i]
            tokens = context_tokens + [int(tree_tokens[j]) for j in path]
            positions = context_positions + [base + d for d in range(len(path))]
            hidden = self._hidden(np.array(tokens), np.array(positions), sink, window)[len(context_tokens):]
            out[path] = hidden @ self._w["output.weight"].T
            done[path] = True
        return out

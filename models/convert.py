"""GGUF -> a converted model directory: one shared weight file, a model card, and ONNX graphs built per shape.

Owns the on-disk layout of a converted model (``weights.bin`` + ``card.json`` + ``graphs/*.onnx``) and the decision
of which weights stay quantized; `run_convert` is the `convert` verb (its `ConvertReport` reads as `run.py`'s
reports do). Never runs a model and never changes a weight's value.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import quant
from .draftnet import TARGET_IDS
from .gguf import GGUFError, GGUFModel, sha256_file
from .graph import ensure_graph
from .tokenizer import Tokenizer

CARD = "card.json"
WEIGHTS = "weights.bin"
FORMAT = 2                # 2: every common GGUF type packed (models/quant.py FORMS), quantized embedding tables
ALIGN = 64
ROWS_PER_CHUNK = 8192     # rows of a weight packed at once: conversion memory is bounded by a chunk, not a tensor
# Each layer's linears and the GGUF tensors (blk.{i}.<name>.weight) whose outputs they concatenate, in order.
LAYER_LINEARS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
                 "down": ("ffn_down",)}


class WeightWriter:
    """Appends aligned arrays to weights.bin and records where each one lives."""

    def __init__(self, path: Path):
        self.file = open(path, "wb")
        self.index: dict[str, dict] = {}

    def add(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        pad = (-self.file.tell()) % ALIGN
        self.file.write(b"\0" * pad)
        self.index[name] = {"dtype": array.dtype.name, "shape": list(array.shape), "offset": self.file.tell(),
                            "nbytes": int(array.nbytes)}
        self.file.write(array.tobytes())
        return name

    def begin(self, name: str, dtype: str, shape: list[int]) -> str:
        """An array written in row chunks (`append`, then `end`): a large weight never whole in memory."""
        pad = (-self.file.tell()) % ALIGN
        self.file.write(b"\0" * pad)
        self.index[name] = {"dtype": dtype, "shape": shape, "offset": self.file.tell(),
                            "nbytes": int(np.prod(shape)) * np.dtype(dtype).itemsize}
        return name

    def append(self, name: str, chunk: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(chunk, dtype=self.index[name]["dtype"]).tobytes())

    def end(self, name: str) -> None:
        meta = self.index[name]
        if self.file.tell() != meta["offset"] + meta["nbytes"]:
            raise AssertionError(f"{name}: {self.file.tell() - meta['offset']} bytes written, {meta['nbytes']} due")

    def close(self) -> None:
        self.file.close()


def _linear(model: GGUFModel, w: WeightWriter, out: str, sources: list[str], bias: list[str] | None) -> dict:
    """One matmul over the concatenated outputs of `sources` (fused QKV, fused gate/up). Sources of one packed form
    share one MatMulNBits; a fusion of several forms (the Q4_K_M rule gives some layers a Q6_K `attn_v`) is one node
    per run of sources of one form, their outputs concatenated ("kind": "concat")."""
    shapes = [model.tensor_shape(s) for s in sources]
    runs: list[list[str]] = []
    for s in sources:
        if runs and _form_of(model, runs[-1][0]) == _form_of(model, s):
            runs[-1].append(s)
        else:
            runs.append([s])
    parts = [_leaf(model, w, out if len(runs) == 1 else f"{out}.{i}", run) for i, run in enumerate(runs)]
    spec = parts[0] if len(parts) == 1 else {"kind": "concat", "K": shapes[0][1], "N": sum(s[0] for s in shapes),
                                             "parts": parts}
    spec["splits"] = [s[0] for s in shapes]
    if bias:
        spec["bias"] = w.add(f"{out}.bias", np.concatenate(
            [np.asarray(model.tensor(b), np.float32).reshape(-1) for b in bias]))
    return spec


def _form_of(model: GGUFModel, tensor: str) -> quant.Form | None:
    return quant.FORMS.get(model.tensor_type(tensor))


def _leaf(model: GGUFModel, w: WeightWriter, out: str, sources: list[str]) -> dict:
    """Sources of one form as one MatMulNBits operand set, packed ROWS_PER_CHUNK rows at a time (the codes stream
    to the file; scales, zero points and offsets, an eighth of them or less, are gathered and written after); or, for
    types with no packed form, one float32 W^T."""
    k_in, n_out = model.tensor_shape(sources[0])[1], sum(model.tensor_shape(s)[0] for s in sources)
    spec: dict = {"K": k_in, "N": n_out}
    form = _form_of(model, sources[0])
    if form is None:
        dense = np.concatenate([quant.dequantize(model.tensor(s), model.tensor_type(s), model.tensor_shape(s))
                                for s in sources])
        return {**spec, "kind": "dense", "W": w.add(f"{out}.W", dense.T)}
    nb = k_in // form.block
    codes = w.begin(f"{out}.B", "uint8", [n_out, nb, form.block * form.bits // 8])
    scales, zps, offsets = [], [], []
    for s in sources:
        rows = model.tensor_shape(s)[0]
        raw = np.asarray(model.tensor(s)).reshape(rows, -1)
        for r0 in range(0, rows, ROWS_PER_CHUNK):
            r1 = min(rows, r0 + ROWS_PER_CHUNK)
            p = quant.pack(raw[r0:r1], model.tensor_type(s), r1 - r0, k_in, name=s)
            w.append(codes, p.packed)
            scales.append(p.scales)
            zps.append(p.zero_points)
            offsets.append(p.offsets)
    w.end(codes)
    return {**spec, "kind": "nbits", "bits": form.bits, "block": form.block, "zero_point": form.zero_point, "B": codes,
            "scales": w.add(f"{out}.scales", np.concatenate(scales)),
            "zero_points": None if form.default_zero_point else w.add(f"{out}.zero_points", np.concatenate(zps)),
            "offsets": w.add(f"{out}.offsets", np.concatenate(offsets, axis=1)) if form.offsets else None}


def head_source(tied: bool) -> str:
    """The GGUF tensor of the output head."""
    return "token_embd.weight" if tied else "output.weight"


def linear_sources(n_layers: int, tied: bool) -> list[str]:
    """Every GGUF tensor a linear is made of: the layers' and the head's."""
    return [f"blk.{i}.{s}.weight" for i in range(n_layers) for srcs in LAYER_LINEARS.values() for s in srcs] + \
        [head_source(tied)]


def linears(card: dict) -> list[dict]:
    """Every linear of a converted model: the card's own (the head), then each layer's QKV, output, gate/up, down."""
    return list(card["linears"].values()) + [layer[k] for layer in card["layers"]
                                             for k in ("qkv", "o", "gate_up", "down")]


def leaves(spec: dict) -> list[dict]:
    """A linear's matmul operands: itself, or the parts of a fusion of several forms."""
    return spec["parts"] if spec["kind"] == "concat" else [spec]


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, progress: bool = True) -> Path:
    """Convert a llama-family GGUF into `out_dir`; returns the card path. Idempotent for the same source."""

    out = Path(out_dir)
    model = GGUFModel(gguf_path)
    cfg = model.config
    out.mkdir(parents=True, exist_ok=True)
    (out / CARD).unlink(missing_ok=True)        # unfinished until the new card lands
    for stale in out.glob("graph_*.onnx"):      # graphs point into weights.bin by offset: never reuse them
        stale.unlink()
    tmp_weights = out / (WEIGHTS + ".part")
    w = WeightWriter(tmp_weights)
    steps = cfg.n_layers + 2
    bar = _progress(steps, f"converting {Path(gguf_path).name}", progress)
    t0 = time.perf_counter()

    emb_type = model.tensor_type("token_embd.weight")
    card_linears: dict[str, dict] = {}
    if emb_type in quant.FORMS:
        # The table stays packed: the graph gathers a token's codes and scales and dequantizes them. Tied, it is
        # the head's operand set too.
        table = _linear(model, w, "embed", ["token_embd.weight"], None)
        embed = {"kind": "nbits", "table": table}
    else:
        table = None
        embed = {"kind": "dense", "W": w.add("embed.W", quant.dequantize(
            model.tensor("token_embd.weight"), emb_type, (cfg.vocab_size, cfg.d_model)))}
    bar.update(1)

    layers = []
    for i in range(cfg.n_layers):
        b = f"blk.{i}"
        qkv_bias = [f"{b}.attn_{x}.bias" for x in "qkv"] if cfg.qkv_bias else None
        layers.append({
            "attn_norm": w.add(f"{b}.attn_norm", np.asarray(model.tensor(f"{b}.attn_norm.weight"), np.float32)),
            "ffn_norm": w.add(f"{b}.ffn_norm", np.asarray(model.tensor(f"{b}.ffn_norm.weight"), np.float32)),
            **{key: _linear(model, w, f"{b}.{key}", [f"{b}.{src}.weight" for src in sources],
                            qkv_bias if key == "qkv" else None) for key, sources in LAYER_LINEARS.items()},
        })
        bar.update(1)

    if cfg.tied_embeddings and table is not None:
        card_linears["head"] = table
    else:
        card_linears["head"] = _linear(model, w, "head", [head_source(cfg.tied_embeddings)], None)
    head = "head"
    output_norm = w.add("output_norm", np.asarray(model.tensor("output_norm.weight"), np.float32))
    w.close()
    bar.update(1)
    bar.close()

    tok = Tokenizer.from_gguf(model.path)
    os.replace(tmp_weights, out / WEIGHTS)
    card = {
        "format": FORMAT,
        "config": dataclasses.asdict(cfg),
        "source": {"path": str(Path(gguf_path).resolve()), "sha256": sha256_file(Path(gguf_path)),
                   "name": model.field("general.name"), "tensor_types": _type_counts(model)},
        "tokenizer": {"model": model.field("tokenizer.ggml.model"), "pre": model.field("tokenizer.ggml.pre"),
                      "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "bos_id": tok.bos_id,
                      "stop_ids": [int(x) for x in tok.stop_ids]},
        "chat_template": model.field("tokenizer.chat_template"),
        "target_ids": _target_ids(model),
        "embed": embed, "head": head, "output_norm": output_norm, "layers": layers, "linears": card_linears,
        "tensors": w.index,
        "outputs": {WEIGHTS: sha256_file(out / WEIGHTS)},
        "graph_inputs": "input_ids[T] int64; cos,sin,cos_sink,sin_sink[T,D/2] f32; mask[T,S+R+T] f32; "
                        "per layer sink_k/sink_v[KVH,S,D], ring_k/ring_v[KVH,R,D] f32",
        "graph_outputs": "logits[T or 1,V] f32; new_k/new_v[L,KVH,T,D] f32",
        "seconds": round(time.perf_counter() - t0, 2),
    }
    part = out / (CARD + ".part")
    part.write_text(json.dumps(card, indent=1))
    os.replace(part, out / CARD)            # last, by rename: a card means a finished conversion
    return out / CARD


def _target_ids(model: GGUFModel) -> list[int] | None:
    """A distilled draft's vocabulary map (models.draftnet.TARGET_IDS), checked against its tokenizer; else None."""

    ids = model.field(TARGET_IDS)
    if ids is None:
        return None
    ids = [int(x) for x in ids]
    n_tokens = len(model.field("tokenizer.ggml.tokens") or ())
    if len(ids) != model.config.vocab_size or max(ids) >= n_tokens or min(ids) < -1:
        raise GGUFError(f"{model.path}: {TARGET_IDS} must map each of the {model.config.vocab_size} draft ids to one "
                        f"of the tokenizer's {n_tokens} tokens (or -1)")
    return ids


def _type_counts(model: GGUFModel) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in model.tensors.values():
        counts[t.type] = counts.get(t.type, 0) + 1
    return counts


def relocate(model_dir: Path, gguf_path: Path) -> None:
    """Point the card at `gguf_path`, a file with the content the model was converted from (the directory is keyed by
    its sha256), when the file it names is elsewhere: the native pass reads the GGUF's blocks (models/native.py)."""
    card = json.loads((model_dir / CARD).read_text())
    where = str(Path(gguf_path).resolve())
    if card["source"]["path"] != where:
        card["source"]["path"] = where
        part = model_dir / f"{CARD}.{os.getpid()}.part"
        part.write_text(json.dumps(card, indent=1))
        os.replace(part, model_dir / CARD)


def load_card(model_dir: str | os.PathLike) -> dict:
    path = Path(model_dir) / CARD
    if not path.exists():
        raise FileNotFoundError(f"{model_dir}: no {CARD}; convert a GGUF there first (python run.py convert)")
    card = json.loads(path.read_text())
    if card.get("format") != FORMAT:
        raise ValueError(f"{path}: card format {card.get('format')} != {FORMAT}; re-convert")
    return card


@dataclass
class ConvertReport:
    """What `convert` made: the card, its path and the graphs built on request (`run.py` prints `text()`)."""
    gguf: str
    out: str
    card_path: Path
    card: dict
    graphs: list[Path]
    exit_code = 0
    indent = None

    def as_dict(self) -> dict:
        return {"gguf": self.gguf, "out": self.out, "card": str(self.card_path),
                "graphs": [str(g) for g in self.graphs]}

    def text(self) -> str:
        cfg = self.card["config"]
        return "\n".join([*map(str, self.graphs), f"converted {self.gguf} -> {self.out}",
                          (f"  {cfg['arch']}: {cfg['n_layers']} layers, d={cfg['d_model']}, {cfg['n_heads']} heads / "
                           f"{cfg['n_kv_heads']} kv,"),
                          (f"  vocab {cfg['vocab_size']}, weights {self.card['source']['tensor_types']}; card: "
                           f"{self.card_path}")])

    def notes(self) -> str:
        return ""


def run_convert(gguf: str, out: str, graphs=()) -> ConvertReport:
    """Convert a llama/qwen2 GGUF into an ONNX model directory; each "T,S,R" in `graphs` also builds the static-shape
    graph for T rows, S sinks, R ring slots."""
    card_path = convert(gguf, out)
    card = load_card(out)
    built = []
    for spec in graphs:
        T, S, R = (int(x) for x in spec.split(","))
        built.append(ensure_graph(Path(out), card, T, S, R))
    return ConvertReport(gguf, out, card_path, card, built)


class _Silent:
    def update(self, n): ...
    def close(self): ...


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _Silent()
    return tqdm(total=total, desc=desc, unit="layer", file=sys.stderr, leave=False)

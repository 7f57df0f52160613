"""The memory plan: what every process of a profile's pipeline holds, term by term, against the board's RAM.

Owns the terms and where each comes from. Computed: a model's weights (its converted weights.bin, which ONNX Runtime
reads in; the native pass: its GGUF, mapped), its K/V pool (`kv_bytes_per_slot` x the ring's slots, the formula the soak checks against the pool it
allocates), its pass buffers (the new rows' K/V, the logits and the mask at max_rows), the channels (each counted
once, in the process that creates it, at its full segment size: pipeline/topology.py), the archive's SQLite page
cache. Measured once and recorded below, with the command that measured them: what a process holds beyond those
(interpreter, numpy, ONNX Runtime, tokenizer, its objects) and what a model session holds beyond them (its arena).
A draft on the NPU: its .rknn files (one per row bucket in float16, one in int8; an estimate until `export-rknn`
wrote them) and the pools each takes as inputs, in the NPU's IOMMU domain; its runtime's own overhead is not
measured (no board here).
`python run.py plan` prints the plan; the launcher checks it before the first start and refuses a profile that does
not fit, naming the term to change. Also the board's cores against what /proc/cpuinfo says they are. Never opens a
session or starts a process.
"""
from __future__ import annotations

import os
import re
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from models.convert import linears
from models.npu_runner import buckets, rknn_path
from models.platform import core_kinds
from models.runner import RunnerOptions, kv_bytes_per_slot
from pipeline.config import Config, ConfigError, cpu_set, node_profile, streams_of
from pipeline.report import Report
from pipeline.stream.frame import replay_frame
from pipeline.topology import CREATORS, ROLES, channels

MiB = 1 << 20

# Proportional set size (shared library pages split among the processes mapping them; /proc/PID/smaps_rollup) of
# each process beyond its computed terms, MiB, on the default profile under `serve` at steady state, x86-64, CPython
# 3.11.7, ONNX Runtime 1.32.0 (the soak prints each process's PSS beside the plan's). The launcher is the `serve` (or
# `replay`) process itself; its fork server and the actors forked from it share the fork server's pages. Measured
# with forked actors by `python run.py soak --serve --tokens 30000 --every 5000 --json` ("memory_plan": each term
# moved by its PSS less its plan); the target's is the first measurement's (150,000 tokens, spawned actors:
# docs/stream-quality.md): the session term below is derived from it, and the forked target held within 1% of it.
PROCESS_MIB = {"launcher": 86, "fork_server": 25, "ingest": 51, "cache_owner": 62, "target": 55, "draft": 23,
               "output": 52}
# A model session's arena and graph beyond weights, pool and pass buffers: the target actor's PSS in the same run
# (374 MiB) less its process term (55), weights (106.4), pool (76.6) and pass buffers (8), for SmolLM2-135M at
# max_rows 32: 128 MiB. Another model's is scaled by its weights (an assumption, not a measurement: re-measure on
# the board with the soak).
SESSION_MIB_PER_WEIGHT_MIB = 128 / 106.4
# The same term measured for the registry's larger models (it does not scale with the weights: ONNX Runtime's
# prepacked MatMulNBits operands carry per-block sums, 4 bytes a block, and the 8-bit/16 and 4-bit/32 forms differ),
# keyed by the GGUF's sha256: PSS beyond the weights file and the pool after a 32-row prefill and 16 decode passes,
# `python -m bench.session_memory --model NAME` (x86-64, ONNX Runtime 1.32.0, window 1024, max_rows 32).
SESSION_MIB_MEASURED = {
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046": 446,      # qwen2.5-coder-1.5b
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32": 92,       # qwen2.5-coder-0.5b
}
# A target of several streams keeps the single-stream graph beside the N-stream one (`model.lone_graph`): its session
# holds its own packed weights and arena. Measured for SmolLM2-135M (136 MiB PSS: `python run.py bench --task
# streams`, target only, "the single-stream graph kept beside"); another model's is scaled by its weights.
LONE_GRAPH_MIB_PER_WEIGHT_MIB = 136 / 106.4
# An added stream's state in the actors that serve every stream of a node, beyond its pools, buffers and channels
# (each stream's verifier, sampler and staging in the target; its proposer in the draft; its ring index and masks in
# the cache owner; the first stream's is in PROCESS_MIB), MiB: `python run.py bench --task streams --streams 1,2,4,8
# --repeats 1` (docs/streams.md, "Figures"), each process's PSS at the peak from 4 to 8 streams per added stream
# (target 106.8 less its 105.6 pool and its share of a channel; draft 3.3, of it the suffix index's 2.6; the cache
# owner 2.5 less its channels' share; output none).
STREAM_MIB = {"target": 1, "draft": 3, "cache_owner": 2}
# A slot of the several-stream graph (the most streams one pass carries, `model.pass_streams`): its attention's nodes
# in the session, ONNX Runtime's state for them. Measured for SmolLM2-135M (30 layers): the target's PSS at 8 streams
# with pass_streams 8 against 2, per slot (`python run.py bench --task streams`, "graph slots"); scaled by layers.
SLOT_MIB_PER_LAYER = 8 / 30
# The native pass (`model.kernel = "native"`, models/native.py): its weights are the GGUF's pages, mapped as stored
# (counted whole: a long run touches them all), and the converted file's norms and biases; its session (the attention
# graph's, its IOBindings, the activation buffers) beyond them and the pool: `python -m bench.session_memory --model
# default --kernel native` (5.9 MiB, x86-64, ONNX Runtime 1.32.0, window 1024, max_rows 32), rounded up; per model
# where measured (keyed by the GGUF's sha256).
NATIVE_SESSION_MIB = 8
NATIVE_SESSION_MIB_MEASURED: dict[str, int] = {}
SQLITE_CACHE_BYTES = 2000 * 1024     # SQLite's default cache_size (-2000: 2,000 KiB) per connection
ARCHIVE_CONNECTIONS = 2              # the owner's writer, the front's reader


@dataclass(frozen=True)
class Term:
    process: str            # the actor (or "launcher") that holds it
    what: str               # weights, kv pool, pass buffers, channel NAME, archive cache, process, session
    bytes: int
    knob: str = ""          # the profile key that changes it ("" = none)
    npu: bool = False       # held in the NPU's IOMMU domain (a draft on the NPU)


@dataclass
class Plan(Report):
    """The plan's terms, its total against the board's RAM, the verdict; exit 1 when it does not fit."""
    board: str = ""
    ram: int = 0
    reserve: int = 0
    npu_domain: int = 0
    terms: list[Term] = field(default_factory=list)
    indent = 1

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def npu_total(self) -> int:
        return sum(t.bytes for t in self.terms if t.npu)

    @property
    def refusal(self) -> str:
        """Why the plan does not fit ("" when it does), naming the profile key whose terms weigh most."""
        if self.npu_domain and self.npu_total > self.npu_domain:
            return (f"the NPU would hold {_mib(self.npu_total)} MiB, over its {_mib(self.npu_domain)} MiB IOMMU "
                    f"domain (board.npu_domain_mb): {self._heaviest(npu=True)}")
        room = self.ram - self.reserve
        if self.total <= room:
            return ""
        return (f"the plan needs {_mib(self.total)} MiB, {_mib(self.total - room)} MiB more than the {_mib(room)} MiB "
                f"the board leaves it ({_mib(self.ram)} MiB of RAM less board.reserve_mb = {_mib(self.reserve)}): "
                f"{self._heaviest()}")

    def _heaviest(self, npu: bool = False) -> str:
        by_knob: dict[str, list[Term]] = {}
        for t in self.terms:
            if t.knob and (t.npu or not npu):
                by_knob.setdefault(t.knob, []).append(t)
        knob, terms = max(by_knob.items(), key=lambda kv: sum(t.bytes for t in kv[1]))
        return (f"change {knob} first ({_mib(sum(t.bytes for t in terms))} MiB: "
                + ", ".join(f"{t.process} {t.what}" for t in terms) + ")")

    def as_dict(self) -> dict:
        return {"board": self.board, "ram_bytes": self.ram, "reserve_bytes": self.reserve, "total_bytes": self.total,
                "fits": not self.refusal, "refusal": self.refusal, "npu_bytes": self.npu_total,
                "npu_domain_bytes": self.npu_domain,
                "processes": {p: sum(t.bytes for t in self.terms if t.process == p) for p in self._processes()},
                "terms": [t.__dict__ for t in self.terms]}

    def text(self) -> str:
        lines = [f"memory plan for {self.board}: {_mib(self.ram)} MiB RAM, {_mib(self.reserve)} MiB reserved"]
        for p in self._processes():
            mine = [t for t in self.terms if t.process == p]
            lines.append(f"  {p:<26} {_mib(sum(t.bytes for t in mine)):>9} MiB")
            lines += [f"    {t.what:<24} {_mib(t.bytes):>9}{' NPU' if t.npu else '':<4}  {t.knob}".rstrip()
                      for t in mine]
        npu = f"; on the NPU {_mib(self.npu_total)} of {_mib(self.npu_domain)}" if self.npu_domain else ""
        lines.append(f"  {'total':<26} {_mib(self.total):>9} MiB of {_mib(self.ram - self.reserve)}{npu}")
        lines.append(f"  {'refused: ' + self.refusal if self.refusal else 'fits'}")
        return "\n".join(lines)

    @property
    def exit_code(self) -> int:
        return 1 if self.refusal else 0

    def _processes(self) -> list[str]:
        return list(dict.fromkeys(t.process for t in self.terms))


def plan(cfg: Config, ram: int | None = None, node: str | None = None) -> Plan:
    """Every process of the profile's pipeline, its memory term by term (weights, K/V pools, pass buffers, sessions,
    channels, archive cache, the process itself), and the total against the board's RAM less its reserve; exit 1 when
    it does not fit, naming the profile key to change. The launcher checks the same plan before it starts.

    Local and Ray launchers run one process per actor (a channel is counted in the process that creates it); serial
    runs the models in the launcher's process. `ram` (bytes) overrides [board] ram_mb. Streams on several nodes
    (`[[streams]] node`): each node is a board with a target of its own, planned alone (`node`)."""
    nodes = list(dict.fromkeys(st.node for st in cfg.streams))
    if node is not None and node not in nodes:
        raise ConfigError(f"{cfg.source}: no stream runs on node {node!r} (the profile's nodes: "
                          f"{', '.join(repr(n) for n in nodes) or 'none'})")
    if len(nodes) > 1 and node is None:
        raise ConfigError(f"{cfg.source}: the streams run on {len(nodes)} nodes "
                          f"({', '.join(repr(n) for n in nodes)}), each a board of its own: plan one with --node NAME")
    cfg = node_profile(cfg, node) if node is not None else cfg
    spec = replay_frame(cfg).spec
    serial = cfg.actors.launcher == "serial"
    home_of = (lambda actor: "launcher") if serial else (lambda actor: actor)
    terms: list[Term] = []
    target_dir, target = cfg.target.dir, cfg.target.card
    streams = streams_of(cfg)
    opts = cfg.model.resolved(target)
    terms += _model_terms(home_of("target"), "target", target, target_dir, spec, cfg.model.max_rows, "model.gguf",
                          npu=False, pools=len(streams),           # one pool per stream in the one target
                          lone_graph=len(streams) > 1 and cfg.model.lone_graph, kernel=opts.kernel,
                          kv_dtype=opts.pool_dtype)
    slots = cfg.model.graph_sizes(len(streams))[-1]
    if slots > 1:                             # the several-stream graph's slots beyond the one its session counts
        terms.append(Term(home_of("target"), f"graph slots x {slots - 1} added",
                          int((slots - 1) * SLOT_MIB_PER_LAYER * target["config"]["n_layers"] * MiB),
                          "model.pass_streams"))
    vocab = target["config"]["vocab_size"]
    if cfg.draft.uses_model:                  # one draft actor for the node's streams: the model once, a pool each
        draft_dir, draft = cfg.draft_model.dir, cfg.draft_model.card
        opts = RunnerOptions(kernel=cfg.model.kernel).resolved(draft)      # assemble's draft
        terms += _model_terms(home_of("draft"), "draft", draft, draft_dir, spec, cfg.model.max_rows,
                              "draft.model", npu=cfg.draft.backend == "rknn", pools=len(streams),
                              buffers=len(streams), kernel=opts.kernel, npu_dtype=cfg.draft.npu_dtype,
                              kv_dtype=opts.pool_dtype)
    for name, scfg in streams:                # a group's actors serve every stream: its channels are theirs
        if not serial:
            for ch_name, ch in channels(scfg, spec, vocab, "plan").items():
                terms.append(Term(CREATORS[ch_name], f"channel {ch_name}{' ' + name if name else ''}",
                                  ch.segment_bytes, _channel_knob(ch_name)))
            if cfg.serve.enabled:
                terms.append(Term("output", f"archive cache{' ' + name if name else ''}",
                                  ARCHIVE_CONNECTIONS * SQLITE_CACHE_BYTES))
    forks = ["fork_server"] if cfg.actors.launcher == "local" else []     # the local launcher forks its actors
    for process in ["launcher"] if serial else ["launcher", *forks, *ROLES]:
        terms.append(Term(process, "process", PROCESS_MIB[process] * MiB))
    if not serial and len(streams) > 1:
        for process, mib in STREAM_MIB.items():
            terms.append(Term(process, f"stream state x {len(streams) - 1} added", (len(streams) - 1) * mib * MiB))
    board_ram = ram if ram is not None else (cfg.board.ram_mb * MiB or _mem_total())
    return Plan(board=cfg.board.name or "this machine", ram=board_ram, reserve=cfg.board.reserve_mb * MiB,
                npu_domain=cfg.board.npu_domain_mb * MiB if cfg.board.npu else 0, terms=terms)


def check(cfg: Config, node: str | None = None) -> None:
    """The start-up check: the plan (of one node's streams, when they run on several) fits the board and the board's
    big cores are what the profile says; else ConfigError naming what to change."""
    refusal = plan(cfg, node=node).refusal
    if refusal:
        where = f" --node {node}" if node is not None else ""
        raise ConfigError(f"{cfg.source}: {refusal} (`python run.py plan --config {cfg.source}{where}` prints every "
                          f"term)")
    check_cores(cfg)


def host_plan(cfg: Config, nodes: list[str]) -> Plan:
    """Every node's plan on one host (the local launcher runs every node's group here): their terms together, each
    group's processes named by node, the launcher's own process and its fork server once."""
    plans = [plan(cfg, node=n) for n in nodes]
    once = ("launcher", "fork_server")
    terms = []
    for i, (n, p) in enumerate(zip(nodes, plans)):
        terms += [t if t.process in once else dataclasses.replace(t, process=f"{t.process}@{n}")
                  for t in p.terms if not (i and t.process in once and t.what == "process")]
    return dataclasses.replace(plans[0], terms=terms)


def check_host(cfg: Config, nodes: list[str]) -> None:
    """`check` for every node's streams on this one machine (the local launcher)."""
    refusal = host_plan(cfg, nodes).refusal
    if refusal:
        raise ConfigError(f"{cfg.source}: every node's streams run on this machine (the local launcher): {refusal} "
                          f"(`python run.py plan --config {cfg.source} --node NAME` prints a node's terms; "
                          f"--launcher ray runs each node's on its own)")
    check_cores(cfg)


def check_cores(cfg: Config, kinds: dict[int, str] | None = None) -> None:
    """[board] big_core against what /proc/cpuinfo says each of big_cpus is (where it says: an ARM kernel lists each
    core's part; x86 and qemu-user list none, and nothing is checked)."""
    if not cfg.board.big_core:
        return
    kinds = core_kinds() if kinds is None else kinds
    wrong = {cpu: kinds[cpu] for cpu in sorted(cpu_set(cfg.board.big_cpus)) if cpu in kinds and
             kinds[cpu] != cfg.board.big_core}
    if wrong:
        raise ConfigError(f"{cfg.source}: board.big_cpus = {cfg.board.big_cpus!r} should be {cfg.board.big_core} "
                          f"cores, but /proc/cpuinfo says " + ", ".join(f"cpu{c} is {k}" for c, k in wrong.items()))


def parse_size(text: str) -> int:
    """'8G', '512M', '2GiB', '1.5 GB', '4096' (MiB) -> bytes (binary units: a board's RAM is sold in GiB)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"--ram {text!r}: expected a size like 4G, 512M or 2GiB")
    unit = {"": MiB, "K": 1 << 10, "M": MiB, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * unit)


def _model_terms(process: str, role: str, card: dict, model_dir: Path, spec, max_rows: int, knob: str,
                 npu: bool, pools: int = 1, lone_graph: bool = False, buffers: int = 1,
                 kernel: str = "nbits", npu_dtype: str = "float16", kv_dtype: str = "float32") -> list[Term]:
    """A model's terms in `process`; `pools`: K/V pools it holds (a target or draft serving several streams: one
    each); `lone_graph`: it also keeps the single-stream graph's session (`model.lone_graph`); `buffers`: runners
    with pass buffers of their own (a draft's streams: one each, on one session); `kernel`: the linears' (the
    native pass maps the GGUF instead of holding packed weights); `kv_dtype`: its pools' type (`pool_dtype`)."""
    c = card["config"]
    native = kernel == "native" and not npu
    if native:
        small = sum(t["nbytes"] for name, t in card["tensors"].items() if name.endswith(("norm", ".bias")))
        weights = os.path.getsize(card["source"]["path"]) + small
    else:
        weights = os.path.getsize(model_dir / "weights.bin")
    kv = "float32" if npu else kv_dtype                     # an NPU graph's pools are float32 host arrays
    pool = kv_bytes_per_slot(c, kv) * (spec.pool_slots if npu else spec.stored_slots)   # a CPU runner mirrors views
    f32 = np.dtype(np.float32).itemsize
    pass_bytes = (2 * c["n_layers"] * c["n_kv_heads"] * max_rows * c["head_dim"] * np.dtype(kv).itemsize  # new K, V
               + max_rows * c["vocab_size"] * f32                                       # logits
               + max_rows * (spec.pool_slots + 64 + max_rows) * f32)                    # mask
    of = "" if process == role else f"{role} "             # serial: both models in the launcher's process
    many = f" x {pools} streams" if pools > 1 else ""
    each = f" x {buffers} streams" if buffers > 1 else ""
    if npu:       # a model per row bucket (int8: one), each with the pools as inputs; the pools' host copy in float32
        sizes = [rknn_path(model_dir, T, spec.sink, spec.ring, npu_dtype) for T in buckets(max_rows, npu_dtype)]
        models = sum(f.stat().st_size for f in sizes) if all(f.exists() for f in sizes) else \
            len(sizes) * _npu_weight_bytes(card, npu_dtype)
        return [Term(process, f"{of}weights (.rknn)", models, knob, npu),
                Term(process, f"{of}kv pool inputs", len(sizes) * pool // 2, "cache.window", npu),
                Term(process, f"{of}kv pool (host){many}", pool * pools, "cache.window"),
                Term(process, f"{of}pass buffers{each}", pass_bytes * buffers, "model.max_rows")]
    sha = card.get("source", {}).get("sha256", "")
    measured = (NATIVE_SESSION_MIB_MEASURED.get(sha, NATIVE_SESSION_MIB) if native else
                SESSION_MIB_MEASURED.get(sha))
    session = measured * MiB if measured is not None else int(SESSION_MIB_PER_WEIGHT_MIB * weights)
    terms = [Term(process, f"{of}weights{' (the GGUF, mapped)' if native else ''}", weights, knob, npu),
             Term(process, f"{of}kv pool{many}", pool * pools, "cache.window", npu),
             Term(process, f"{of}pass buffers{each}", pass_bytes * buffers, "model.max_rows", npu),
             Term(process, f"{of}session", session, knob, npu)]
    if lone_graph:                          # native: the same mapped pages, its own attention session
        terms.append(Term(process, f"{of}single-stream graph", session if native else
                          int(LONE_GRAPH_MIB_PER_WEIGHT_MIB * weights), "model.lone_graph"))
    return terms


def _npu_weight_bytes(card: dict, dtype: str) -> int:
    """One .rknn's weights, estimated from the portable graph's (models/graph.py): every linear as N x K weights, and a
    quantized embedding table once more (a Gather, shared with the head or not). In float16 two bytes each; in int8
    the linears one byte a weight and the table, kept in float16, two (models/npu_runner.py `_toolkit`)."""
    linear = sum(x["N"] * x["K"] for x in linears(card))
    table = card["embed"]["table"]["N"] * card["embed"]["table"]["K"] if card["embed"]["kind"] != "dense" else 0
    return (1 if dtype == "int8" else 2) * linear + 2 * table


def _channel_knob(name: str) -> str:
    return {"asks": "serve.max_prompt_tokens", "to_target": "model.max_rows"}.get(name, "")


def _mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f}"

"""Batch invariance, measured where greedy identity needs it: the target's own graph, through the engines' own plans.

Owns the start-up exactness check. A probe decodes a few rows one pass each (as target-only decoding does), then
verifies the same rows as blocks of 2..8 rows (and, on a tree runner, as a token tree with a sibling), at a small
position (and, for `doctor`, past 2^31 too), and compares every row's logits, surprisal (the graph's `nll`, what a
scored prefill reads) and new K/V bit for bit. Passes are
planned by the step and run by the local verifier (pipeline/decode/step.py, local.py), as both engines run them.
Never decides what a failure means for a run: callers report the verdict (a start-up line, the journal's first
record, /metrics, the bench's metadata; `run.py doctor`, whose report is `DoctorReport`).

The rule it checks is the runner's (models/runner.py, "Batch invariance"): with it, speculation changes no output
token; without it, on some CPUs, a row alone and the same row in a block differ (docs/design.md, "Greedy identity").
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from kernels import qmatmul
from kernels.ring import RingSpec
from models.convert import linear_sources
from models.gguf import GGUFModel
from models.opcheck import families, native_attention_families, native_families, pool_attention
from models.platform import facts
from models.runner import Runner, RunnerOptions
from pipeline.config import Config, ring_spec
from pipeline.decode.blocks import ALIGNED_BLOCK
from pipeline.decode.drafts.base import Proposed
from pipeline.decode.local import LocalDraft, LocalVerifier
from pipeline.decode.step import Decoder, Policy
from pipeline.report import Report

FAR = 2**31 - ALIGNED_BLOCK  # an aligned block start past which positions need int64 (the second probe position)
OFFSET = 5                   # rows start this far into their aligned block (a recent section of 5 positions)
QUICK = (2, 3, 5)            # block sizes verified against rows decoded one pass each, at start-up
THOROUGH = (2, 3, 8)         # ... and by `doctor`
TOKENS = (504, 966, 314, 253, 1398, 282, 511, 260, 1844, 28)   # any ids below every vocabulary this runs on
NEXT = 260                   # every row's surprisal is read for this next token


@dataclass(frozen=True)
class Invariance:
    """Whether a row's logits and K/V are the same bits alone and inside any block (and tree) of the probe."""
    invariant: bool
    passes: int                  # forward passes the probe ran
    rows_compared: int
    max_abs_logit: float         # largest |difference| of a compared logit (0.0 when invariant)
    where: str                   # the first mismatch, in words ("" when invariant)
    seconds: float
    batch_invariant_rule: bool   # the runner's padding rule was on (the native pass has none: it needs none)
    trees: bool                  # the tree graph was probed too

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line for a start-up message or a report."""
        rule = "with" if self.batch_invariant_rule else "without"
        if self.invariant:
            return (f"rows are batch invariant ({self.rows_compared} rows, {self.passes} passes, "
                    f"{rule} the one-row padding rule, {self.seconds * 1e3:.0f} ms)")
        return (f"rows are NOT batch invariant on this CPU ({rule} the one-row padding rule): {self.where}; "
                f"greedy output with a draft may differ from single-token decoding here")


class _Probe:
    def __init__(self, runner, tokens: np.ndarray):
        self.runner, self.spec, self.tokens = runner, runner.spec, tokens
        self.rows = min(runner.opts.max_rows, self.spec.slack + 1)          # prefill passes as the engines run them
        self.verifier = LocalVerifier(runner)
        self.decoder = Decoder(self.spec, self.verifier, LocalDraft(), Policy(0, self.rows))
        self.index = self.decoder.index
        self.passes = self.compared = 0
        self.worst, self.where = 0.0, ""

    def feed(self, ids) -> None:
        """Commit `ids` in passes, as a prefill does."""
        self.decoder.feed(ids)
        self.passes += -(-len(ids) // self.rows)

    def verify(self, pending: int, prop: Proposed):
        """One verify pass as the engines plan it: (logits [N+1, V + 1]: each row's surprisal of NEXT appended, new
        K [L, KVH, N+1, D]) copies, and the block."""
        blk, mask = self.decoder.plan(pending, prop)
        logits = self.verifier.run(blk, mask, targets=np.full(len(blk.tokens), NEXT, np.int64))
        self.passes += 1
        rows = np.concatenate([logits, self.runner.nll[:, None]], axis=1)
        return rows, np.concatenate([self.runner.new_k, self.runner.new_v], axis=1), blk

    def alone(self, tokens) -> list:
        """Decode `tokens` one pass each from the committed position, committing each; [(logits, kv)] per row."""
        out = []
        for tok in tokens:
            logits, kv, blk = self.verify(int(tok), Proposed.chain([]))
            out.append((logits[0], kv[:, :, 0]))
            self.runner.store(np.array([0]), self.index.write(blk.pos[:1]))
            self.index.commit(1)
        return out

    def compare(self, got_logits, got_kv, want, what: str) -> None:
        self.compared += 1
        want_logits, want_kv = want
        if np.array_equal(got_logits, want_logits) and np.array_equal(got_kv, want_kv):
            return
        diff = float(np.abs(got_logits.astype(np.float64) - want_logits).max())
        if not self.where:
            part = "logits" if diff and not np.array_equal(got_logits[:-1], want_logits[:-1]) else "surprisal"
            self.where = f"{what}: {part} up to {diff:.3g} apart" if diff else f"{what}: K/V differ, logits agree"
        self.worst = max(self.worst, diff)

    def at(self, base: int, counts, tree: bool) -> None:
        """Probe rows [base, base + max(counts)) (base % ALIGNED_BLOCK == OFFSET): alone, then in blocks (and a tree
        of 4 nodes)."""
        top = max(counts)
        chain = self.tokens[:top]
        alone = self.alone(chain)
        sibling = None
        if tree:                                      # the sibling of row 1, alone, after row 0
            self.index.rollback(base + 1)
            sibling = self.alone(self.tokens[top:top + 1])[0]
        self.index.rollback(base)
        for T in counts:
            logits, kv, _ = self.verify(int(chain[0]), Proposed.chain(chain[1:T]))
            for r in range(T):
                self.compare(logits[r], kv[:, :, r], alone[r],
                             f"position {base + r} alone vs row {r} of a {T}-row block")
        if tree:      # rows: pending, chain[1] and its sibling (both children of pending), chain[2] under chain[1]
            prop = Proposed(np.array([chain[1], self.tokens[top], chain[2]], np.int64), np.array([-1, -1, 0]))
            logits, kv, _ = self.verify(int(chain[0]), prop)
            for r, want in zip(range(4), (alone[0], alone[1], sibling, alone[2])):
                self.compare(logits[r], kv[:, :, r], want, f"position {base + (r > 0) + (r > 2)} alone vs row {r} "
                                                           f"of a 4-node token tree")
        self.index.rollback(base)


def check(runner, thorough: bool = False) -> Invariance:
    """Probe `runner` (fresh: nothing committed that matters; its pools are cleared afterwards) and return the
    verdict. At start-up: blocks of QUICK rows at one position, about 12 passes (0.25 s for the default model on two
    AVX2 cores). thorough (`doctor`): blocks of THOROUGH rows at position 5 and past 2^31, about 26 passes."""
    t0 = time.perf_counter()
    S, opts = runner.spec.sink, runner.opts
    most = min(opts.max_rows, runner.spec.slack + 1)
    counts = tuple(T for T in (THOROUGH if thorough else QUICK) if T <= min(most, ALIGNED_BLOCK - OFFSET))
    tree = opts.trees and most >= 4
    tokens = np.array([t % runner.vocab for t in TOKENS], np.int64)
    probe = _Probe(runner, tokens)
    if counts:
        probe.feed(np.resize(tokens, S + (OFFSET - S) % ALIGNED_BLOCK))  # the sinks, then up to OFFSET into a block
        probe.at(probe.index.n, counts, tree)
        if thorough:
            probe.index.evict_to(FAR)
            probe.feed(tokens[:OFFSET])
            probe.at(probe.index.n, counts, tree)
    for pool in (runner.sink_k, runner.sink_v, runner.ring_k, runner.ring_v):
        pool.fill(0)
    runner.forward_calls = runner.forward_rows = 0
    runner.forward_s = 0.0
    where, worst = probe.where, probe.worst
    if not where:             # the pass above sees a short context; attention over the whole pool, alone
        wide = pool_attention(runner.card, opts.threads, runner.spec.pool_slots)
        if not wide.holds:
            where = (f"attention over {runner.spec.pool_slots} pool columns: a row among "
                     f"{[m for m in wide.differs_at if m > 1]} rows is not that row alone")
            worst = wide.max_abs
    return Invariance(where == "", probe.passes, probe.compared, worst, where, time.perf_counter() - t0,
                   runner.padded, tree)


@dataclass
class DoctorReport(Report):
    """`doctor`'s findings: the platform, the operator table, the whole-pass verdicts; exit 1 when not exact."""
    indent: ClassVar[int | None] = 1

    @property
    def exit_code(self) -> int:
        return 0 if self.data["exact"] else 1

    def text(self) -> str:
        rep = self.data
        pf = rep["platform"]
        lines = [(f"onnxruntime {pf['onnxruntime']}, numpy {pf['numpy']}, Python {pf['python']}, {pf['system']} "
                  f"{pf['machine']}\nCPU (as this process sees it): {pf['cpu']}") +
                 (f"   (/proc/cpuinfo: {pf['cpuinfo']})" if pf["cpuinfo"] and pf["cpuinfo"] != pf["cpu"] else ""),
                 (f"ISA features (CPUID / auxiliary vector): {' '.join(pf['isa'])}\nAVX-512: "
                  f"{' '.join(pf['avx512']) or 'none'}"),
                 (f"\noperator families alone, at the model's shapes, {rep['threads']} threads: a row among 1..64 rows "
                  f"against the same row among 64, and a row with 0..9 masked columns appended against none; the "
                  f"native matmul's, a row among 1..64 and 127..129 rows against the same row among 130, and the "
                  f"native attention's, the first 1..64 rows of a chain alone against the same rows among 64, at 1, 2 and 4 "
                  f"threads, and each path against the scalar reference:")]
        for op in rep["operators"]:
            bad, what = op["differs_at"], op["varied"]
            verdict = "invariant" if not bad else (f"1 row differs (up to {op['max_abs']:.2g}); 2..64 rows invariant"
                                                   if bad == [1] and what == "rows" else
                                                   f"differs at {bad} {what} (up to {op['max_abs']:.2g})")
            if bad and not op["needed"]:
                verdict += ": not reaching a row, every softmax of the graph runs over one width"
            lines.append(f"  {op['family']:70s} {verdict}\n  {'':4s}{op['shapes']}")
        lines.append("\nwhole pass (the model's graph; rows alone vs in blocks of 2-8 rows and a 4-node tree, at "
                     "positions 5 and 2^31 - 27):")
        on = "padding rule on" if rep.get("kernel") != "native" else "native, no padding"
        for name, label in (("chain", f"chain graph, {on} (the engine)"),
                            ("tree", f"tree graph, {on} (token trees)"),
                            ("chain_unpadded", "chain graph, padding rule off (information)")):
            v = rep["passes"][name]
            lines.append(f"  {label:46s} {'invariant' if v['invariant'] else 'NOT invariant: ' + v['where']}")
        lines.append("\n" + ("exact: speculation changes no output token on this CPU" if rep["exact"] else
                             "NOT exact on this CPU: greedy output with a draft may differ from single-token decoding"))
        return "\n".join(lines)


def native_types(card: dict) -> dict[tuple[int, int], set[str]]:
    """(K, N) -> the GGUF types of the model's linears of that shape, read from the source GGUF's metadata."""
    gguf = GGUFModel(card["source"]["path"])
    out: dict[tuple[int, int], set[str]] = {}
    for name in linear_sources(card["config"]["n_layers"], card["config"]["tied_embeddings"]):
        n, k = gguf.tensor_shape(name)
        if gguf.tensor_type(name) in qmatmul.BLOCK_BYTES:
            out.setdefault((k, n), set()).add(gguf.tensor_type(name))
    return out


def doctor(cfg: Config) -> DoctorReport:
    """Probe whether a row's logits and K/V are the same bits whatever the number of rows in its pass (batch
    invariance), which greedy identity with a draft needs. Prints the ONNX Runtime version, the CPU and the ISA
    features this process sees (CPUID / auxiliary vector), each operator family of the graph run alone at the model's
    shapes (1..64 rows), and the whole pass: rows decoded one pass each against the same rows in blocks of 2-8 and a
    token tree, at a small position and past 2^31, with the one-row padding rule (what the engine runs) and without
    it. Exits 0 when the engine's passes are invariant, 1 when not: qualify a new ONNX Runtime or CPU with it. The
    engine runs the whole-pass probe at start-up.

    The profile gives the model, its threads, the largest pass (model.max_rows) and the MatMulNBits accuracy level.
    Reports each operator family's row invariance at the model's shapes (models/opcheck.py) and the whole-pass
    verdict of the chain graph with and without the padding rule and of the tree graph with it. "exact": what the
    engine would run is invariant."""
    threads = cfg.model.threads
    max_rows, accuracy_level = cfg.model.max_rows, cfg.model.accuracy_level
    model_dir = cfg.target.dir
    spec = RingSpec(4, 256, 256 + max_rows)
    passes = {}
    for name, trees, rule in (("chain", False, True), ("tree", True, True), ("chain_unpadded", False, False)):
        runner = Runner(model_dir, spec, RunnerOptions(threads=threads, max_rows=max_rows, trees=trees,
                                                       accuracy_level=accuracy_level, batch_invariant=rule,
                                                       kernel=cfg.model.kernel, kv_dtype=cfg.model.kv_dtype))
        passes[name] = check(runner, thorough=True).as_dict()
        del runner
    card = cfg.target.card
    found = families(card, threads, accuracy_level, pool=ring_spec(cfg).pool_slots)
    opts = cfg.model.resolved(card)
    if qmatmul.available():         # the native kernel's families: needed when the model runs on it
        found += native_families(native_types(card), needed=opts.kernel == "native")
        found += native_attention_families(card["config"], needed=opts.kernel == "native", pools=opts.pool_dtype)
    ops = [{"family": f.name, "shapes": f.shapes, "varied": f.varied, "differs_at": list(f.differs_at),
            "max_abs": f.max_abs, "needed": f.needed, "holds": f.holds} for f in found]
    return DoctorReport({"platform": facts(), "model": str(model_dir), "threads": threads,
                         "accuracy_level": accuracy_level, "kernel": opts.kernel, "operators": ops,
                         "passes": passes,
                         "exact": passes["chain"]["invariant"] and passes["tree"]["invariant"] and
                         all(op["holds"] for op in ops)})

"""Constant memory (docs/design.md): after warm-up, the hot loop allocates nothing that survives a step, measured as
bytes still allocated per 1,000 tokens against the soak's budget of 1 KiB per 1,000 tokens, allocation site by site.

tracemalloc sees every Python-level allocation (numpy buffers included). The loop runs a few thousand tokens of
stream prefill, speculative generation and scratch rollback while a small ring wraps many times, then three equal
phases with a snapshot after each. A site's growth is the smaller of what it gained over the second phase and over the
third: a leak gains in every phase, while an object that was in flight between the actor threads at one snapshot
gains once. Each site's growth counts on its own: a shrink elsewhere (a free-listed object reused from another call
path) cancels nothing.

The loop is the actor pipeline's, with its two model actors run as threads of this process so that their allocations
are seen: the step and the deferred engine (the cache owner's side), the channels and the message codec between them,
the target actor with its local verifier and runner, the draft actor with its proposer. (The serial engine differs
only by calling the verifier and proposer in place: pipeline/decode/engine.py.)
"""
from __future__ import annotations

import gc
import re
import tracemalloc
from pathlib import Path

import pytest

from pipeline.stream.records import read_log, render
from tests.paths import ROOT

HOT = ("pipeline/decode/", "kernels/", "models/runner.py", "pipeline/channel.py", "pipeline/messages.py", "actors/")
BUDGET = 1024           # bytes per 1,000 tokens: the soak's goal (bench/soak.py)
WARM = 13               # warm-up chunks of 200 tokens: every buffer, block shape and wrap is seen by then


def site_growth(engine, tok, phases: int = 3) -> tuple[list, list, int]:
    """Run the loop (warm-up, then `phases` equal phases) on `engine`: (our growing sites, ONNX Runtime's binding
    sites, tokens of the last phase)."""
    from kernels.sampling import SamplingParams

    ids = tok.encode(render(read_log(ROOT / "data" / "tep_demo.csv")))
    ask = tok.encode("\nSummarise the alarms above:")
    params = SamplingParams()

    def cycle(chunk):
        engine.feed(chunk)
        mark = engine.mark()
        engine.generate(ask, 40, params)
        engine.rollback(mark)

    chunks = [ids[i:i + 200] for i in range(0, len(ids) - 200, 200)]
    for chunk in chunks[:WARM]:                      # warm-up: buffers, caches, wraps, every block shape
        cycle(chunk)
    chunks = chunks[:13]
    gc.collect()
    tracemalloc.start(1)                             # one frame: sites are grouped by line
    snapshots, tokens = [], 0
    try:
        for _ in range(phases):                      # equal phases: what a step leaves behind grows between them
            tokens = 0
            for chunk in chunks:
                cycle(chunk)
                tokens += len(chunk) + len(ask) + 40
            gc.collect()
            snapshots.append(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    # a site grows if it grew over each of the last two phases, by the smaller of the two: a leak grows every phase,
    # while an object that happened to be in flight between the actor threads at one snapshot (a message, a proposal
    # being drafted ahead) shows once and is gone or unchanged at the next
    earlier = {s.traceback: s.size_diff for s in snapshots[-2].compare_to(snapshots[-3], "lineno")}
    grown = [tracemalloc.StatisticDiff(s.traceback, s.size, growth, s.count, s.count_diff)
             for s in snapshots[-1].compare_to(snapshots[-2], "lineno")
             if (growth := min(s.size_diff, earlier.get(s.traceback, 0))) > 0 and "tracemalloc" not in str(s)]
    ort = [s for s in grown if "onnxruntime" in s.traceback[-1].filename or
           any(f"runner.py:{line}" in str(s.traceback[-1]) for line in _BIND_LINES)]
    ours = [s for s in grown if any(h in s.traceback[-1].filename for h in HOT) and s not in ort]
    return ours, ort, tokens


def assert_constant(ours: list, ort: list, tokens: int) -> None:
    per_1000 = 1000 / tokens
    report = "\n".join(str(s) for s in sorted(ours + ort, key=lambda s: -s.size_diff)[:8])
    print(f"growth per 1,000 tokens: ours {sum(s.size_diff for s in ours) * per_1000:.0f} B, "
          f"ONNX Runtime's {sum(s.size_diff for s in ort) * per_1000:.0f} B")
    assert tokens >= 3000
    assert sum(s.size_diff for s in ours) * per_1000 < BUDGET / 4, report
    # ONNX Runtime 1.32's Python bindings keep a thinning trickle of small objects per new binding shape: 0.9 to 1.2
    # KiB per 1,000 tokens in this loop (runner.py's bind lines and the bindings' own). Bounded loosely here; the
    # soak's budget holds for it only over a longer run, where it thins out (README: 0.147 KiB per 1,000 tokens for
    # all processes over a million tokens, `python run.py soak`)
    assert sum(s.size_diff for s in ort) * per_1000 < 4 * BUDGET, report


@pytest.fixture(scope="module")
def actor_pipeline():
    from bench.pipelined import ModelActors
    from pipeline import config

    actors = ModelActors(config.override(config.parse({}), {"cache.window": 256, "cache.slack": 160,
                                                              "draft.kind": "suffix", "draft.length": 6}),
                         threads=True)
    yield actors
    actors.close()


def test_the_actor_pipelines_hot_loop_allocates_nothing_that_survives_a_step(actor_pipeline, default_gguf):
    from models.tokenizer import Tokenizer

    ours, ort, tokens = site_growth(actor_pipeline.engine, Tokenizer.from_gguf(default_gguf))
    files = {s.traceback[-1].filename.split("/main/")[-1] for s in ours}
    print(f"\ngrowing sites: {sorted(files)}")
    assert actor_pipeline.engine.index.n > 4 * actor_pipeline.spec.ring
    assert_constant(ours, ort, tokens)


def _bind_lines() -> tuple[int, ...]:
    """Every line of models/runner.py that hands a buffer to an ONNX Runtime binding (`_bind_in`, `_bind_out`,
    `bind_sinks`, `bind_stream`): what the bindings keep per new shape is ONNX Runtime's, not ours."""
    from models import runner
    lines = Path(runner.__file__).read_text().splitlines()
    return tuple(n for n, text in enumerate(lines, 1) if re.search(r"\.bind_(input|output)\(", text))


_BIND_LINES = _bind_lines()

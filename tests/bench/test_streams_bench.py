"""`bench --task streams` (bench/streams.py): the lockstep that stands in for the target actor's inbox runs a pass
only once every running stream has one waiting, packs it within 64 rows, and hands each stream its own result; the
CLI rejects stream counts it cannot run."""
from __future__ import annotations

import threading

import numpy as np

from bench.streams import Lockstep, StreamsReport, run_streams_bench
from models.streams import Rows
from pipeline import config


def rows(n: int) -> Rows:
    return Rows(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros((n, 1), np.float32))


def test_a_pass_waits_for_every_running_stream_packs_within_the_rows_and_answers_each_its_own():
    sizes = {0: [32, 7, 7, 1], 1: [32, 7, 1], 2: [20, 20, 7, 7, 7]}      # stream -> its passes' rows
    passes = []

    def run(parts):
        passes.append([None if p is None else len(p.tokens) for p in parts])
        return [None if p is None else np.full(1, 100 * i + len(p.tokens)) for i, p in enumerate(parts)]

    lock, got = Lockstep(run, 3, slots=3), {i: [] for i in sizes}

    def stream(i):
        for n in sizes[i]:
            got[i].append(int(lock.forward(i, rows(n))[0]))
        lock.leave()

    threads = [threading.Thread(target=stream, args=(i,)) for i in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got == {i: [100 * i + n for n in sizes[i]] for i in sizes}       # each its own, in order
    for p in passes:                                                        # 64 rows, an idle stream as 2
        assert sum(max(n, 2) if n else 2 for n in (x or 0 for x in p)) <= 64
    assert passes[0] == [32, None, 20]          # 32 + 32 + 20 rows > 64: stream 1 waits ...
    assert passes[1][1] == 32                   # ... and goes first in the next pass (the first asked turns round)
    assert max(sum(x is not None for x in p) for p in passes) == 3          # all three shared a pass when they fit


def test_a_pass_of_a_two_slot_target_carries_two_streams_and_the_third_goes_next():
    passes = []

    def run(parts):
        passes.append([None if p is None else len(p.tokens) for p in parts])
        return [None if p is None else np.zeros(1) for p in parts]

    lock = Lockstep(run, 3, slots=2)
    threads = [threading.Thread(target=lambda i=i: (lock.forward(i, rows(4)), lock.forward(i, rows(4)),
                                                    lock.leave())) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert passes[0] == [4, 4, None] and max(sum(x is not None for x in p) for p in passes) == 2
    assert sum(x or 0 for p in passes for x in p) == 3 * 2 * 4              # every pass of every stream ran


def test_stream_counts_outside_what_a_pass_can_carry_are_refused_with_a_message():
    cfg = config.parse({})
    for bad in ("0,2", "33", "two"):
        report = run_streams_bench(cfg, bad, 16, 4, 1)
        assert report.exit_code == 2 and "--streams" in report.line


def test_through_the_actors_the_aggregate_counts_time_when_several_streams_decode_at_once_once():
    """Two streams decoding 100 tokens each over the same second: 200 tokens/s together, 100 each; a third second
    in which only one decodes adds its time once."""
    from bench.streams_actors import _figures

    def assessment(t: float, decode_s: float, tokens: int) -> dict:
        return {"t": t, "text": "x", "stats": {"decode_s": decode_s, "generated": tokens, "prefill_s": 0.5,
                                               "prompt_tokens": 50, "ttft_ms": 10.0}}
    together = _figures([[assessment(11.0, 1.0, 100)], [assessment(11.0, 1.0, 100)]])
    assert together["aggregate_tokens_per_s"] == 200.0
    assert [p["decode_tokens_per_s"] for p in together["per_stream"]] == [100.0, 100.0]
    apart = _figures([[assessment(11.0, 1.0, 100)], [assessment(11.5, 1.0, 100), assessment(13.0, 1.0, 100)]])
    assert apart["decoding_wall_s"] == 2.5 and apart["aggregate_tokens_per_s"] == 300 / 2.5


def test_the_peak_pss_is_split_by_process_name_at_the_peak_sample():
    import subprocess
    import sys

    from bench.streams_actors import _sample_pss
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(2)']); time.sleep(2)"])
    peak, by_process = _sample_pss([child.pid], lambda: child.poll() is not None)
    child.wait()
    assert peak > 1 << 20 and sum(by_process.values()) == peak
    assert by_process and all(v > 0 for v in by_process.values()), by_process


def test_the_target_only_report_prints_its_table_alone_and_fails_when_a_streams_tokens_differ():
    """`--target-only`: no actors' rows in the figures; the exit code still says whether the tokens were the same."""
    def target(n: int, identical: bool) -> dict:
        runs = {"decode_tokens_per_s": 10.0 * n, "prefill_tokens_per_s": 50.0}
        return {"batched": runs, "independent": runs, "identical": identical, "decode_vs_one_stream": float(n),
                "memory_per_added_stream_bytes": 2**20, "kv_pool_bytes_per_stream": 2**20,
                "single_stream_graph_bytes": 0.0}

    same = StreamsReport({1: {"target_only": target(1, True)}, 4: {"target_only": target(4, True)}})
    assert not same.through_actors and "through the actors" not in same.text()
    assert "target only" in same.text() and same.exit_code == 0
    assert StreamsReport({1: {"target_only": target(1, True)}, 4: {"target_only": target(4, False)}}).exit_code == 3

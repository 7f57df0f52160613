"""The recent section a pass reads beside its new rows (models/runner.py `_recent_kv`): the K/V of the given pool
slots, in the order given, whether they lie in the sinks, in the ring, across the sinks' end or across the ring's
wrap; checked against numpy's fancy indexing of the pools laid end to end."""
from __future__ import annotations

import numpy as np
import pytest

from kernels.ring import RingSpec
from models.runner import Runner, RunnerOptions
from tests.tiny_gguf import converted_tiny

SPEC = RingSpec(sink=4, window=32, ring=48)


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Runner:
    tiny = converted_tiny(tmp_path_factory.mktemp("recent"), weight_type="Q4_1", tied=False, seed=5)
    r = Runner(tiny, SPEC, RunnerOptions(threads=1), session=False)
    rng = np.random.default_rng(3)
    for pool in (r.sink_k, r.sink_v, r.ring_k, r.ring_v):
        pool[:] = rng.standard_normal(pool.shape)
    return r


@pytest.mark.parametrize("slots", [[5, 6, 7], [1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 50, 51, 4, 5], [49, 50, 51, 4, 5],
                                   [2], [4 + 47], list(range(4 + 10, 4 + 48)) + list(range(4, 4 + 26))])
def test_the_recent_section_is_the_slots_kv_in_order_across_the_sinks_end_and_the_rings_wrap(runner, slots):
    R = SPEC.ring
    k, v = runner._recent_kv(np.array(slots), Runner.recent_buffer(runner.cfg, runner.opts))
    L, KVH, D = runner.cfg["n_layers"], runner.cfg["n_kv_heads"], runner.cfg["head_dim"]
    for got, sink, ring in ((k, runner.sink_k, runner.ring_k), (v, runner.sink_v, runner.ring_v)):
        pools = np.concatenate([sink, ring[:, :R]], axis=1)                    # [L, S + R, KVH, D]
        want = pools[:, slots].transpose(0, 2, 1, 3).reshape(L * KVH, len(slots), D)
        assert np.array_equal(got, want)

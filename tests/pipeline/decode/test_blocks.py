"""A verify block's plan keeps the sink positions apart: rows past the sinks read them from the sink pool, never in
their section (pipeline/decode/blocks.py; the reference comparison is test_verify_reference.py's small window)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.decode.blocks import ALIGNED_BLOCK, plan_block
from pipeline.decode.drafts import Proposal


@given(n=st.integers(0, 200), k=st.integers(0, 40), sink=st.integers(0, 40))
def test_a_block_stays_in_its_aligned_block_and_its_section_holds_no_sink_unless_its_rows_are_sinks(n, k, sink):
    blk = plan_block(n, 7, Proposal.chain(np.arange(k)), ALIGNED_BLOCK, sink, ring=64)
    section = np.concatenate([blk.recent, blk.pos])
    assert len(set(blk.pos // ALIGNED_BLOCK)) == 1 and blk.pos[0] == n
    assert (section < sink).all() or (section >= sink).all()
    assert len(blk.recent) == 0 or blk.recent[0] // ALIGNED_BLOCK == n // ALIGNED_BLOCK
    assert list(blk.recent) == list(range(int(blk.recent[0]) if len(blk.recent) else n, n))
    # as deep as allowed: to the aligned block's end, or the sinks' end
    assert len(blk.pos) == 1 + min(k, (min(sink, n - n % ALIGNED_BLOCK + ALIGNED_BLOCK) if n < sink else
                                       n - n % ALIGNED_BLOCK + ALIGNED_BLOCK) - 1 - n)

"""A verify block's plan keeps the sink positions apart when the window is smaller than a block: a row past S+W-1
reads the sinks from the sink pool, never in its section (pipeline/decode/blocks.py; the reference comparison is
test_verify_reference.py's small window)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.decode.blocks import ALIGNED_BLOCK, plan_block
from pipeline.decode.drafts.base import Proposed


@given(n=st.integers(0, 200), k=st.integers(0, 40), sink=st.integers(0, 40), window=st.integers(1, 64))
def test_a_block_stays_in_its_aligned_block_and_no_row_past_the_window_edge_sees_a_sink_in_its_section(n, k, sink,
                                                                                                        window):
    blk = plan_block(n, 7, Proposed.chain(np.arange(k)), ALIGNED_BLOCK, sink, ring=64, window=window)
    section = np.concatenate([blk.recent, blk.pos])
    start = n - n % ALIGNED_BLOCK
    assert len(set(blk.pos // ALIGNED_BLOCK)) == 1 and blk.pos[0] == n
    assert section.min() >= sink or section.max() <= sink + window - 1
    assert list(blk.recent) == list(range(int(blk.recent[0]) if len(blk.recent) else n, n))
    # the section starts where the aligned block does, unless the sinks must stay apart (then just past them)
    apart = start < sink and start + ALIGNED_BLOCK > sink + window
    first = blk.recent[0] if len(blk.recent) else n
    assert first == (sink if apart and n >= sink else start) or (len(blk.recent) == 0 and n == first)
    # as deep as allowed: to the aligned block's end, or the sinks' end when they must stay apart
    end = min(sink - 1, start + ALIGNED_BLOCK - 1) if n < sink and apart else start + ALIGNED_BLOCK - 1
    assert len(blk.pos) == 1 + min(k, end - n)

"""Token trees are verified bit for bit (docs/design.md, "Greedy identity"), and the tree proposer's branches are what
it says they are.

A tree row must be computed exactly as the chain through its root path computes that row, and a chain row exactly as
token-by-token decoding does. The tree graph (`models.graph`, tree=True) lays each row's section out along its root
path; here every row of several trees, through the tree graph, is compared bit for bit with the chain pass of its
path through the chain graph (fed the same prompt separately: the prefills must agree too). The old layout, a
shared section in which a sibling's own column sits after its masked cousins, is shown to differ on the same
fixture: the comparison has teeth. Tiny random-weight model; the real model is in
tests/pipeline/decode/test_engine_real.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernels.ring import RingSpec, slot_of
from kernels.sampling import SamplingParams
from kernels.suffix_index import SuffixIndex
from models.convert import convert
from models.runner import Runner, RunnerOptions
from models.tokenizer import Tokenizer
from pipeline.decode.blocks import plan_block, root_paths, verify_mask
from pipeline.decode.drafts import Proposed, SuffixDraft, TreeDraft
from pipeline.decode.engine import Engine, Stats
from tests.tiny_gguf import write_tiny_gguf

SPEC = RingSpec(sink=4, window=24, ring=48)
TREES = {
    "siblings of the first node": [-1, 0, 1, -1, 3, -1],
    "three roots": [-1, -1, -1],
    "branching twice": [-1, 0, 0, 1, 2, 4, -1],
    "deep branch": [-1, 0, 1, 2, 1, 4, 5],
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(tree-graph engine, chain-graph engine) over the same weights, each fed the same prompt, a token pending."""
    root = tmp_path_factory.mktemp("trees")
    write_tiny_gguf(root / "m.gguf", seed=5, tied=False)
    convert(root / "m.gguf", root / "m", progress=False)
    tok = Tokenizer.from_gguf(root / "m.gguf")
    prompt = tok.encode("valve 3 open; pump 7 ok; valve 3 open; alarm 9")
    out = []
    for trees in (True, False):
        engine = Engine(Runner(root / "m", SPEC, RunnerOptions(threads=1, max_rows=16, trees=trees)), tok)
        engine.feed(prompt)
        engine.pending = 7
        out.append(engine)
    return out


def verify_pass(engine: Engine, prop: Proposed, shared_section: bool = False):
    """(logits of every row, new K, the block) of one verify pass, committing nothing. shared_section: the old
    layout (every row's section [recent | all new rows], ancestry by mask) through the chain graph."""
    blk = plan_block(engine.index.n, engine.pending, prop, engine.block, SPEC.sink, SPEC.ring, SPEC.window)
    recent = slot_of(blk.recent, SPEC.sink, SPEC.ring)
    if shared_section:
        mask = engine.index.visible_mask(blk.pos, blk.anc, out=engine.runner.mask_buffer(),
                                         recent_from=int(blk.pos[0]) - len(blk.recent))
        logits = engine.runner.forward(blk.tokens, blk.pos, mask, recent_slots=recent)
    else:
        mask = verify_mask(engine.index, blk, engine.runner.mask_buffer())
        logits = engine.runner.forward(blk.tokens, blk.pos, mask, recent_slots=recent, path=blk.path)
    return logits.copy(), engine.runner.new_k.copy(), blk


def chain_rows(chain_engine: Engine, tokens: np.ndarray, blk) -> tuple[np.ndarray, np.ndarray]:
    """Each tree row recomputed as the row at its depth of the chain pass over its root path."""
    logits, keys = [], []
    for r in range(len(blk.tokens)):
        depth = int(blk.pos[r] - blk.pos[0])
        path = blk.path[r, 1:depth + 1] - 1                  # node indices along the path (row 0: the pending token)
        chain_logits, chain_k, _ = verify_pass(chain_engine, Proposed.chain(tokens[path]))
        logits.append(chain_logits[depth])
        keys.append(chain_k[:, :, depth])
    return np.stack(logits), np.stack(keys, axis=2)


@pytest.mark.parametrize("name", sorted(TREES))
def test_every_tree_row_is_the_chain_row_of_its_path_bit_for_bit(engines, name):
    tree_engine, chain_engine = engines
    parent = np.array(TREES[name])
    tokens = np.random.default_rng(len(parent)).integers(0, tree_engine.runner.vocab, len(parent))
    logits, keys, blk = verify_pass(tree_engine, Proposed(tokens, parent))
    want_logits, want_keys = chain_rows(chain_engine, tokens, blk)
    assert np.array_equal(logits, want_logits), f"{name}: max difference {np.abs(logits - want_logits).max():.3g}"
    assert np.array_equal(keys, want_keys)


def test_a_shared_section_tree_is_not_exact(engines):
    """Power: the layout the tree graph replaces rounds some sibling rows differently on this very fixture."""
    _, chain_engine = engines
    differing = 0
    for parent in map(np.array, TREES.values()):
        tokens = np.random.default_rng(len(parent)).integers(0, chain_engine.runner.vocab, len(parent))
        logits, _, blk = verify_pass(chain_engine, Proposed(tokens, parent), shared_section=True)
        blk.path = root_paths(blk.anc, blk.pos - blk.pos[0])
        differing += int((logits != chain_rows(chain_engine, tokens, blk)[0]).any(axis=-1).sum())
    assert differing > 0


def test_a_chain_runner_refuses_a_tree(engines):
    _, chain_engine = engines
    with pytest.raises(ValueError, match="trees=True"):
        verify_pass(chain_engine, Proposed(np.array([1, 2]), np.array([-1, -1])))


def test_root_paths_list_ancestors_by_depth_then_pad_with_the_row():
    parent_rows = [-1, 0, 1, 0, 3]                  # rows: pending, a, a's child, b (a's sibling), b's child
    anc = np.zeros((5, 5), bool)
    depth = np.zeros(5, np.int64)
    for r, p in enumerate(parent_rows):
        if p >= 0:
            anc[r], depth[r] = anc[p], depth[p] + 1
        anc[r, r] = True
    assert root_paths(anc, depth).tolist() == [[0, 0, 0], [0, 1, 1], [0, 1, 2], [0, 3, 3], [0, 3, 4]]


# -- the stream's branches and the domain prior -------------------------------------------------------------------

def test_branches_give_each_gram_lengths_continuation_once_per_first_token():
    index = SuffixIndex(capacity=64, grams=(4, 2))
    #            ... 5 6 7 8 -> 1 2       (a 4-gram match)       ... 9 7 8 -> 3 4      (only a 2-gram match, later)
    index.append([5, 6, 7, 8, 1, 2, 0, 9, 7, 8, 3, 4, 0, 5, 6, 7])
    found = index.branches([8], 2)
    assert [b.tolist() for b in found] == [[1, 2], [3, 4]]
    assert index.propose([8], 2).tolist() == [1, 2]            # the longest match is propose's
    index.append([8, 1, 2])                                     # now the 4-gram's latest match continues 1 2 too
    assert index.branches([5, 6, 7, 8], 2)[0].tolist() == [1, 2]


def test_nothing_pending_asks_what_followed_the_streams_own_end():
    """A draft running ahead guesses the token after a block it assumed whole (the path is then empty): the latest
    match of the stream's end is the end itself, with nothing after it; an earlier one is not recorded."""
    index = SuffixIndex(capacity=64, grams=(4, 2))
    index.append([5, 6, 7, 8, 1, 5, 6, 7, 8])
    assert index.branches([], 2) == [] and index.propose([], 1).tolist() == []
    assert SuffixDraft().guess([]) is None


def test_followers_are_the_most_frequent_next_tokens():
    index = SuffixIndex(capacity=64, grams=(2,))
    index.append([1, 2, 1, 2, 1, 3, 1, 2, 1, 4])
    assert index.followers(1).tolist() == [2, 3, 4]
    index.append([1, 5, 1, 5, 1, 5, 1, 5, 1, 5])   # Misra-Gries: a newcomer with enough mass takes a counter
    assert index.followers(1)[0] == 5


def test_tree_draft_adds_distinct_siblings_under_the_depth_bound():
    stream = SuffixDraft()
    stream.observe([5, 6, 7, 8, 1, 2, 0, 9, 7, 8, 3, 4, 0, 8, 6, 0, 5, 6, 7])
    tree = TreeDraft(stream, stream, siblings=2, branch_len=2)
    prop = tree.propose(8, 4)
    assert prop.tokens[:2].tolist() == [1, 2] and prop.parent[:2].tolist() == [-1, 0]     # the trunk
    roots = prop.tokens[prop.parent == -1].tolist()
    assert roots == [1, 3, 6] and len(set(roots)) == len(roots)        # 3: the 2-gram; 6: 8's follower
    assert TreeDraft(stream, stream, siblings=2, branch_len=2).propose(8, 4, max_depth=1).tokens.tolist() == [1, 3, 6]
    assert TreeDraft(stream, stream, siblings=0).propose(8, 4).tokens.tolist() == [1, 2, 0, 9]


def test_sampled_trunks_get_point_mass_rows_for_their_stream_siblings():
    class Sampled(SuffixDraft):
        def propose(self, pending, k, max_depth=None, ahead=(), min_gram=1):
            return Proposed.chain([1], np.full((1, 10), 0.1))
    stream = SuffixDraft()
    stream.observe([8, 3, 0, 8, 1])
    prop = TreeDraft(Sampled(), stream, siblings=1).propose(8, 2)
    assert prop.tokens.tolist() == [1, 3, 0] and prop.q.shape == (3, 10)       # the sibling 3 and what followed it
    assert (prop.q[1:].argmax(axis=1) == [3, 0]).all() and (prop.q[1:].sum(axis=1) == 1.0).all()


def test_a_tree_wider_than_a_pass_keeps_its_first_nodes(engines):
    tree_engine, _ = engines
    stream = SuffixDraft()
    stream.observe([0, 8, 20, 21, 0, 8, 30, 31, 0, 8, *range(40, 55)])
    draft = TreeDraft(stream, stream, siblings=3)
    engine = Engine(tree_engine.runner, tree_engine.tok, draft, draft_len=15)     # 15 + 2 x 2 nodes > 15 rows
    engine.feed([5, 0])
    engine.pending = 8
    assert len(draft.propose(8, 15).tokens) > 15
    engine.step(SamplingParams(), Stats())                                  # no "rows exceed max_rows"

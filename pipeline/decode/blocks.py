"""One speculative block as the serial engine and the actor pipeline both compute it: its plan and its verdict.

Owns the shape of a verify pass (rows, their positions and tree ancestry, the committed positions that travel as the
"recent" section, the slots committed rows go to) and the acceptance call. Never runs a model and never moves the
committed position: the step does (pipeline/decode/step.py), for both engines.

Aligned blocks (see `Engine`): positions are grouped in blocks of B; a row at u reads positions below u - u % B from
the pool and the rest as one "recent + new" section, and a verify block never crosses a block boundary. Small
windows add one boundary: the graph scores a sink from the sink pool with the sink query rotated at min(u, S+W-1)
(models/graph.py), but a sink in a row's section at its text distance u - s, the same only while u <= S+W-1. When an
aligned block holds sink positions and rows past S+W-1 (W smaller than a block), the sinks leave its sections: a
block whose pending token is a sink ends at the last sink (`room_of`) and a later row's recent section starts after
the sinks (`recent_start`); a feed's passes keep the same rule (kernels/ring.py `passes`). With W >= B nothing moves.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.accept import accept_tree, accept_tree_greedy
from kernels.ring import slot_of
from kernels.sampling import SamplingParams, target_probs
from pipeline.decode.drafts.base import Proposed
from pipeline.decode.rules import constrain_rows, row_states

ALIGNED_BLOCK = 32     # positions per aligned block (<= the runner's max_recent + 1)


def _sinks_apart(start: int, block: int, sink: int, window: int) -> bool:
    """Does the aligned block at `start` hold both sink positions and rows past S+W-1?"""
    return start < sink and start + block > sink + window


def room_of(n: int, block: int = ALIGNED_BLOCK, sink: int = 0, window: int = 0) -> int:
    """Deepest proposal a block whose pending token sits at position n can hold (0: verify the pending token alone):
    to the end of its aligned block, or of the sink positions when n is one and the sinks must stay apart."""
    start = n - n % block
    end = start + block - 1
    return (min(end, sink - 1) if n < sink and _sinks_apart(start, block, sink, window) else end) - n


def recent_start(n: int, block: int, sink: int, window: int) -> int:
    """First position of the recent section of a block whose pending token sits at n: its aligned block's start, or
    the first position past the sinks when the sinks must stay apart (a function of the aligned block alone)."""
    start = n - n % block
    return sink if n >= sink and _sinks_apart(start, block, sink, window) else start


def lap(u: int, sink: int, ring: int) -> int:
    """How many times the ring had wrapped when position u was written (-1 for sinks and before any)."""
    return max(u - sink, -1) // ring


def near_wrap(first: int, sink: int, ring: int, max_rows: int) -> bool:
    """Does a block starting at position `first` lie within one block after a wrap point, past the first lap?"""
    return first >= sink + ring and (first - sink) % ring <= max_rows


@dataclass
class Block:
    tokens: np.ndarray      # [N+1] the pending token, then the proposals
    parent: np.ndarray      # [N] the proposals' parents (-1 = the pending token)
    q: np.ndarray | None    # [N, V] or None (deterministic proposals)
    pos: np.ndarray         # [N+1] row positions: n + depth
    anc: np.ndarray         # [N+1, N+1] row r sees row c iff anc[r, c]
    recent: np.ndarray      # committed positions [start, n) read as the recent section
    slots: np.ndarray       # [depth+1] pool slots of positions n, n+1, ...: where accepted rows are stored
    path: np.ndarray | None = None    # a tree's [N+1, depth+1] root paths (row r: its ancestors, then r); None: a chain
    ring_from: int = 0      # the first ring slot of the pass's pool view (RingIndex.pool_view)

    @property
    def proposals(self) -> np.ndarray:
        return self.tokens[1:]


def plan_block(n: int, pending: int, prop: Proposed, block: int, sink: int, ring: int, window: int) -> Block:
    """The verify pass for `prop` after `pending` at position n, pruned to the aligned block's room."""
    prop = prune(prop, room_of(n, block, sink, window))
    N = len(prop.tokens)
    tokens = np.concatenate([[pending], prop.tokens]).astype(np.int64)
    parent_row = np.concatenate([[-1], prop.parent + 1]).astype(np.int64)      # row 0 is the pending token
    depth = np.zeros(N + 1, np.int64)
    anc = np.zeros((N + 1, N + 1), bool)
    for r in range(N + 1):
        p = parent_row[r]
        if p >= 0:
            depth[r] = depth[p] + 1
            anc[r] = anc[p]
        anc[r, r] = True
    pos = n + depth
    recent = np.arange(recent_start(n, block, sink, window), n, dtype=np.int64)
    slots = slot_of(n + np.arange(int(depth.max()) + 1, dtype=np.int64), sink, ring)
    chain = bool((parent_row == np.arange(N + 1) - 1).all())
    return Block(tokens, prop.parent, prop.q, pos, anc, recent, slots, None if chain else root_paths(anc, depth))


def trunk(parent: np.ndarray) -> int:
    """The length of a proposal's trunk: its leading nodes that form a chain from the pending token (a chain: all of
    them; a tree: the base draft's chain before its siblings). The draft runs ahead assuming the trunk is accepted."""
    chained = parent == np.arange(len(parent)) - 1
    return len(parent) if chained.all() else int(np.argmin(chained))


def root_paths(anc: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """path[r, j]: row r's ancestor at depth j for j <= depth[r], then r again (padding the verify pass masks)."""
    path = np.repeat(np.arange(len(depth), dtype=np.int64)[:, None], int(depth.max()) + 1, axis=1)
    for r in range(len(depth)):
        path[r, :depth[r] + 1] = np.flatnonzero(anc[r])          # topological order: ancestors by depth
    return path


def verify_mask(index, blk: Block, out: np.ndarray) -> np.ndarray:
    """The verify pass's mask: the chain's, or for a tree each row gets the mask of the chain row at its depth (its
    section is laid out along its root path, `models.graph`)."""
    recent_from = int(blk.pos[0]) - len(blk.recent)
    if blk.path is None:
        return index.visible_mask(blk.pos, blk.anc, out=out, recent_from=recent_from)
    depth = blk.pos - blk.pos[0]
    chain = index.visible_mask(blk.pos[0] + np.arange(blk.path.shape[1]), None, recent_from=recent_from)
    return np.take(chain, depth, axis=0, out=out.reshape(-1)[:len(depth) * chain.shape[1]].reshape(len(depth), -1))


def judge(logits: np.ndarray, blk: Block, params: SamplingParams, probs: np.ndarray,
          rng: np.random.Generator, rule=None, state: str | None = None) -> tuple[np.ndarray, int]:
    """(rows to commit: 0 then the accepted path's rows, next token) from the block's logits [N+1, V]. rule, state:
    the answer's rule (pipeline/decode/rules.py) and its state before the pending token; each row is judged against
    the constrained target, its forbidden tokens set to -inf in `logits` (in place) first."""
    if rule is not None and state is not None:
        constrain_rows(logits, rule, row_states(rule, state, blk.tokens, blk.parent))
    if params.greedy:
        path, nxt = accept_tree_greedy(logits[0], logits[1:], blk.proposals, blk.parent)
    else:
        p = target_probs(logits, params, out=probs[:len(blk.tokens)])
        path, nxt = accept_tree(p[0], p[1:], blk.proposals, blk.parent, blk.q, rng)
    return np.array([0] + [i + 1 for i in path], np.int64), int(nxt)


def prune(prop: Proposed, max_depth: int) -> Proposed:
    """Drop the nodes deeper than max_depth (depth 1 = a child of the pending token), keeping parents consistent."""
    depth = np.zeros(len(prop.tokens), np.int64)
    for i, p in enumerate(prop.parent):
        depth[i] = 1 if p < 0 else depth[p] + 1
    keep = depth <= max_depth
    return prop.keep(keep)

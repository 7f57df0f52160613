"""Exact speculative acceptance for chains and token trees (Leviathan et al. 2023; SpecInfer's multi-step rule).

Invariant (docs/design.md, "Lossless speculation"): the emitted tokens (the accepted proposals, then exactly one next
token, a correction or a bonus) are distributed exactly as tokens sampled one at a time from the target p, whatever the
proposals were. p rows come from `sampling.target_probs` (float64, each sums to 1). q is the distribution a proposal
was actually drawn from; q=None means deterministic proposals (a point mass at the proposal: the model-free stream
proposer, a greedy draft, top-k tree branches). A one-hot q row is the same thing as None.

Token tree: nodes 0..N-1 in topological order, `parent[i] < i`, -1 meaning a child of the root (the pending token,
already decided). `tokens[i]` is node i's token, `p_root` the target's distribution after the root, `p_nodes[i]` the
target's distribution after node i, `q[i]` the distribution node i's token was drawn from, given the siblings before
it. Siblings are tried in index order, each against the residual the earlier ones left. Siblings drawn i.i.d. from
one q (SpecInfer) must each carry that same q: for them this multi-step residual rule is exact. A deterministic
sibling set should hold distinct tokens (a repeated deterministic token is always rejected).

Every function consumes `rng` in the same order (one uniform per proposal tried, one draw for the next token), so a
chain and the same chain written as a tree give identical results for the same generator state.
"""
from __future__ import annotations

import numpy as np

from .sampling import sample


def _accepts(r: np.ndarray, x: int, q_row: np.ndarray | None, rng: np.random.Generator) -> bool:
    qx = 1.0 if q_row is None else q_row[x]
    return rng.random() * qx < r[x]  # accept x with prob min(1, r(x)/q(x)); point mass q: prob r(x)


def _residual(r: np.ndarray, x: int, q_row: np.ndarray | None) -> np.ndarray | None:
    """normalize(max(0, r - q)) after x was rejected; None when no mass is left."""
    if q_row is None:
        r = r.copy()
        r[x] = 0.0  # point mass: max(0, r - 1[x]) is r with r(x) = 0
    else:
        r = np.maximum(r - q_row, 0.0)
    total = r.sum()
    return r / total if total > 0.0 else None


def accept_chain(p: np.ndarray, proposals: np.ndarray, q: np.ndarray | None,
                 rng: np.random.Generator) -> tuple[int, int]:
    """Verify a chain of k proposals. p: [k+1, V], row i = target after i accepted proposals; q: [k, V] or None.

    Returns (a, next): a proposals accepted (the next token is not counted in a), then one token sampled from the
    residual at the first rejection, or the bonus token from p[k] when all k were accepted.
    """
    for i, x in enumerate(proposals):
        q_row = None if q is None else q[i]
        if _accepts(p[i], x, q_row, rng):
            continue
        r = _residual(p[i], x, q_row)  # first rejection: sample from normalize(max(0, p - q)) and stop
        return i, sample(p[i] if r is None else r, rng)  # a residual with no mass: sample from p
    return len(proposals), sample(p[len(proposals)], rng)  # all accepted: one bonus token from p at the next position


def accept_chain_greedy(logits: np.ndarray, proposals: np.ndarray) -> tuple[int, int]:
    """Greedy limit of accept_chain. logits: [k+1, V]. Accept x iff x == argmax; next = argmax where it stops."""
    best = logits.argmax(axis=-1)  # one pass over the k+1 rows; the only allocation is k+1 indices
    k = len(proposals)
    miss = np.flatnonzero(best[:k] != proposals)
    a = int(miss[0]) if miss.size else k
    return a, int(best[a])  # correction (or bonus) is argmax p


def accept_tree(p_root: np.ndarray, p_nodes: np.ndarray, tokens: np.ndarray, parent: np.ndarray,
                q: np.ndarray | None, rng: np.random.Generator) -> tuple[list[int], int]:
    """Verify a token tree (representation in the module docstring). p_root [V]; p_nodes, q [N, V]; tokens, parent [N].

    Returns (path, next): accepted node indices from the root down, then one token sampled from the residual left by
    the last node's rejected children, or the bonus token from p of the last node when it is a leaf.
    """
    parent = np.asarray(parent)
    path, node, p_here = [], -1, p_root
    while True:
        r = p_here
        for child in np.flatnonzero(parent == node):
            x, q_row = int(tokens[child]), None if q is None else q[child]
            if _accepts(r, x, q_row, rng):  # each sibling against the residual left by the ones before it
                break
            r = _residual(r, x, q_row)
            if r is None:
                return path, sample(p_here, rng)  # a residual with no mass: sample from p
        else:  # no child accepted (a leaf has none): the next token comes from what is left
            return path, sample(r, rng)
        path.append(int(child))
        node, p_here = child, p_nodes[child]


def accept_tree_greedy(logits_root: np.ndarray, logits_nodes: np.ndarray, tokens: np.ndarray,
                       parent: np.ndarray) -> tuple[list[int], int]:
    """Greedy limit of accept_tree: follow the (first) child whose token is the argmax, else stop with the argmax."""
    tokens, parent = np.asarray(tokens), np.asarray(parent)
    best = logits_nodes.argmax(axis=-1)
    path, node, want = [], -1, int(np.argmax(logits_root))
    while True:
        match = np.flatnonzero((parent == node) & (tokens == want))
        if not match.size:
            return path, want
        node = int(match[0])
        path.append(node)
        want = int(best[node])

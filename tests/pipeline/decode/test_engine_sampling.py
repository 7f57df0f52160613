"""Speculative sampling is lossless end to end (docs/design.md, "Lossless speculation"): real ONNX Runtime graphs, the
real engine loop, the real drafts.

tests/kernels/test_accept.py proves the acceptance kernels on Markov chains; here `Engine.generate` itself must emit
the target's own joint law of the first three tokens, whatever proposes them: no draft, the draft model, a fixed guessed
chain, a token tree. The exact law comes from the target alone, one prefix at a time (top_k=3: at most 27 cells).
Each statistical test has fixed seeds, so it is deterministic; it is calibrated as if the seeds were random: the
correct engine must pass a chi-square goodness-of-fit test at significance alpha = 1e-3, a deliberately broken
proposer must be rejected at p < 1e-6 (power stated beside RUNS).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from scipy.stats import chisquare

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams, sample, target_probs
from models.convert import convert
from models.runner import Runner, RunnerOptions
from models.tokenizer import Tokenizer
from pipeline.decode.drafts import ModelDraft, NoDraft, Proposed, SuffixDraft, TreeDraft
from pipeline.decode.engine import Engine, Stats
from tests.tiny_gguf import write_tiny_gguf

PARAMS = SamplingParams(temperature=1.0, top_k=3)
GREEDY = SamplingParams()
SPEC = RingSpec(sink=4, window=16, ring=32)     # ring >= window + max_rows; the greedy runs wrap it
OPTS = RunnerOptions(threads=1, max_rows=16)
TREE_OPTS = RunnerOptions(threads=1, max_rows=16, trees=True)
PROMPT_TEXT = "pump 7 ok"
GREEDY_TOKENS = 40
# Power. The law has 27 cells, the smallest 0.019 (expected count >= 22 at RUNS = 1200), df = 26, alpha = 1e-3 (the
# statistic's cut is 54.1). A bug moving the law by Cohen's w = 0.2 has noncentrality RUNS * w^2 = 48: power 0.91.
# Measured on this fixture by patching the engine's acceptance (8 seeds each): correction sampled from p instead of
# the residual, w = 0.51 (draft model, draft_len 1), 0.58 (draft_len 3), 0.45 (tree), 8/8 rejected; tree siblings
# tried against p instead of the residual, w = 0.45, 8/8; q rows shifted by one node, w = 1.1 on the tree (8/8) but
# only 0.16 on the draft-model chain (5/8). A run costs 2-6 ms: the engine loop, not the tiny model's pass, dominates.
RUNS = 1200


@dataclass
class Models:
    target: Runner
    draft: Runner
    tok: Tokenizer
    prompt: list[int]
    tree_target: Runner         # the target's tree graph (models.graph): what a token-tree proposer verifies on

    @property
    def vocab(self) -> int:
        return self.target.vocab

    def engine(self, draft=None, **kw) -> Engine:
        """An engine on the target, through the tree graph when the draft proposes token trees."""
        tree = getattr(draft, "name", "") == "tree"
        return Engine(self.tree_target if tree else self.target, self.tok, draft, **kw)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    root = tmp_path_factory.mktemp("engine_sampling")
    # An independently seeded random draft shares none of the target's top-3 tokens (total variation 1: it would never
    # be accepted, leaving acceptance untested). The draft is the target's weights under another RMSNorm epsilon,
    # which replaces about two of the three tokens each step (total variation about 0.6): a draft unlike the target
    # that is still right a third of the time. Untied heads keep the logits free of the tied-embedding echo, under
    # which a random model repeats its last token forever.
    write_tiny_gguf(root / "target.gguf", seed=11, tied=False)
    write_tiny_gguf(root / "draft.gguf", seed=11, tied=False, rms_eps=2.0)
    for name in ("target", "draft"):
        convert(root / f"{name}.gguf", root / name, progress=False)
    tok = Tokenizer.from_gguf(root / "target.gguf")
    return Models(Runner(root / "target", SPEC, OPTS), Runner(root / "draft", SPEC, OPTS), tok,
                  [int(t) for t in tok.encode(PROMPT_TEXT)], Runner(root / "target", SPEC, TREE_OPTS))


def logits_after(runner: Runner, tok: Tokenizer, prefix) -> np.ndarray:
    """The model's next-token logits after `prefix`, from a fresh engine (a clean ring over the same pools)."""
    return Engine(runner, tok).feed(prefix).astype(np.float64)


@dataclass
class Reference:
    law: dict[tuple[int, int, int], float]     # the target's exact joint of the first three generated tokens
    support: dict[tuple[int, ...], np.ndarray]  # generated prefix -> the target's top-3 after it

    def cells(self) -> list[tuple[int, int, int]]:
        return sorted(self.law)

    def tokens_at(self, depth: int) -> np.ndarray:
        """Every token that can be generated at this depth (0: the first token)."""
        return np.unique(np.concatenate([s for k, s in self.support.items() if len(k) == depth]))


def joint_law(models: Models, banned: dict[int, set[int]] | None = None) -> Reference:
    """The target's exact joint law of the first three tokens (top-3 at each), from its logits after each prefix; with
    `banned`, the constrained target's: the tokens banned at a depth set to -inf first."""
    law, support = {}, {}

    def probs(generated: tuple[int, ...]) -> np.ndarray:
        logits = logits_after(models.target, models.tok, models.prompt + list(generated))
        logits[sorted((banned or {}).get(len(generated), ()))] = -np.inf
        top = np.sort(logits)[::-1]
        # A block verify and a prefill round differently (~1e-6): keep the top-3 cut far from a tie.
        assert top[2] - top[3] > 1e-3, f"near tie at the top-k cut after {generated}"
        p = target_probs(logits, PARAMS)
        support[generated] = np.flatnonzero(p)
        return p

    p1 = probs(())
    for a in support[()]:
        p2 = probs((a,))
        for b in support[(a,)]:
            p3 = probs((a, b))
            for c in support[(a, b)]:
                law[int(a), int(b), int(c)] = p1[a] * p2[b] * p3[c]
    assert len(law) == 27 and abs(sum(law.values()) - 1.0) < 1e-9
    return Reference(law, support)


@pytest.fixture(scope="module")
def reference(models) -> Reference:
    return joint_law(models)


# ---- proposers written for the test ---------------------------------------------------------------------------------

class FixedChain:
    """A deterministic proposer: the same guessed chain every step (q=None: a point mass at each token)."""
    name = "fixed"

    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, np.int64)

    def observe(self, tokens) -> None: ...

    def rollback(self, position: int) -> None: ...

    def propose(self, pending: int, k: int, max_depth: int | None = None) -> Proposed:
        return Proposed.chain(self.tokens[:k])


class SiblingTree:
    """A token tree: `width` siblings drawn i.i.d. from q0, each carrying q0 as its row (SpecInfer), and under each
    one deterministic child guess[(pending, sibling)] (a one-hot row). `claim`, when given, replaces the siblings'
    rows: a proposer that says its tokens came from a law they did not come from."""
    name = "tree"

    def __init__(self, q0: np.ndarray, guess: dict, fallback: int, width: int, seed: int, claim=None):
        self.q0, self.guess, self.fallback, self.width = q0, guess, fallback, width
        self.claim = q0 if claim is None else claim
        self.rng = np.random.default_rng(seed)

    def observe(self, tokens) -> None: ...

    def rollback(self, position: int) -> None: ...

    def propose(self, pending: int, k: int, max_depth: int | None = None) -> Proposed:
        assert k >= 2 * self.width, "draft_len too small for the tree"
        w = self.width
        siblings = [sample(self.q0, self.rng) for _ in range(w)]
        children = [self.guess.get((int(pending), s), self.fallback) for s in siblings]
        q = np.zeros((2 * w, self.q0.size))
        q[:w] = self.claim
        q[np.arange(w, 2 * w), children] = 1.0
        return Proposed(np.array(siblings + children, np.int64), np.array([-1] * w + list(range(w)), np.int64), q)


class ScriptChain:
    """Proposes the known continuation (by position), every `every`-th position guessed wrong: long accepted runs,
    then a miss mid-chain."""
    name = "script"

    def __init__(self, script, every: int, vocab: int):
        self.script, self.every, self.vocab = list(script), every, vocab
        self.n = 0                                    # positions committed so far; the pending token sits at n

    def observe(self, tokens) -> None:
        self.n += np.asarray(tokens).size

    def rollback(self, position: int) -> None:
        self.n = position

    def propose(self, pending: int, k: int, max_depth: int | None = None) -> Proposed:
        start = self.n + 1
        guess = [(t + 1) % self.vocab if (start + i) % self.every == 0 else t
                 for i, t in enumerate(self.script[start:start + k])]
        return Proposed.chain(guess)


def tree_for(ref: Reference, vocab: int, seed: int, claim=None) -> SiblingTree:
    """Siblings from a skewed q0 over every token the second position can take plus two impossible decoys; each child
    guesses the lowest-id token of the target's top-3 after (first, sibling), right about a third of the time."""
    second = ref.tokens_at(1)
    decoys = np.setdiff1d(np.arange(3, vocab), np.concatenate([ref.tokens_at(d) for d in range(3)]))[:2]
    q0 = np.zeros(vocab)
    q0[second] = 0.6 ** np.arange(second.size)
    q0[decoys] = 0.3
    q0 /= q0.sum()
    guess = {(int(k[0]), int(k[1])): int(s[0]) for k, s in ref.support.items() if len(k) == 2}
    return SiblingTree(q0, guess, int(decoys[0]), width=3, seed=seed, claim=claim)


# ---- sampling the engine --------------------------------------------------------------------------------------------

def sample_engine(models: Models, make_draft, draft_len: int, seed: int, runs: int = RUNS,
                  rule=None) -> tuple[Counter, Stats]:
    """Counts of the first three tokens over `runs` independent generations (fresh engine and draft each run)."""
    counts, total = Counter(), Stats()
    for child in np.random.SeedSequence(seed).spawn(runs):
        engine_seed, draft_seed = (int(s) for s in child.generate_state(2))
        engine = models.engine(make_draft(draft_seed), draft_len=draft_len, seed=engine_seed)
        result = engine.generate(models.prompt, 3, PARAMS, rule=rule)
        counts[tuple(result.token_ids)] += 1
        for name in ("verify_calls", "proposed", "accepted", "rejections"):
            setattr(total, name, getattr(total, name) + getattr(result.stats, name))
    return counts, total


def goodness_of_fit(counts: Counter, ref: Reference) -> float:
    outside = set(counts) - set(ref.law)
    assert not outside, f"generated sequences the target gives probability 0: {sorted(outside)[:5]}"
    cells = ref.cells()
    n = sum(counts.values())
    expected = np.array([ref.law[c] for c in cells])
    return chisquare([counts[c] for c in cells], expected / expected.sum() * n).pvalue


def assert_both_branches(stats: Stats) -> None:
    """The run exercised acceptance and rejection alike (else the test would not test the rule)."""
    assert 0 < stats.accepted < stats.proposed and stats.rejections > 0, stats


# ---- the engine samples the target's law, whatever proposes ---------------------------------------------------------

def test_engine_without_draft_samples_the_target_law(models, reference):
    counts, _ = sample_engine(models, lambda seed: NoDraft(), draft_len=4, seed=1)
    assert goodness_of_fit(counts, reference) > 1e-3


@pytest.mark.parametrize("draft_len", [1, 3])  # 1: the bonus token is the third; 3: a full chain per verify
def test_model_draft_sampling_is_lossless(models, reference, draft_len):
    p = target_probs(logits_after(models.target, models.tok, models.prompt), PARAMS)
    q = target_probs(logits_after(models.draft, models.tok, models.prompt), PARAMS)
    assert 0.5 * np.abs(p - q).sum() >= 0.3, "the draft is too close to the target to test the residual"
    counts, stats = sample_engine(models, lambda seed: ModelDraft(models.draft, PARAMS, seed=seed),
                                  draft_len=draft_len, seed=2 + draft_len)
    assert_both_branches(stats)
    assert goodness_of_fit(counts, reference) > 1e-3


def test_fixed_guessed_chain_is_lossless(models, reference):
    a, b, c = max(reference.law, key=reference.law.get)  # right only after the likeliest first token
    chain = [b, c, int(reference.support[(a, b)][-1])]
    counts, stats = sample_engine(models, lambda seed: FixedChain(chain), draft_len=3, seed=6)
    assert_both_branches(stats)
    assert goodness_of_fit(counts, reference) > 1e-3


def test_sibling_tree_is_lossless(models, reference):
    counts, stats = sample_engine(models, lambda seed: tree_for(reference, models.vocab, seed), draft_len=15, seed=7)
    assert_both_branches(stats)
    assert goodness_of_fit(counts, reference) > 1e-3


def test_proposer_lying_about_q_is_detected(models, reference):
    """Power check: siblings drawn from q0 but claiming the flat law over the vocabulary, so any sibling inside the
    support is always accepted. Every sequence stays possible; only the law moves, and the same test must see it."""
    flat = np.full(models.vocab, 1.0 / models.vocab)
    counts, _ = sample_engine(models, lambda seed: tree_for(reference, models.vocab, seed, claim=flat),
                              draft_len=15, seed=7)
    assert goodness_of_fit(counts, reference) < 1e-6


# ---- greedy: any proposer gives the target-only tokens --------------------------------------------------------------

@pytest.fixture(scope="module")
def greedy_reference(models) -> list[int]:
    out = Engine(models.target, models.tok).generate(models.prompt, GREEDY_TOKENS, GREEDY).token_ids
    assert len(models.prompt) + GREEDY_TOKENS > SPEC.sink + SPEC.ring, "the run should wrap the ring"
    return out


GREEDY_PROPOSERS = {
    "model": (lambda m, ref: ModelDraft(m.draft, GREEDY), 4),
    "suffix": (lambda m, ref: SuffixDraft(), 4),
    "fixed": (lambda m, ref: FixedChain(ref[3:6]), 3),
    "tree": (lambda m, ref: SiblingTree(np.bincount(ref, minlength=m.vocab) / len(ref),
                                        {(a, b): c for a, b, c in zip(ref, ref[1:], ref[2:])}, 0, 3, seed=0), 15),
    "script": (lambda m, ref: ScriptChain(m.prompt + ref, every=5, vocab=m.vocab), 8),
    "stream_tree": (lambda m, ref: _stream_tree(m.prompt + ref, m.vocab), 1),
}


def _stream_tree(text, vocab: int) -> TreeDraft:
    """The shipped tree proposer, its stream primed with the answer and then with a copy of it with every tenth token
    changed: one proposal per block, which follows the latest (wrong) copy where it differs, and a sibling (the
    pending token's most frequent follower: the answer's, counted first) salvages the block."""
    stream = SuffixDraft()
    wrong = np.array(text)
    wrong[9::10] = (wrong[9::10] + 1) % vocab
    stream.observe(np.concatenate([text, wrong]))
    return TreeDraft(stream, stream, siblings=2)


@pytest.mark.parametrize("proposer", sorted(GREEDY_PROPOSERS))
def test_greedy_output_equals_target_only_greedy(models, greedy_reference, proposer):
    make, draft_len = GREEDY_PROPOSERS[proposer]
    draft = make(models, greedy_reference)
    result = models.engine(draft, draft_len=draft_len).generate(models.prompt, GREEDY_TOKENS, GREEDY)
    out = result.token_ids
    # Bit for bit, not "up to near ties": every row of a block or tree is computed as decoding computes it.
    assert out == greedy_reference, f"{proposer}: first difference at token " \
        f"{next(i for i, (x, y) in enumerate(zip(out, greedy_reference)) if x != y)}"
    if proposer in ("model", "tree", "stream_tree", "script"):
        assert result.stats.accepted > 0, f"{proposer} never had a proposal accepted: {result.stats}"
    if proposer in ("tree", "stream_tree"):
        assert result.stats.salvaged > 0, f"{proposer}: no sibling was ever accepted: {result.stats}"


def test_reset_forgets_what_a_rollback_keeps(models):
    """rollback(0) leaves rolled-back text in the stream proposer's index (it may be proposed again); reset() is a new,
    unrelated text: the same prompt then drafts exactly as the first time (the bench's fresh context per prompt)."""
    engine = Engine(models.target, models.tok, SuffixDraft(), draft_len=4)

    def run():
        stats = engine.generate(models.prompt, GREEDY_TOKENS, GREEDY).stats
        return stats.proposed, stats.accepted

    first = run()
    engine.rollback(0)
    assert run() != first                       # the earlier answer is in the index
    engine.reset()
    assert run() == first



def test_a_stop_token_accepted_mid_block_ends_generation_at_that_verify(models, greedy_reference):
    """The stop token is the third proposal of a block that is accepted whole: generation ends after that one verify
    pass, its output cut after the stop token (an engine that looked only at a block's last token ran on to
    max_tokens, verifying blocks that were then thrown away)."""
    stop = greedy_reference[4]
    assert stop not in greedy_reference[:4], "pick a prompt whose greedy output does not repeat the stop token early"
    engine = models.engine(FixedChain(greedy_reference[1:7]), draft_len=6)
    result = engine.generate(models.prompt, GREEDY_TOKENS, GREEDY, stop_ids=[stop])
    assert result.token_ids == greedy_reference[:5]
    assert result.stats.verify_calls == 1
    assert engine.index.n == len(models.prompt) + 4        # the cache holds the output but its last token


# ---- under a rule: the constrained target's law, and its greedy output ----------------------------------------------

class BanByDepth:
    """A rule for these tests (pipeline/decode/rules.py's interface): at answer depth d the tokens banned[d] are
    forbidden. The state is one character per token written."""
    spec = {"kind": "ban-by-depth"}

    def __init__(self, vocab: int, banned: dict[int, set[int]]):
        self.vocab, self.banned = vocab, banned

    def advance(self, state: str, token: int) -> str:
        return state + "."

    def forbidden(self, state: str) -> np.ndarray | None:
        if not self.banned.get(len(state)):
            return None
        out = np.zeros(self.vocab, bool)
        out[sorted(self.banned[len(state)])] = True
        return out


@pytest.fixture(scope="module")
def ban(models, reference) -> BanByDepth:
    """Ban the likeliest first token, and at depths 1 and 2 the token most often in the target's top 3: the law moves,
    and proposals drawn from the unconstrained law are often banned."""
    common = {d: int(np.bincount(np.concatenate([s for k, s in reference.support.items() if len(k) == d])).argmax())
              for d in (1, 2)}
    first = max(reference.support[()], key=lambda t: sum(v for k, v in reference.law.items() if k[0] == t))
    return BanByDepth(models.vocab, {0: {int(first)}, 1: {common[1]}, 2: {common[2]}})


@pytest.mark.parametrize("proposer", ["none", "model", "tree"])
def test_sampling_under_a_rule_is_the_constrained_target_law(models, reference, ban, proposer):
    """The rule written down: with a rule, p is the sampling transform of the logits with the forbidden tokens at
    -inf, and speculation is judged against that p. A proposal drawn from the unconstrained law and banned is
    rejected; the residual, the bonus and the first token all come from the constrained p."""
    law = joint_law(models, ban.banned)
    assert set(law.law) != set(reference.law), "the rule should change the law"
    make = {"none": (lambda seed: NoDraft(), 4), "model": (lambda seed: ModelDraft(models.draft, PARAMS, seed=seed), 3),
            "tree": (lambda seed: tree_for(reference, models.vocab, seed), 15)}[proposer]
    counts, stats = sample_engine(models, make[0], draft_len=make[1], seed=11, rule=ban)
    if proposer != "none":
        assert_both_branches(stats)
    assert goodness_of_fit(counts, law) > 1e-3


@pytest.fixture(scope="module")
def greedy_ban(models, greedy_reference) -> BanByDepth:
    """Every fourth position bans the token the unconstrained target writes there."""
    return BanByDepth(models.vocab, {d: {greedy_reference[d]} for d in range(0, GREEDY_TOKENS, 4)})


@pytest.mark.parametrize("proposer", ["model", "fixed", "tree", "script"])
def test_greedy_output_under_a_rule_equals_constrained_target_only(models, greedy_reference, greedy_ban, proposer):
    """The proposers guess the unconstrained answer (the script chain proposes it outright): every banned guess must
    be rejected and corrected to the constrained target's argmax, row by row of a block."""
    alone = Engine(models.target, models.tok).generate(models.prompt, GREEDY_TOKENS, GREEDY, rule=greedy_ban).token_ids
    assert alone != greedy_reference
    assert all(alone[d] not in ban for d, ban in greedy_ban.banned.items())
    make, draft_len = GREEDY_PROPOSERS[proposer]
    result = models.engine(make(models, greedy_reference), draft_len=draft_len).generate(
        models.prompt, GREEDY_TOKENS, GREEDY, rule=greedy_ban)
    assert result.token_ids == alone, f"{proposer}: first difference at token " \
        f"{next(i for i, (x, y) in enumerate(zip(result.token_ids, alone)) if x != y)}"
    assert result.stats.accepted > 0 and result.stats.rejections > 0, result.stats

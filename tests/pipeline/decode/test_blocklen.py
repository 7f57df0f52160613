"""Block length: the online choice of proposals per verify, blocks cut at line ends, and both inside the serial engine
(greedy output stays the target's own)."""
from __future__ import annotations

import numpy as np
import pytest

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.convert import convert
from models.runner import Runner, RunnerOptions
from models.tokenizer import Tokenizer
from pipeline import config
from pipeline.config import ConfigError
from pipeline.decode.blocklen import LengthControl, cut_at_line_end, line_end_ids
from pipeline.decode.drafts import Proposed, SuffixDraft
from pipeline.decode.engine import Engine
from tests.pipeline.decode.test_engine_sampling import ScriptChain
from tests.tiny_gguf import write_tiny_gguf

PASS_S, ROW_S = 0.0132, 0.0025        # docs/speed.md: one row, and each extra row


def run_verifies(control: LengthControl, steps: int, accept: bool, k_max: int = 8, row_s: float = ROW_S) -> list:
    """Verify `steps` chains of the length the control chooses, every proposal accepted (or the first rejected)."""
    chosen = []
    for _ in range(steps):
        k = control.choose(k_max)
        control.observe(k, k if accept else 0, PASS_S + row_s * k, 0.0)
        chosen.append(k)
    return chosen


# ---- LengthControl ---------------------------------------------------------------------------------------------------

def test_length_grows_long_when_every_proposal_is_accepted_and_rows_are_cheap():
    control = LengthControl(8)
    run_verifies(control, 50, accept=True)
    assert control.choose(8) >= 7


def test_length_is_at_most_one_when_nothing_is_accepted():
    control = LengthControl(8)
    chosen = run_verifies(control, 50, accept=False)
    assert max(chosen[10:]) <= 1 and control.choose(8) <= 1


def test_length_falls_when_acceptance_flips_to_nothing():
    control = LengthControl(8)
    high = run_verifies(control, 50, accept=True)[-1]
    low = run_verifies(control, 50, accept=False)[-1]
    assert high >= 7 and low <= 1


def test_a_length_abandoned_for_rejections_is_tried_again():
    """Counts decay at every verify: with the draft out of favour the first depth drifts back to its prior."""
    control = LengthControl(8)
    run_verifies(control, 50, accept=False)
    assert 1 in run_verifies(control, 30, accept=False)


def test_costlier_rows_choose_shorter_chains_at_the_same_acceptance():
    """Same verdicts (acceptance 0.8 at every depth), verify seconds measured at every row count: the fitted cost of
    a row, not the prior, sets the length (optimum 4 at c1/c0 = 0.23, 1 at c1/c0 = 2)."""
    def trained(c0: float, c1: float) -> LengthControl:
        control, rng = LengthControl(8, decay=0.99), np.random.default_rng(0)
        for t in range(600):
            proposed = 1 + t % 8                       # every row count, whatever the control would choose
            accepted = int(np.argmin(np.append(rng.random(proposed) < 0.8, False)))     # leading accepts
            control.observe(proposed, accepted, c0 + c1 * (proposed + 1), 0.0)
        return control

    cheap, costly = trained(PASS_S - ROW_S, ROW_S), trained(0.005, 0.010)
    assert costly.verify_cost() == pytest.approx((0.005, 0.010), rel=0.05)
    assert cheap.choose(8) >= 3 and costly.choose(8) <= 2


def test_constant_row_counts_keep_the_prior_cost_ratio():
    control = LengthControl(8)
    for _ in range(40):
        control.observe(6, 3, 0.030, 0.0)
    c0, c1 = control.verify_cost()
    assert c1 / c0 == pytest.approx(0.2, rel=1e-6) and c0 + 7 * c1 == pytest.approx(0.030)


def test_a_costly_draft_chooses_shorter_chains():
    free, slow = LengthControl(8), LengthControl(8)
    for control, draft_s in ((free, 0.0), (slow, 0.010)):
        for t in range(100):
            control.observe(6, 6 if t % 3 else 2, PASS_S + ROW_S * 6, draft_s * 6)
    assert slow.choose(8) < free.choose(8)


def test_with_prior_costs_the_length_follows_the_verdicts_alone_whatever_the_clock():
    """`draft.adaptive_costs = "prior"`: the same verdicts timed on an idle host and on a loaded one (every pass
    and proposal slowed by a random factor up to 50x) choose the same lengths; timed costs (the default) do not."""
    def choices(measured: bool, slowdown) -> list[int]:
        control, rng, out = LengthControl(8, measured=measured), np.random.default_rng(1), []
        for t in range(300):
            k = control.choose(8)
            out.append(k)
            accepted = int(np.argmin(np.append(rng.random(k) < 0.7, False)))
            control.observe(k, accepted, (PASS_S + ROW_S * (k + 1)) * slowdown(t), 0.001 * k * slowdown(t))
        return out

    loaded = np.random.default_rng(2).uniform(1.0, 50.0, 300)
    idle_prior, loaded_prior = choices(False, lambda t: 1.0), choices(False, lambda t: loaded[t])
    assert idle_prior == loaded_prior and max(idle_prior) >= 2
    assert choices(True, lambda t: 1.0) != choices(True, lambda t: loaded[t])


def test_proposals_the_draft_did_not_return_are_not_counted_as_rejections():
    """Asked for 8, the stream proposer found 2, both accepted: depth 3 was never tried, so it is not learnt as bad."""
    control = LengthControl(8)
    for _ in range(50):
        control.observe(2, 2, PASS_S + 2 * ROW_S, 0.0)
    a = control.acceptance()
    assert a[0] > 0.9 and a[2] > 0.9


# ---- blocks that end at line boundaries ------------------------------------------------------------------------------

NL = 7                                  # the newline-carrying token of these tests
ENDS = np.zeros(16, bool)
ENDS[[NL, 9]] = True


def rows_q(n: int) -> np.ndarray:
    """q whose row i is filled with i, to check rows travel with their nodes."""
    return np.repeat(np.arange(n, dtype=np.float64)[:, None], 16, axis=1)


def test_a_chain_ends_after_its_first_newline():
    cut = cut_at_line_end(Proposed.chain([3, 4, NL, 5, 9, 6], rows_q(6)), ENDS)
    assert cut.tokens.tolist() == [3, 4, NL] and cut.parent.tolist() == [-1, 0, 1]
    assert cut.q[:, 0].tolist() == [0, 1, 2]


def test_a_chain_starting_with_a_newline_keeps_only_it():
    cut = cut_at_line_end(Proposed.chain([NL, 3, 4]), ENDS)
    assert cut.tokens.tolist() == [NL] and cut.q is None


def test_a_chain_without_newline_is_left_alone():
    prop = Proposed.chain([3, 4, 5])
    assert cut_at_line_end(prop, ENDS) is prop


def test_a_tree_drops_exactly_the_nodes_below_a_newline():
    #   pending -> 3(0) -> 4(2) -> NL(4) -> 5(5)
    #           -> NL(1) -> 6(3) -> 8(6)
    tokens = [3, NL, 4, 6, NL, 5, 8]
    parent = [-1, -1, 0, 1, 2, 4, 3]
    cut = cut_at_line_end(Proposed(np.array(tokens), np.array(parent), rows_q(7)), ENDS)
    assert cut.tokens.tolist() == [3, NL, 4, NL]
    assert cut.parent.tolist() == [-1, -1, 0, 2]
    assert cut.q[:, 0].tolist() == [0, 1, 2, 4]


def test_line_end_ids_marks_every_token_whose_text_holds_a_newline():
    # byte-level alphabet: "Ċ" is the byte \n
    tok = Tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["a Ċ", "Ċ Ċ"],
                     "tokenizer.ggml.tokens": ["<|im_end|>", "a", "Ċ", "aĊ", "b", "ĊĊ"],
                     "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1]})
    assert line_end_ids(tok).tolist() == [False, False, True, True, False, True]
    assert line_end_ids(tok, vocab=8).tolist() == [False, False, True, True, False, True, False, False]


# ---- config ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("adaptive", 1), ("adaptive", "yes"), ("end_at_line", 0)])
def test_non_bool_draft_switches_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"draft.{key} must be bool, got {type(value).__name__}"):
        config.parse({"draft": {key: value}}, "p.toml")


def test_draft_switches_default_off_and_parse():
    assert not config.parse({}).draft.adaptive and not config.parse({}).draft.end_at_line
    cfg = config.parse({"draft": {"adaptive": True, "end_at_line": True, "length": 8, "siblings": 2},
                        "actors": {"launcher": "serial"}})
    assert cfg.draft.adaptive and cfg.draft.end_at_line and cfg.draft.length == 8 and cfg.draft.siblings == 2


@pytest.mark.parametrize("launcher", ["serial", "local", "ray"])
def test_trees_adaptive_length_and_line_end_blocks_run_under_every_launcher(launcher):
    cfg = config.parse({"draft": {"adaptive": True, "end_at_line": True, "siblings": 2},
                        "actors": {"launcher": launcher}})
    assert cfg.draft.adaptive and cfg.draft.end_at_line and cfg.draft.siblings == 2


def test_trees_need_a_stream_to_branch_from():
    with pytest.raises(config.ConfigError, match="siblings = 2 branches from the stream"):
        config.parse({"draft": {"kind": "model", "siblings": 2}, "actors": {"launcher": "serial"}})
    with pytest.raises(config.ConfigError, match="draft.siblings = -1; must be >= 0"):
        config.parse({"draft": {"siblings": -1}, "actors": {"launcher": "serial"}})


# ---- the serial engine -----------------------------------------------------------------------------------------------

GREEDY = SamplingParams()
PROMPT = "pump 7 ok\nvalve 3 shut\n" * 4
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocklen")
    write_tiny_gguf(root / "target.gguf", seed=11, tied=False)
    convert(root / "target.gguf", root / "target", progress=False)
    tok = Tokenizer.from_gguf(root / "target.gguf")
    runner = Runner(root / "target", RingSpec(sink=4, window=160, ring=176), RunnerOptions(threads=1, max_rows=16))
    prompt = [int(t) for t in tok.encode(PROMPT)]
    reference = Engine(runner, tok).generate(prompt, NEW_TOKENS, GREEDY).token_ids
    return runner, tok, prompt, reference


def line_ends_for(tok, runner, reference) -> np.ndarray:
    """The tokenizer's newline tokens, plus the reference's two most frequent tokens: the random model never writes
    a newline, and the cut must happen for the test to test it."""
    ends = line_end_ids(tok, runner.vocab)
    ends[np.bincount(reference).argsort()[-2:]] = True
    return ends


def drafts(prompt, reference, vocab):
    return {"suffix": SuffixDraft(), "script": ScriptChain(prompt + reference, every=5, vocab=vocab)}


class RecordingControl(LengthControl):
    """A LengthControl that keeps every verdict the engine reports."""

    def __init__(self, max_len: int):
        super().__init__(max_len)
        self.verdicts = []

    def observe(self, proposed: int, accepted: int, verify_s: float, draft_s: float) -> None:
        self.verdicts.append((proposed, accepted, verify_s, draft_s))
        super().observe(proposed, accepted, verify_s, draft_s)


@pytest.mark.parametrize("draft", ["suffix", "script"])
def test_greedy_output_with_online_length_and_line_ends_is_target_only(tiny, draft):
    runner, tok, prompt, reference = tiny
    control = RecordingControl(8)
    engine = Engine(runner, tok, drafts(prompt, reference, runner.vocab)[draft], draft_len=8,
                    length_control=control, line_ends=line_ends_for(tok, runner, reference))
    result = engine.generate(prompt, NEW_TOKENS, GREEDY)
    assert result.token_ids == reference
    stats, verdicts = result.stats, np.array(control.verdicts)
    if draft == "script":                       # it always has proposals, and the first length is the prior's (> 0)
        assert stats.proposed > 0 and stats.accepted > 0
    # every verify reported once, with what was verified (after the cut) and a measured target time
    assert len(verdicts) == stats.verify_calls
    assert verdicts[:, 0].sum() == stats.proposed and verdicts[:, 1].sum() == stats.accepted
    assert (verdicts[:, 2] > 0).all() and (verdicts[:, 3] >= 0).all()


def test_line_ends_shorten_the_blocks_the_engine_verifies(tiny):
    runner, tok, prompt, reference = tiny

    def proposed(line_ends):
        engine = Engine(runner, tok, ScriptChain(prompt + reference, every=5, vocab=runner.vocab), draft_len=8,
                        line_ends=line_ends)
        result = engine.generate(prompt, NEW_TOKENS, GREEDY)
        assert result.token_ids == reference
        return result.stats.proposed

    assert proposed(line_ends_for(tok, runner, reference)) < proposed(None)

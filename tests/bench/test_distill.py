"""A distilled draft: the GGUF it is written as computes the function it was trained as, its sub-vocabulary keeps
verification exact (target ids outside it have draft probability 0, the "other" id is never proposed), and the recipe
never trains on a held-out log. Tiny random-weight models: the fast tier."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from bench.distill import Recipe, choose_vocab, train, training_logs
from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.convert import convert
from models.draftnet import TARGET_IDS, DraftShape, export, snap_to_q8, vocab_map
from models.gguf import GGUFError
from models.runner import Runner, RunnerOptions
from models.tokenizer import Tokenizer
from pipeline.decode.drafts.model import ModelDraft, speaks
from pipeline.decode.engine import Engine
from tests.tiny_gguf import write_tiny_gguf

torch = pytest.importorskip("torch", reason="needs torch (the test extra)")

SPEC = RingSpec(sink=4, window=16, ring=32)        # the greedy run wraps it
OPTS = RunnerOptions(threads=1, max_rows=16)
SHAPE = DraftShape(vocab=48, d_model=128, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=256)
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    write_tiny_gguf(root / "target.gguf", seed=11, tied=False)
    convert(root / "target.gguf", root / "target", progress=False)
    tok = Tokenizer.from_gguf(root / "target.gguf")
    return root, Runner(root / "target", SPEC, OPTS), tok


@pytest.fixture(scope="module")
def greedy(target):
    """The target's greedy continuation of a prompt, and the prompt."""
    _, runner, tok = target
    prompt = [int(t) for t in tok.encode("pump 7 ok")]
    return prompt, Engine(runner, tok).generate(prompt, 60, GREEDY).token_ids


@pytest.fixture(scope="module")
def distilled(target, greedy):
    """A tiny draft trained on the target's own greedy output (the recipe's `train`), written and converted."""
    root, runner, tok = target
    prompt, out = greedy
    stream = np.asarray(prompt + out)
    target_ids = choose_vocab([stream], SHAPE.vocab)
    to_draft = vocab_map(target_ids, runner.vocab)
    conts = [{"log": "a", "task": "log", "ids": stream, "start": len(prompt)}]
    model, history = train(SHAPE, Recipe(seq=24, batch=8, steps=150, lr=1e-2), [stream], conts, to_draft)
    snap_to_q8(model)
    path = export(model, SHAPE, target_ids, root / "target.gguf", root / "draft.gguf")
    convert(path, root / "draft", progress=False)
    return model, target_ids, history, Runner(root / "draft", SPEC, OPTS)


def test_training_lowers_the_loss(distilled):
    history = distilled[2]
    assert history[-1]["loss"] < 0.5 * history[0]["loss"], history


def test_the_exported_draft_computes_the_trained_function(distilled, greedy):
    model, target_ids, _, runner = distilled
    ids = vocab_map(target_ids, 10_000)[np.asarray(greedy[0] + greedy[1][:6])]
    with torch.no_grad():
        want = model(torch.from_numpy(ids[None])).logits[0].numpy()
    pos = np.arange(len(ids), dtype=np.int64)          # the pools are empty: every pool column is masked
    mask = np.where(pos[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)
    mask = np.concatenate([np.full((len(ids), SPEC.sink + 32), -np.inf, np.float32), mask], axis=1)
    got = runner.forward(ids, pos, mask, logit_rows=np.arange(len(ids)))
    # The runner's int8 activations move a logit by up to 0.6% of the largest; unpermuted Q/K rows (a layout bug that
    # RoPE hides at position 0) move them by up to 32%.
    assert np.abs(got - want).max() < 0.015 * np.abs(want).max()


def test_a_distilled_draft_gives_target_only_greedy_tokens(target, distilled, greedy):
    _, runner, tok = target
    draft = ModelDraft(distilled[3], GREEDY)
    result = Engine(runner, tok, draft, draft_len=4).generate(greedy[0], len(greedy[1]), GREEDY)
    assert result.token_ids == greedy[1]
    assert 0 < result.stats.accepted < result.stats.proposed, result.stats      # both branches ran


def test_tokens_outside_the_sub_vocabulary_have_draft_probability_zero(target, distilled, greedy):
    _, runner, _ = target
    target_ids = distilled[1]
    draft = ModelDraft(distilled[3], SamplingParams(temperature=1.0), seed=3)
    assert speaks(distilled[3].card) == runner.vocab
    draft.observe(greedy[0][:-1])
    prop = draft.propose(greedy[0][-1], 4)
    inside = np.zeros(runner.vocab, bool)
    inside[target_ids[target_ids >= 0]] = True
    assert prop.q.shape == (4, runner.vocab)
    np.testing.assert_allclose(prop.q.sum(axis=1), 1.0, rtol=1e-6)
    assert prop.q[:, ~inside].max() == 0.0
    assert all(inside[t] for t in prop.tokens)
    assert np.isneginf(draft._last[~inside]).all()


def test_a_map_outside_the_tokenizer_is_refused(tmp_path, target, distilled):
    root = target[0]
    bad = distilled[1].copy()
    bad[5] = 1_000_000
    path = export(distilled[0], SHAPE, bad, root / "target.gguf", tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=TARGET_IDS):
        convert(path, tmp_path / "bad", progress=False)


def test_the_vocabulary_is_other_then_kept_then_most_frequent():
    ids = choose_vocab([np.array([5, 5, 5, 7, 7, 9]), np.array([7, 3])], 5, keep=[2])
    assert list(ids) == [-1, 2, 5, 7, 3] or list(ids) == [-1, 2, 7, 5, 3]
    assert list(choose_vocab([np.array([4, 4])], 4)) == [-1, 4, -1, -1]
    assert list(vocab_map(np.array([-1, 4, 2]), 6)) == [0, 0, 2, 0, 1, 0]


def test_held_out_logs_are_never_training_logs(tmp_path):
    (tmp_path / "a").mkdir()
    for name, text in (("one.csv", "x\n1\n"), ("two.csv", "x\n2\n"), ("three.csv", "x\n3\n")):
        (tmp_path / "a" / name).write_text(text)
    held = tmp_path / "bench.csv"
    shutil.copy(tmp_path / "a" / "two.csv", held)                 # the same bytes under another name
    logs = training_logs(tmp_path / "a", [held])
    assert sorted(p.rsplit("/", 1)[-1] for p in logs) == ["one.csv", "three.csv"]
    with pytest.raises(FileNotFoundError, match="no training logs"):
        training_logs(tmp_path / "a", [tmp_path / "a" / n for n in ("one.csv", "two.csv", "three.csv")])


def test_a_missing_bundled_draft_names_the_command_that_rebuilds_it(tmp_path, monkeypatch):
    from models import registry
    monkeypatch.setattr(registry, "DEFAULT_DRAFT", tmp_path / "gone.gguf")
    with pytest.raises(FileNotFoundError, match="python run.py distill --out"):
        registry.resolve_gguf("default-draft")


def test_a_doubting_draft_ends_its_chain_early(distilled, greedy):
    """min_confidence: the first token is always proposed; later ones only while the draft's top probability
    reaches the threshold (0 proposes all k)."""
    runner = distilled[3]
    lengths = {}
    for threshold in (0.0, 0.999999):
        draft = ModelDraft(runner, GREEDY, min_confidence=threshold)
        draft.observe(greedy[0][:-1])
        lengths[threshold] = len(draft.propose(greedy[0][-1], 6).tokens)
        draft.forget()
    assert lengths[0.0] == 6 and 1 <= lengths[0.999999] < 6, lengths

"""Every draft answers to the one interface the engines and the draft actor call (pipeline/decode/drafts/base.py
`Proposer`), optional-looking members included, so no caller has to probe a draft for what it has."""
from __future__ import annotations

import inspect

import pytest

from kernels.ring import RingSpec
from kernels.sampling import SamplingParams
from models.runner import Runner, RunnerOptions
from pipeline.decode import drafts
from pipeline.decode.drafts import HybridDraft, ModelDraft, NoDraft, Proposer, SuffixDraft, TreeDraft
from tests.tiny_gguf import converted_tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> ModelDraft:
    tiny = converted_tiny(tmp_path_factory.mktemp("drafts"), seed=5)
    runner = Runner(tiny, RingSpec(sink=4, window=32, ring=48), RunnerOptions(threads=1, max_rows=8))
    return ModelDraft(runner, SamplingParams())


def every_draft(model: ModelDraft) -> list:
    stream = SuffixDraft()
    hybrid = HybridDraft(stream, model)
    return [NoDraft(), stream, model, hybrid, TreeDraft(stream, stream), TreeDraft(hybrid, stream)]


def test_every_draft_class_is_a_proposer(model):
    defined = {cls for module in (drafts.none, drafts.suffix, drafts.model, drafts.hybrid, drafts.tree)
               for _, cls in inspect.getmembers(module, inspect.isclass) if cls.__module__ == module.__name__}
    built = every_draft(model)
    assert {type(d) for d in built} == defined                  # a new draft class must be listed above
    assert all(isinstance(d, Proposer) for d in built)
    assert not isinstance(object(), Proposer)


def test_a_draft_without_a_model_has_nothing_to_catch_up(model):
    stream = SuffixDraft()
    stream.observe([1, 2, 3, 1, 2])
    for draft in (NoDraft(), stream, TreeDraft(stream, stream)):
        assert draft.catch_up() is False


def test_a_tree_over_a_draft_model_catches_up_through_it(model):
    model.forget()
    stream = SuffixDraft()
    tree = TreeDraft(HybridDraft(stream, model), stream)
    tree.observe([1, 2, 3, 4, 5])
    assert tree.committed == 5 and tree.catch_up() is True and tree.catch_up() is False

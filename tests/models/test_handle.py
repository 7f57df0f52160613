"""A model handle (models/handle.py): one per name and file in a process, nothing read before a property asks, carried
to another process as its name, and never kept for a file that has since been replaced."""
from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

from models import handle, registry
from models.handle import Model
from pipeline import config
from tests.tiny_gguf import write_tiny_gguf


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGSPEC_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def test_one_handle_per_name_resolved_once_and_nothing_converted_before_a_property_asks(tiny, tmp_path, monkeypatch):
    resolved = []
    monkeypatch.setattr(handle, "resolve_gguf", lambda name: resolved.append(name) or registry.resolve_gguf(name))
    model = Model.of(str(tiny))
    assert Model.of(str(tiny)) is model and model.gguf == tiny and resolved == [str(tiny)]
    assert not (tmp_path / "home" / "converted").exists()
    assert model.config["n_layers"] == 2 and model.dir.parent == tmp_path / "home" / "converted"
    assert model.tokenizer is Model.of(str(tiny)).tokenizer


def test_a_profile_names_its_models_and_their_handles_are_the_same_ones(tiny):
    cfg = config.override(config.load(), {"model.gguf": str(tiny), "draft.model": str(tiny)})
    assert cfg.target is Model.of(str(tiny)) and cfg.draft_model is cfg.target


def _card_there(model: Model, out) -> None:
    out.put((model.name, str(model.gguf), model.config["d_model"]))


def test_a_handle_travels_to_another_process_as_its_name_and_is_resolved_there(tiny):
    model = Model.of(str(tiny))
    assert pickle.loads(pickle.dumps(model)) is model              # in this process: the same handle
    cloudpickle = pytest.importorskip("cloudpickle")               # Ray's actors' arguments go through it
    assert pickle.loads(cloudpickle.dumps(model)) is model         # (a bound classmethod it took by value, lock too)
    assert b"tokenizer" not in pickle.dumps(model) and len(pickle.dumps(model)) < 200 + len(str(tiny))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_card_there, args=(model, out))
    child.start()
    got = out.get(timeout=120)
    child.join(120)
    assert got == (str(tiny), str(tiny), 64)


def test_a_replaced_file_is_resolved_again(tiny):
    first = Model.of(str(tiny))
    assert first.config["d_model"] == 64
    write_tiny_gguf(tiny, d_model=32, n_heads=2, n_kv_heads=1)
    os.utime(tiny, ns=(1, 1))                                      # a replacement with an old time counts too
    second = Model.of(str(tiny))
    assert second is not first and second.config["d_model"] == 32

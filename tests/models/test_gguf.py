"""models/gguf.py's header walk: the same tensors and metadata as the `gguf` package's GGUFReader (the independent
reference), and every damaged header a GGUFError, never another exception or a read past the file."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.gguf import GGUFError, GGUFModel, read_header
from tests.tiny_gguf import WEIGHT_TYPES, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for weight_type in WEIGHT_TYPES:
        out[weight_type] = root / f"{weight_type}.gguf"
        write_tiny_gguf(out[weight_type], "qwen2", n_layers=1, tied=False, weight_type=weight_type, seed=3)
    return out


def header_end(path: Path) -> int:
    """The first tensor's data offset: everything before it is header (and alignment padding)."""
    return min(int(t.data_offset) for t in GGUFReader(path).tensors)


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_tensors_and_metadata_equal_gguf_readers(tiny, weight_type):
    path = tiny[weight_type]
    model, reader = GGUFModel(path), GGUFReader(path)
    assert sorted(model.tensors) == sorted(t.name for t in reader.tensors)
    for ref in reader.tensors:
        ours = model.tensor(ref.name)
        assert model.tensor_type(ref.name) == ref.tensor_type.name
        assert model.tensor_shape(ref.name) == tuple(int(d) for d in reversed(ref.shape.tolist()))
        assert (model.tensors[ref.name].offset, model.tensors[ref.name].nbytes) == (ref.data_offset, ref.n_bytes)
        assert ours.dtype == ref.data.dtype and ours.shape == ref.data.shape
        assert ours.tobytes() == np.asarray(ref.data).tobytes()
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):            # the reader's own entries for the magic, version and counts
            assert model.field(key) == field.contents(), key


def test_the_tokenizer_metadata_is_read_only_when_asked_for(tiny):
    path = tiny["F32"]
    model = GGUFModel(path)
    assert not any(key.startswith("tokenizer.") for key in model._meta)
    assert model.field("tokenizer.ggml.tokens") == GGUFReader(path).fields["tokenizer.ggml.tokens"].contents()
    assert model.field("tokenizer.no.such.key", "absent") == "absent"


def test_every_cut_of_the_header_is_a_gguf_error(tiny, tmp_path):
    data = tiny["Q4_K"].read_bytes()
    cut_path = tmp_path / "cut.gguf"
    cuts = sorted({*range(0, 64), *range(64, header_end(tiny["Q4_K"]) + 1, 97), header_end(tiny["Q4_K"])})
    for cut in cuts:
        cut_path.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated|not a GGUF|magic"):
            GGUFModel(cut_path)


def test_a_tensor_past_the_files_end_is_named(tiny, tmp_path):
    data = tiny["Q8_0"].read_bytes()
    path = tmp_path / "short.gguf"
    path.write_bytes(data[:len(data) - 1])
    with pytest.raises(GGUFError, match=r"truncated: tensor '.*' ends at byte"):
        GGUFModel(path)


def replace_count(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<Q", value) + data[at + 8:]


@pytest.mark.parametrize("what, at, value, message", [
    ("tensor count", 8, 2**63, "truncated or corrupt"),
    ("metadata count", 16, 2**40, "truncated or corrupt"),
    ("version", 4, 1, "version 1 is not supported"),
])
def test_a_huge_or_wrong_count_is_an_error_not_a_long_walk(tiny, tmp_path, what, at, value, message):
    data = tiny["F32"].read_bytes()
    data = data[:4] + struct.pack("<I", value) + data[8:] if what == "version" else replace_count(data, at, value)
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=message):
        read_header(path)


def test_a_big_endian_file_is_refused_by_its_version(tiny, tmp_path):
    data = tiny["F32"].read_bytes()
    path = tmp_path / "be.gguf"
    path.write_bytes(data[:4] + struct.pack(">I", 3) + data[8:])
    with pytest.raises(GGUFError, match="big-endian"):
        GGUFModel(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_junk_in_the_header_is_a_gguf_error_or_a_valid_read(tiny, tmp_path, data):
    """Bytes overwritten anywhere in the header: the walk either reads a header (junk in a value or a name) or
    raises GGUFError; never struct.error, MemoryError, RecursionError or a read past the file's end."""
    raw = bytearray(tiny["Q4_K"].read_bytes())
    end = header_end(tiny["Q4_K"])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(8, end - 1))
        junk = data.draw(st.binary(min_size=1, max_size=8))
        raw[at:at + len(junk)] = junk
    path = tmp_path / "junk.gguf"
    path.write_bytes(bytes(raw))
    try:
        model = GGUFModel(path)
    except GGUFError:
        return
    for name in model.tensors:
        t = model.tensors[name]
        assert t.offset + t.nbytes <= len(raw)

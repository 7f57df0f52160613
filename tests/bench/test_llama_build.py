"""The bench's own llama.cpp (bench/llama_build.py): options from a CPU's flags, the check's verdicts, the decision's
way to the workers. Nothing here builds llama.cpp or depends on this CPU: the CPUs are cpuinfo texts, llama_cpp a
stand-in package."""
import json
import subprocess
import sys
import textwrap

import pytest

from bench import llama_build

SAPPHIRE_RAPIDS = ("fpu vme de pse tsc msr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt avx f16c rdrand bmi1 avx2 bmi2 "
                   "avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 "
                   "avx512_vnni avx512_bitalg avx512_vpopcntdq avx_vnni amx_bf16 avx512_fp16 amx_tile amx_int8")
EPYC_AVX2 = ("fpu vme de pse tsc msr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt avx f16c rdrand bmi1 avx2 bmi2 "
             "sha_ni clzero")
RK3588 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"


def cpuinfo(flags: str, key: str = "flags") -> str:
    return f"processor\t: 0\nmodel name\t: some cpu\n{key}\t\t: {flags}\n\nprocessor\t: 1\n{key}\t\t: {flags}\n"


def options(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args)


def test_an_amx_host_gets_explicit_avx512_options_and_amx_off():
    got = options(llama_build.cmake_args(cpuinfo(SAPPHIRE_RAPIDS), "x86_64"))
    assert got["GGML_NATIVE"] == "OFF"                     # native would switch AMX on from the flags
    for on in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VBMI",
               "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"):
        assert got[on] == "ON", on
    assert got["GGML_AMX_TILE"] == got["GGML_AMX_INT8"] == got["GGML_AMX_BF16"] == "OFF"


def test_an_avx2_only_epyc_gets_no_avx512():
    got = options(llama_build.cmake_args(cpuinfo(EPYC_AVX2), "x86_64"))
    assert got["GGML_NATIVE"] == "OFF" and got["GGML_AVX2"] == got["GGML_FMA"] == got["GGML_F16C"] == "ON"
    assert all(got[k] == "OFF" for k in got if k.startswith(("GGML_AVX512", "GGML_AMX"))) and got["GGML_AVX_VNNI"] == "OFF"


def test_avx512_needs_every_subset_ggml_compiles_it_with():
    partial = SAPPHIRE_RAPIDS.replace(" avx512dq", "")      # -mavx512dq is in ggml's AVX-512 flags
    got = options(llama_build.cmake_args(cpuinfo(partial), "x86_64"))
    assert got["GGML_AVX512"] == got["GGML_AVX512_VNNI"] == "OFF" and got["GGML_AVX2"] == "ON"


def test_aarch64_builds_natively_with_no_x86_option():
    args = llama_build.cmake_args(cpuinfo(RK3588, "Features"), "aarch64")
    assert options(args)["GGML_NATIVE"] == "ON" and not any("AVX" in a or "AMX" in a for a in args)
    assert llama_build.cpu_flags(cpuinfo(RK3588, "Features")) >= {"asimddp", "asimd"}


def test_each_set_of_options_has_its_own_build_directory():
    amx, epyc = (llama_build.cmake_args(cpuinfo(f), "x86_64") for f in (SAPPHIRE_RAPIDS, EPYC_AVX2))
    assert llama_build.build_dir(amx) != llama_build.build_dir(epyc)
    assert llama_build.build_dir(amx).name.startswith(llama_build.VERSION)


def test_a_child_killed_by_sigill_is_a_broken_llama_cpp_with_the_reason():
    got = llama_build.run_probe([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    assert not got.ok and not got.missing
    assert "SIGILL" in got.reason and "instruction" in got.reason


def stand_in(tmp_path, generate: str):
    """A llama_cpp package whose Llama.generate runs `generate` (the check's child imports it from tmp_path)."""
    pkg = tmp_path / "llama_cpp"
    pkg.mkdir()
    for sub in ("llama_chat_format", "llama_speculative"):
        (pkg / f"{sub}.py").write_text("")
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        import os, signal
        __version__ = "9.9.9"
        class Llama:
            def __init__(self, **kw):
                pass
            def tokenize(self, text, add_bos=False):
                return list(text[:8])
            def generate(self, ids, **kw):
                {generate}
        """))
    return str(tmp_path)


def test_a_llama_cpp_dying_in_generation_is_reported_not_fatal(tmp_path):
    got = llama_build.check(stand_in(tmp_path, "os.kill(os.getpid(), signal.SIGSEGV)"), "model.gguf")
    assert not got.ok and "SIGSEGV" in got.reason and got.version == "9.9.9"


def test_a_llama_cpp_that_generates_is_ok(tmp_path):
    got = llama_build.check(stand_in(tmp_path, "yield from range(100)"), "model.gguf")
    assert got.ok and got.version == "9.9.9" and got.reason == ""


def test_an_import_error_is_missing_not_broken(tmp_path):
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text("raise ImportError('not here')")
    got = llama_build.check(str(tmp_path), "model.gguf")
    assert not got.ok and got.missing and "not installed" in got.reason


@pytest.fixture
def nothing_installed(tmp_path, monkeypatch):
    """An environment without llama_cpp, a cache in tmp_path, and no build may start."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(llama_build, "check", lambda path, gguf: (
        llama_build.Verdict(True, version="0.3.36") if path else
        llama_build.Verdict(False, "llama-cpp-python is not installed", missing=True)))

    def no_build(*_):
        raise AssertionError("a build started")
    monkeypatch.setattr(llama_build, "_build", no_build)
    return tmp_path


def test_without_a_compiler_llama_cpp_is_unavailable_with_the_reason(nothing_installed, monkeypatch):
    monkeypatch.setattr(llama_build.shutil, "which", lambda name: None)
    got = llama_build.ensure("model.gguf", build=True)
    assert got.source == "none" and "C++ compiler" in got.reason and "not installed" in got.reason


def test_a_check_only_run_never_builds_and_says_how_to(nothing_installed):
    got = llama_build.ensure("model.gguf", build=False)
    assert got.source == "none" and "python -m bench.llama_build --build" in got.reason


def test_a_cached_build_for_this_cpu_is_used_with_its_options(nothing_installed):
    home = llama_build.build_dir(llama_build.this_cpu())
    (home / "site").mkdir(parents=True)
    (home / "build.json").write_text(json.dumps({"seconds": 480.0}))
    got = llama_build.ensure("model.gguf", build=False)
    assert got.source == "built" and got.path == str(home / "site") and got.build_seconds == 480.0
    assert got.cmake_args == tuple(llama_build.this_cpu()) and "not installed" in got.installed


def test_the_decision_reaches_spawned_workers_without_a_second_check(monkeypatch):
    monkeypatch.delenv(llama_build.ENV, raising=False)
    build = llama_build.Build("built", "0.3.36", "/cache/site", ("-DGGML_AMX_TILE=OFF",), "not installed")
    llama_build.use(build)
    monkeypatch.setattr(llama_build, "ensure", lambda *a, **k: pytest.fail("checked again"))
    assert llama_build.chosen() == build
    child = subprocess.run([sys.executable, "-c", "from bench import llama_build as b; print(b.chosen().as_dict())"],
                           capture_output=True, text=True, cwd=llama_build.__file__.rsplit("/bench/", 1)[0])
    assert child.stdout.strip() == str(build.as_dict()), child.stderr
    monkeypatch.delenv(llama_build.ENV)

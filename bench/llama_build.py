"""A llama.cpp that runs on this CPU, for the bench: the installed one checked, or one built for this CPU.

Owns: the check that an importable llama-cpp-python generates here without dying (a few greedy tokens of a real GGUF
in a child process: a SIGILL or SIGSEGV there is a verdict with its reason, never a crash of the bench); the CMake
options derived from this CPU's /proc/cpuinfo flags; the build of llama-cpp-python==VERSION with them into
~/.cache/ringspec/llama-cpp/<version>-<python>-<hash of the options>/ (`pip install --target`, progress printed, a
clear reason when there is no compiler); and the decision for a process tree (`chosen`), kept as JSON in the
environment variable ENV so the bench's spawned workers import the same build without checking again.
`python -m bench.llama_build [--check|--build]` prints what it found or built.
Never: installs into the Python environment (the `bench` extra stays as it is), imports llama_cpp in its own
process, or decides which systems run (bench/speed.py leaves llama.cpp out with the reason given here).
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from models.handle import Model

VERSION = "0.3.36"                  # the `bench` extra's pin (pyproject.toml)
ENV = "RINGSPEC_LLAMA_CPP"          # the process tree's decision: a Build as JSON (set by `use`)
NO_BUILD = "RINGSPEC_LLAMA_CPP_BUILD"   # "0": never build (tests), only check what is there
PROBE_TOKENS = 4
PROBE_TIMEOUT = 300.0
# llama-cpp-python's own requirements (its pyproject.toml); installed beside the build only when this Python lacks them
RUNTIME_DEPS = {"typing_extensions": "typing-extensions>=4.5.0", "numpy": "numpy>=1.20.0",
                "diskcache": "diskcache>=5.6.1", "jinja2": "jinja2>=2.11.3"}

# (ggml's CMake option, the /proc/cpuinfo flags it needs): ggml-cpu/CMakeLists.txt compiles GGML_AVX512 with
# -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw, and the AVX-512 extensions only under it.
# With GGML_NATIVE=OFF the first six default to ON, so every option is written out, ON or OFF.
X86_OPTIONS = (("GGML_SSE42", ("sse4_2",)), ("GGML_AVX", ("avx",)), ("GGML_AVX2", ("avx2",)),
               ("GGML_BMI2", ("bmi2",)), ("GGML_FMA", ("fma",)), ("GGML_F16C", ("f16c",)),
               ("GGML_AVX_VNNI", ("avx_vnni",)),
               ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
               ("GGML_AVX512_VBMI", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi")),
               ("GGML_AVX512_VNNI", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni")),
               ("GGML_AVX512_BF16", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_bf16")))
# AMX off always, whatever /proc/cpuinfo says. Issue 56: on an Intel Xeon with amx_tile/amx_int8 (a Firecracker guest,
# kernel 6.18) llama-cpp-python 0.3.36 built natively dies with SIGILL at `tileloadd` in ggml_backend_amx_mul_mat.
# Linux hands tile state to a process only after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) (ggml asks, in
# amx.cpp); a kernel, hypervisor or sandbox can show the flags yet not carry the state. On that guest the request
# succeeds and a lone tileloadd runs after it (and dies with SIGILL without it), so which of ggml's threads loses the
# permission or the tile configuration is not pinned down: the flags cannot be trusted, and AMX only speeds batched
# prompt processing of some quantized types (decode, what the bench compares, is bound by memory).
AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
COMMON = ("-DLLAVA_BUILD=OFF",)     # the vision library: never loaded by the bench (lazily imported), a shorter build

PROBE = r"""
import sys
path, gguf, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if path:
    sys.path.insert(0, path)
try:
    import llama_cpp, llama_cpp.llama_chat_format, llama_cpp.llama_speculative
except ImportError as exc:
    print("missing", exc, flush=True)
    sys.exit(3)
print("version", llama_cpp.__version__, llama_cpp.__file__, flush=True)
llm = llama_cpp.Llama(model_path=gguf, n_ctx=256, n_threads=2, n_threads_batch=2, n_batch=64, flash_attn=True,
                      verbose=False)
ids = llm.tokenize(b"00:01:02 PUMP P-101 DISCHARGE PRESSURE HIGH ALM\n" * 6, add_bos=False)   # a batch, then rows
out = []
for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
    out.append(int(token))
    if len(out) >= n:
        break
print("generated", *out, flush=True)
"""


def _say(line: str) -> None:
    print(f"llama.cpp: {line}", file=sys.stderr, flush=True)


# -- what this CPU gets ------------------------------------------------------------------------------------------
def cpu_flags(cpuinfo: str) -> set[str]:
    """The first processor's feature flags ("flags" on x86, "Features" on ARM)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cmake_args(cpuinfo: str, machine: str) -> list[str]:
    """The CMAKE_ARGS that build llama.cpp for this CPU. x86: GGML_NATIVE=OFF and each instruction set named ON or
    OFF from the flags (a native build would also switch on AMX); AMX off always (see AMX_OFF). ARM and others:
    ggml's native build, which detects the CPU's own features (dotprod, i8mm, SVE) at compile time."""
    if machine.lower() in ("x86_64", "amd64", "i686", "i386"):
        have = cpu_flags(cpuinfo)
        return (["-DGGML_NATIVE=OFF"]
                + [f"-D{opt}={'ON' if set(need) <= have else 'OFF'}" for opt, need in X86_OPTIONS]
                + list(AMX_OFF) + list(COMMON))
    return ["-DGGML_NATIVE=ON"] + list(COMMON)


def this_cpu() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return cmake_args(text, platform.machine())


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ringspec" / "llama-cpp"


def build_dir(args: list[str]) -> Path:
    """Where the build for these options lives: keyed by version, Python (its helpers may be compiled) and options."""
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:12]
    return cache_home() / f"{VERSION}-cp{sys.version_info[0]}{sys.version_info[1]}-{key}"


# -- does it work here? ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""                 # why not, for a person; "" when ok
    version: str | None = None
    missing: bool = False            # nothing to import (as opposed to something that breaks)


def run_probe(argv: list[str], timeout: float = PROBE_TIMEOUT) -> Verdict:
    """Run a probe child and classify how it ended: a signal (SIGILL: an instruction this CPU or process may not
    run; SIGSEGV), an exit code, no answer in time, or a generation."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Verdict(False, f"a {PROBE_TOKENS}-token generation gave no answer in {timeout:.0f} s")
    found = re.search(r"^version (\S+)", proc.stdout, re.M)
    version = found.group(1) if found else None
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        why = {"SIGILL": "an instruction this CPU or this process may not run (a native build's AMX or AVX-512 path)",
               "SIGSEGV": "a memory fault inside llama.cpp",
               "SIGBUS": "a memory fault inside llama.cpp"}.get(name, "killed")
        return Verdict(False, f"died with {name} in a {PROBE_TOKENS}-token generation: {why}"
                              + (f" [{tail}]" if tail else ""), version)
    if proc.returncode == 3 and proc.stdout.startswith("missing"):
        return Verdict(False, "llama-cpp-python is not installed", None, missing=True)
    if proc.returncode != 0:
        return Verdict(False, f"exit code {proc.returncode}" + (f": {tail}" if tail else ""), version)
    if not re.search(r"^generated( \d+)+$", proc.stdout, re.M):
        return Verdict(False, f"generated nothing: {proc.stdout.strip()[-200:]!r}", version)
    return Verdict(True, "", version)


def check(path: str | None, gguf: str | os.PathLike, timeout: float = PROBE_TIMEOUT) -> Verdict:
    """Does `import llama_cpp` (from `path` first, else this environment) generate with `gguf` on this CPU?"""
    return run_probe([sys.executable, "-c", PROBE, path or "", str(gguf), str(PROBE_TOKENS)], timeout)


# -- the decision ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Build:
    source: str                        # "installed" (this environment's) | "built" (the cache's) | "none"
    version: str | None = None
    path: str | None = None            # put first on sys.path before `import llama_cpp`; None: the environment's
    cmake_args: tuple[str, ...] | None = None    # None: not known (an installed wheel)
    installed: str = ""                # what this environment's own llama-cpp-python did, when it was not used
    reason: str = ""                   # source "none": why llama.cpp is unavailable here
    build_seconds: float | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        if self.source == "none":
            return f"unavailable: {self.reason}"
        where = "this environment's" if self.source == "installed" else f"built for this CPU in {self.path}"
        args = f" ({' '.join(self.cmake_args)})" if self.cmake_args else ""
        note = f"; the environment's own: {self.installed}" if self.installed else ""
        return f"llama-cpp-python {self.version}, {where}{args}{note}"


def toolchain_missing() -> list[str]:
    """What a build needs and PATH lacks: C and C++ compilers (cmake: pip fetches one when it is absent)."""
    missing = []
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        missing.append("a C compiler (cc, gcc or clang)")
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (c++, g++ or clang++)")
    return missing


def default_gguf() -> Path:
    """The check's model: the registry's smallest (fetched once into the shared cache)."""
    return Model.of("default").gguf


def ensure(gguf: str | os.PathLike | None = None, build: bool = True, progress=_say) -> Build:
    """A llama.cpp that generates on this CPU: this environment's when it works, else the cached build for this
    CPU's options, else (build=True and a compiler) a new build; source "none" with the reason otherwise."""
    gguf = gguf or default_gguf()
    mine = check(None, gguf)
    if mine.ok:
        return Build("installed", mine.version)
    args = this_cpu()
    home = build_dir(args)
    site = home / "site"
    lock = cache_home() / f"{home.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)          # one build per key at a time; a second bench waits and reuses it
        record = home / "build.json"
        seconds = None
        if not record.exists():
            if not build:
                return Build("none", installed=mine.reason, cmake_args=tuple(args),
                             reason=f"{mine.reason}, and no build for this CPU in {home} "
                                    f"(python -m bench.llama_build --build makes one)")
            missing = toolchain_missing()
            if missing:
                return Build("none", installed=mine.reason, cmake_args=tuple(args),
                             reason=f"{mine.reason}, and llama-cpp-python {VERSION} cannot be built here: no "
                                    f"{' and no '.join(missing)} on PATH (install them, e.g. apt-get install "
                                    f"build-essential, then python -m bench.llama_build --build)")
            progress(f"{mine.reason}: building llama-cpp-python {VERSION} for this CPU into {home}")
            failed = _build(args, home, progress)
            if failed:
                return Build("none", installed=mine.reason, cmake_args=tuple(args), reason=failed)
        meta = json.loads(record.read_text())
        seconds = meta.get("seconds")
    got = check(str(site), gguf)
    if not got.ok:
        return Build("none", path=str(site), cmake_args=tuple(args), installed=mine.reason,
                     reason=f"the build in {home} does not run here either: {got.reason} (remove the directory to "
                            f"rebuild)")
    return Build("built", got.version, str(site), tuple(args), installed=mine.reason, build_seconds=seconds)


def _build(args: list[str], home: Path, progress) -> str:
    """pip install --target a fresh directory, renamed into place when it worked; "" or why it failed. Progress:
    the build's step every 30 s (ninja's [n/N] in pip's verbose output, build.log)."""
    tmp = home.with_name(f"{home.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log = tmp / "build.log"
    env = {**os.environ, "CMAKE_ARGS": " ".join(args), "FORCE_CMAKE": "1",
           "CMAKE_BUILD_PARALLEL_LEVEL": str(len(os.sched_getaffinity(0)))}
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--target", str(tmp / "site")]
    steps = [pip + ["-v", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
                    f"llama-cpp-python=={VERSION}"]]
    lacking = [req for mod, req in RUNTIME_DEPS.items() if importlib.util.find_spec(mod) is None]
    if lacking:                                   # only what this Python lacks: nothing it has gets shadowed
        steps.append(pip + lacking)
    progress(f"CMAKE_ARGS=\"{' '.join(args)}\" (about 8 minutes on 2 idle cores; log: {log})")
    t0 = time.monotonic()
    with open(log, "w") as out:
        for argv in steps:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
            last = t0
            while proc.poll() is None:
                time.sleep(1.0)
                if time.monotonic() - last >= 30.0:
                    last = time.monotonic()
                    done = re.findall(r"\[(\d+)/(\d+)\]", log.read_text(errors="replace")[-20000:])  # ninja's
                    progress(f"  building: {last - t0:4.0f} s" + (f", step {done[-1][0]} of {done[-1][1]}" if done
                                                                  else ""))
            if proc.returncode != 0:
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-4:])
                return f"building llama-cpp-python {VERSION} failed (exit code {proc.returncode}; {log}): {tail}"
    seconds = round(time.monotonic() - t0, 1)
    (tmp / "build.json").write_text(json.dumps({"version": VERSION, "cmake_args": args, "seconds": seconds,
                                                "python": sys.version.split()[0], "built": time.time()}, indent=1))
    shutil.rmtree(home, ignore_errors=True)       # a stale half (no build.json) from a killed build
    os.rename(tmp, home)
    progress(f"built in {seconds:.0f} s: {home}")
    return ""


def use(build: Build) -> Build:
    """Make `build` this process tree's llama.cpp: spawned workers inherit the decision through ENV."""
    os.environ[ENV] = json.dumps(build.as_dict())
    return build


def chosen(build: bool = False, gguf: str | os.PathLike | None = None, progress=_say) -> Build:
    """This process tree's llama.cpp: the decision already taken (ENV), else `ensure`'s, recorded. A decision of
    "none" is taken again when build=True (NO_BUILD "0": never build)."""
    build = build and os.environ.get(NO_BUILD, "1") != "0"
    if ENV in os.environ:
        known = json.loads(os.environ[ENV])
        known = Build(**{**known, "cmake_args": None if known["cmake_args"] is None else tuple(known["cmake_args"])})
        if known.source != "none" or not build:
            return known
    return use(ensure(gguf, build, progress))


def put_first(build: Build) -> None:
    """sys.path so that `import llama_cpp` finds `build` (nothing to do for the environment's own)."""
    if build.path and build.path not in sys.path:
        sys.path.insert(0, build.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.llama_build", description=__doc__.split("\n")[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="check what is there; never build (the default)")
    what.add_argument("--build", action="store_true", help="build for this CPU when nothing here works")
    ap.add_argument("--gguf", default=None, help="the model of the check (default: the registry's SmolLM2 135M)")
    ns = ap.parse_args(argv)
    args = this_cpu()
    print(f"this CPU ({platform.machine()}): CMAKE_ARGS=\"{' '.join(args)}\"\ncache: {build_dir(args)}")
    got = ensure(ns.gguf, build=ns.build)
    print(got.line())
    if got.build_seconds is not None:
        print(f"build time: {got.build_seconds:.0f} s")
    return 0 if got.source != "none" else 1


if __name__ == "__main__":
    sys.exit(main())

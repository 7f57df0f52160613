"""What this process runs on, as the process itself sees it: the CPU, its ISA features, the runtime versions.

Owns the facts an exactness verdict is about (ONNX Runtime picks its kernels by the features the process sees).
Features come from numpy's run-time dispatcher, which asks CPUID on x86 and the auxiliary vector (AT_HWCAP) on
ARM; the x86 model name from CPUID's brand string. An emulator (qemu-user) answers both for the CPU it emulates,
while /proc/cpuinfo passes the host's through, so /proc/cpuinfo is reported only as a second opinion. Never changes
anything.
"""
from __future__ import annotations

import ctypes
import mmap
import platform as _platform
import struct
import sys

import numpy
import onnxruntime

try:
    from numpy._core._multiarray_umath import __cpu_features__ as _CPU_FEATURES
except ImportError:                                        # numpy < 2
    from numpy.core._multiarray_umath import __cpu_features__ as _CPU_FEATURES

# x86-64 SysV: cpuid(leaf=edi, subleaf=esi, out=rdx) -> out[0..3] = eax, ebx, ecx, edx
_CPUID = bytes([0x53,                    # push rbx (callee-saved; cpuid writes it)
                0x49, 0x89, 0xD0,        # mov r8, rdx
                0x89, 0xF8,              # mov eax, edi
                0x89, 0xF1,              # mov ecx, esi
                0x0F, 0xA2,              # cpuid
                0x41, 0x89, 0x00,        # mov [r8], eax
                0x41, 0x89, 0x58, 0x04,  # mov [r8+4], ebx
                0x41, 0x89, 0x48, 0x08,  # mov [r8+8], ecx
                0x41, 0x89, 0x50, 0x0C,  # mov [r8+12], edx
                0x5B,                    # pop rbx
                0xC3])                   # ret


def cpuid_brand() -> str | None:
    """The x86 CPUID brand string (leaves 0x80000002-4), or None where it cannot be read (not x86-64, no
    executable anonymous memory)."""
    if _platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    page.write(_CPUID)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))(addr)
    regs = (ctypes.c_uint32 * 4)()
    fn(0x80000000, 0, regs)
    if regs[0] < 0x80000004:
        return None
    text = b""
    for leaf in (0x80000002, 0x80000003, 0x80000004):
        fn(leaf, 0, regs)
        text += struct.pack("<4I", *regs)
    del fn, regs
    return text.split(b"\0")[0].decode("ascii", "replace").strip() or None


def cpuinfo_model() -> str | None:
    """The first model line of /proc/cpuinfo (the host's under qemu-user)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Processor", "CPU part"):
                    return value.strip()
    except OSError:
        pass
    return None


ARM_PARTS = {0xd03: "cortex-a53", 0xd05: "cortex-a55", 0xd07: "cortex-a57", 0xd08: "cortex-a72",
             0xd09: "cortex-a73", 0xd0a: "cortex-a75", 0xd0b: "cortex-a76", 0xd0d: "cortex-a77",
             0xd41: "cortex-a78", 0xd46: "cortex-a510", 0xd47: "cortex-a710"}     # Arm's MIDR part numbers


def core_kinds(cpuinfo: str | None = None) -> dict[int, str]:
    """{cpu: "cortex-a76", ...} from /proc/cpuinfo's per-processor "CPU part" (Arm cores; an unknown part as its
    hex number); {} where it lists none (x86, and qemu-user, which passes the host's through)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return {}
    out, cpu = {}, None
    for line in cpuinfo.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor" and value.isdigit():
            cpu = int(value)
        elif key == "CPU part" and cpu is not None:
            try:
                out[cpu] = ARM_PARTS.get(int(value, 16), value)
            except ValueError:
                out[cpu] = value
    return out


def isa_features() -> list[str]:
    """The ISA features this process sees, by numpy's CPUID / AT_HWCAP dispatcher (sorted)."""
    return sorted(name for name, present in _CPU_FEATURES.items() if present)


def widest_simd(isa: list[str]) -> str:
    """The widest vector extension in `isa`, as a person names it (AVX-512, AVX2, AVX, NEON/ASIMD, ...)."""
    for name, label in (("AVX512F", "AVX-512"), ("AVX2", "AVX2"), ("AVX", "AVX"), ("SVE", "SVE"),
                        ("ASIMD", "NEON"), ("NEON", "NEON"), ("SSE41", "SSE4.1"), ("SSE2", "SSE2")):
        if name in isa:
            return label
    return "scalar"


def facts() -> dict:
    isa = isa_features()
    return {"onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            "python": _platform.python_version(), "machine": _platform.machine(), "system": sys.platform,
            "cpu": cpuid_brand() or cpuinfo_model() or "unknown", "cpuinfo": cpuinfo_model(),
            "isa": isa, "simd": widest_simd(isa), "avx512": [f for f in isa if f.startswith("AVX512")]}

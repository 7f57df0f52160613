#!/usr/bin/env bash
# `python run.py doctor` under user-mode emulation of other x86-64 CPUs (Debian's qemu-user), so that ONNX Runtime
# picks the kernels of a CPU this machine is not. One process each; prints what doctor printed.
#
#   bench/emulated-doctor.sh [CPU ...]        default: Haswell (AVX2, Intel) and Nehalem (SSE4.2, no AVX)
#
# QEMU's TCG does not implement AVX-512, so an AVX-512 host can be emulated down to AVX2 and SSE, but an AVX2 host
# cannot be emulated up: the AVX-512 kernels are only checked on a real AVX-512 machine (run doctor there).
# Emulation is slow (about 100x); doctor's operator table and whole pass take a few minutes per CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v qemu-x86_64 >/dev/null || { echo "needs qemu-user: apt-get install qemu-user" >&2; exit 2; }
[ "$(uname -m)" = x86_64 ] || { echo "emulates x86-64 CPUs on an x86-64 host" >&2; exit 2; }
python=$(python3 -c 'import sys; print(sys.executable)')   # the interpreter itself, not a shim script
cpus=("$@")
[ ${#cpus[@]} -gt 0 ] || cpus=(Haswell Nehalem)
status=0
for cpu in "${cpus[@]}"; do
    echo "== qemu-x86_64 -cpu $cpu: python run.py doctor"
    qemu-x86_64 -cpu "$cpu" "$python" run.py doctor --threads 2 2> >(grep -v "TCG doesn't support" >&2) \
        || status=$?
done
exit $status

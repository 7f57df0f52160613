#!/usr/bin/env bash
# The environment `python run.py export-rknn` and the rknn draft backend's simulator run in on x86-64: Rockchip's
# rknn-toolkit2 (converter and NPU simulator) in its own virtual environment, since its requirements pin numpy <= 1.26.4,
# onnx <= 1.18, protobuf <= 4.25.4 and torch <= 2.4.0 (the project runs numpy 2 and onnx 1.19+).
#
#   bench/build-rknn-env.sh [VENV]        default: $RINGSPEC_HOME/rknn-venv (~/.cache/ringspec/rknn-venv)
#
# The toolkit is installed without its pins (--no-deps) and imports torch at start-up, though ringspec hands it ONNX:
# torch here is the CPU build 2.13.0 (the pin allows <= 2.4.0, whose PyPI build is CUDA, several GB; where pip's
# find-links holds torch-2.13.0+cpu, as on this machine kind, it comes from disk). Prints the venv's python when
# done; not built by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${RINGSPEC_HOME:-$HOME/.cache/ringspec}/rknn-venv}
python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), "rknn-toolkit2 2.5.0 ships cp311 wheels here"' 
start=$(date +%s)
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --no-deps "rknn-toolkit2==2.5.0"
"$venv/bin/pip" install -q "torch==2.13.0" "setuptools<81"     # the toolkit imports pkg_resources
# ONNX Runtime at the project's pin, for the pipeline in this venv, without its protobuf >= 5 (onnx 1.16 needs 4.x)
"$venv/bin/pip" install -q --no-deps "onnxruntime==1.32.0"
"$venv/bin/pip" install -q "numpy==1.26.4" "onnx==1.16.2" "protobuf==4.25.4" flatbuffers packaging sympy "psutil>=5.9" \
    "ruamel.yaml>=0.17.21" "scipy>=1.9.3,<1.14" "tqdm>=4.64" "opencv-python-headless>=4.5.5.64,<4.11" \
    "fast-histogram>=0.11" "gguf>=0.10" "tokenizers>=0.19" "jinja2>=3.1" "msgpack>=1.0" "pyzmq>=25"
"$venv/bin/python" -c 'from rknn.api import RKNN; print("rknn-toolkit2 imports")'
echo "built $venv in $(( $(date +%s) - start )) s"
echo "$venv/bin/python"

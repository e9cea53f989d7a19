#!/usr/bin/env bash
# The one GPU command (device tool: an H200 with transformers 5.17 / torch 2.11 / triton 3.6 and no network).
# This package needs transformers >= 5.20 (5.17 takes `past_key_values=`, not `cache=`), so the wheels below are
# downloaded here first and carried along (the `run` tool's `carry`, 64 MiB at most):
#   pip download --no-deps -d wheelhouse transformers==5.24.0 "huggingface_hub>=1.31,<3" safetensors==0.8.0
#   pip download --no-deps -d wheelhouse --only-binary=:all: --python-version 3.X "tokenizers>=0.23.1,<0.24"
#     (3.X: the GPU machine's Python; check with `python -V` in the same run if unsure)
# then, on the device:  bash benchmarks/gpu_run.sh   (resumable: rerun it if it stops at the time limit)
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-benchmarks/results/gpu-h200}  # the device tool's $OUT comes back: commit it as benchmarks/results/gpu-h200
python -V
if [ -d wheelhouse ]; then
    pip install --no-index --no-deps --quiet wheelhouse/*.whl
fi
pip install --no-deps --quiet -e .
python -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
timeout 560 python benchmarks/gpu_suite.py --out "$RESULTS" || echo "suite stopped (rc $?): rerun to resume"

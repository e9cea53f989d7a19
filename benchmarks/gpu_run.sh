#!/usr/bin/env bash
# The one GPU command (device tool: an H200 with Python 3.12, torch 2.11, triton 3.6, transformers 5.17 and no
# network). This package needs transformers >= 5.20 (5.17 takes `past_key_values=`, not `cache=`); the
# machine's huggingface_hub 1.33, tokenizers 0.23 and safetensors 0.8 already satisfy transformers 5.24. So
# download that one wheel here first and carry it along (the `run` tool's `carry`, 64 MiB at most):
#   echo /wheelhouse/ >> .git/info/exclude
#   pip download --no-deps -d wheelhouse transformers==5.24.0
# then, on the device (carry: ["wheelhouse"]):  bash benchmarks/gpu_run.sh   (resumable: rerun it if it stops;
# a section saved by other code than this checkout's is redone)
# The package runs from this checkout (the suite puts it on sys.path): nothing is built there, since a
# build-isolated `pip install -e .` would need the network.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-benchmarks/results/gpu-h200}  # the device tool's $OUT comes back: commit it as benchmarks/results/gpu-h200
PY=${PYTHON:-python3}
$PY -V
if [ -d wheelhouse ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site wheelhouse/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
$PY -c "import transformers, torch, triton; print('transformers', transformers.__version__, 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
timeout "${SUITE_SECONDS:-500}" $PY benchmarks/gpu_suite.py --out "$RESULTS" "$@" || echo "suite stopped (rc $?): rerun to resume"

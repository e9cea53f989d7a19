#!/usr/bin/env bash
# The whole SmolLM2-135M-Instruct drafter recipe on CPU (2 cores): prompts -> self-distilled data -> drafter
# -> evaluation. Every stage resumes: rerun the script after an interruption.
#   bash recipes/smollm2/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/smollm2}
STEPS=${STEPS:-5000}
export OMP_NUM_THREADS=2

[ -f data/train_prompts.jsonl ] || python recipes/smollm2/build_prompts.py --out data/train_prompts.jsonl
hf-dynaspec distill --target smollm2 --prompts data/train_prompts.jsonl --out "$RUN/data" \
    --max-new-tokens 128 --batch-size 32 --threads 2
[ -f "$RUN/init/config.json" ] || hf-dynaspec init --target smollm2 --num-clusters 64 --k0 8 --k1 4 --out "$RUN/init"
hf-dynaspec train --target smollm2 --drafter "$RUN/init" --data "$RUN/data" --ckpt-dir "$RUN/ckpt" \
    --steps "$STEPS" --lr 5e-4 --batch-size 8 --seq-len 256 --threads 2
hf-dynaspec bench --target smollm2 --drafter "$RUN/ckpt" --limit 5 --methods plain,dynaspec,full \
    --out "$RUN/bench" --threads 2

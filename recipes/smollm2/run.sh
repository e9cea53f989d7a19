#!/usr/bin/env bash
# The whole SmolLM2-135M-Instruct drafter recipe on CPU (2 cores): prompts -> self-distilled data -> drafter
# -> evaluation, about two hours of compute. Every stage resumes: rerun the script after an interruption.
#   bash recipes/smollm2/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/smollm2}
STEPS=${STEPS:-5000}
export OMP_NUM_THREADS=2

# 1. prompts (two disjoint mixes, no Spec-Bench prompt) and self-distilled answers with the target's features
[ -f data/train_prompts.jsonl ] || python recipes/smollm2/build_prompts.py --out data/train_prompts.jsonl
[ -f data/train_prompts_round2.jsonl ] || python recipes/smollm2/build_prompts.py --round 2 --seed 1 \
    --out data/train_prompts_round2.jsonl
hf-dynaspec distill --target smollm2 --prompts data/train_prompts.jsonl --out "$RUN/data" \
    --max-new-tokens 128 --batch-size 32 --threads 2
hf-dynaspec distill --target smollm2 --prompts data/train_prompts_round2.jsonl --out "$RUN/data2" \
    --max-new-tokens 128 --batch-size 32 --threads 2

# 2. drafter: clusters of the LM head, then training with two unrolled draft steps
[ -f "$RUN/init/config.json" ] || hf-dynaspec init --target smollm2 --num-clusters 64 --k0 8 --k1 4 --out "$RUN/init"
hf-dynaspec train --target smollm2 --drafter "$RUN/init" --data "$RUN/data" --data "$RUN/data2" \
    --ckpt-dir "$RUN/ckpt2" --steps "$STEPS" --lr 5e-4 --batch-size 8 --seq-len 256 --unroll 2 \
    --head-positions 128 --threads 2

# 3. the static-shortlist baseline (same mean size as the dynamic shortlists) and a quick Spec-Bench check
hf-dynaspec static --drafter "$RUN/ckpt2" --data "$RUN/data" --data "$RUN/data2" --size 3072
hf-dynaspec bench --target smollm2 --drafter "$RUN/ckpt2" --limit 2 --methods plain,dynaspec,full,static \
    --out "$RUN/bench" --threads 2

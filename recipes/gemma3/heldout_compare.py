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
import sys
from pathlib import Path

import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target
from hf_dynaspec.training.arguments import EVAL_POSITIONS, HELDOUT_FRACTION
from hf_dynaspec.training.online import TargetFeatures, corpus_groups, forward_autocast, with_features
from hf_dynaspec.training.trainer import (
    curve_point,
    load_split_groups,
    positions_per_group,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from languages import GROUPS  # noqa: E402  (the groups the recipe passes to `hf-dynaspec train`)


def heldout_groups(corpus: str, groups: dict[str, str], featurize: TargetFeatures, seed: int) -> dict[str, list]:
    """{group: its held-out conversations, states filled for the positions a curve point scores}."""
    named = corpus_groups(corpus, groups, featurize.layer_ids)
    _, held, _ = load_split_groups(named, HELDOUT_FRACTION, seed)
    per_group = positions_per_group(EVAL_POSITIONS, len(held))
    return {name: with_features(convs, featurize, per_group) for name, convs in held.items()}


def score(drafter, groups: dict[str, list], seq_len: int, depths: int, gold_cache: dict) -> dict:
    """One curve point of `drafter` on the held-out `groups` (`trainer.curve_point`), without its step counters.
    `gold_cache`: the target's tokens on those positions, shared by every drafter scored on the same `groups`."""
    point = curve_point(drafter, [], seq_len, step=0, seen=0, unroll=depths, positions=EVAL_POSITIONS, groups=groups,
                        gold_cache=gold_cache)
    return {key: value for key, value in point.items() if key not in ("step", "positions_seen")}


def named_paths(items: list[str]) -> dict[str, str]:
    """{name: path} of --drafter NAME=PATH items, refusing a missing name, path or '=' and a repeated name."""
    paths: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not (sep and name and path) or name in paths:
            raise ValueError(f"--drafter takes distinct NAME=PATH pairs (e.g. new=runs/gemma3-ml/ckpt), got {item!r}.")
        paths[name] = path
    return paths


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
    parser.add_argument("--depths", type=int, default=4, help="draft depths scored (the recipe's --unroll)")
    parser.add_argument("--out", default="benchmarks/results/cpu-gemma3-ml-heldout")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        paths = named_paths(args.drafter)
    except ValueError as error:
        parser.error(str(error))
    target, _ = load_target("gemma3")
    results = {}
    filled: dict[tuple, tuple[dict, dict]] = {}  # per feature layer set: (held-out states, the target's tokens there)
    for name, path in paths.items():
        drafter = DynaSpecDrafter.from_pretrained(path).bind(target).eval()
        layers = tuple(drafter.config.feature_layer_ids)
        if layers not in filled:
            featurize = TargetFeatures(target, layers, forward_autocast("auto", target.device))
            filled[layers] = (heldout_groups(args.corpus, GROUPS, featurize, args.seed), {})
        with torch.no_grad():
            groups, gold_cache = filled[layers]
            results[name] = score(drafter, groups, args.seq_len, args.depths, gold_cache)
        print(name, results[name]["top1_at_depth"][0], flush=True)
    out = {"meta": {"machine": machine_description(), "paths": paths, "corpus": args.corpus,
                    "seq_len": args.seq_len, "seed": args.seed, "depths": args.depths}, "drafters": results}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "results.json").write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out, "results.md").write_text(markdown(out))
    print(markdown(out))


if __name__ == "__main__":
    main()

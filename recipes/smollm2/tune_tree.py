"""Choose a drafter's default draft tree from measurements on the tuning prompts (never on Spec-Bench).

Runs plain greedy and every candidate tree on `data/tuning_prompts.jsonl` (`recipes/smollm2/tuning_prompts.py`),
keeps the candidate with the highest overall speedup among those whose outputs all equal plain greedy, writes
`tune.json` / `tune.md` (every candidate's speedup and accepted length) into `--out`, and with `--write` stores the
winner in the drafter's `generation_config.json` (its tree under `device_trees[<the target's device type>]`: measured there only; and the evidence in its `tree_tuning.json`); the table also goes into recipes/smollm2/training.md. Resumable: the bench records go to `--out/records.jsonl`.

    python recipes/smollm2/tune_tree.py --drafter runs/smollm2-eagle3/ckpt --out runs/smollm2-eagle3/tune --write
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.bench import (
    method_settings,
    parse_methods,
    run_bench,
    summarize,
    write_doc_block,
)
from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.generation_config import TREE_FIELDS
from hf_dynaspec.machine import machine_description
from hf_dynaspec.sharing import TREE_TUNING
from hf_dynaspec.targets import load_target

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# (nodes, depth, top-k, min_draft_prob), each with the 8-token lookup branch
CANDIDATES = ((8, 5, 3, 0.1), (6, 4, 2, 0.1), (12, 5, 4, 0.05), (16, 6, 4, 0.05), (24, 7, 4, 0.02))
MEASURED = ("method", "speedup", "accepted_length", "mean_shortlist_size", "mismatches")
LABELS = {"num_draft_nodes": "nodes", "draft_depth": "depth", "draft_top_k": "top-k", "shortlist_k0": "k0",
          "shortlist_k1": "k1"}


def method_name(nodes: int, depth: int, top_k: int, min_prob: float) -> str:
    return f"dynaspec[num_draft_nodes={nodes},draft_depth={depth},draft_top_k={top_k},min_draft_prob={min_prob}]"


def choose(summaries: list, methods: list[str]) -> tuple[str | None, list[dict]]:
    """(the exact candidate with the best overall speedup, one row per candidate)."""
    overall = {s.method: s for s in summaries if s.category == "overall"}
    rows = [dict(method=m, speedup=overall[m].speedup, accepted_length=overall[m].mean_accepted_length,
                 mean_shortlist_size=overall[m].mean_shortlist_size, mismatches=overall[m].mismatches,
                 **{k: v for k, v in method_settings(m).items() if k != "head_mode"})
            for m in methods if m in overall]
    exact = [r for r in rows if r["mismatches"] == 0]
    return (max(exact, key=lambda r: r["speedup"])["method"] if exact else None), rows


def store_tree(config: DynaSpecGenerationConfig, settings: dict, device_type: str) -> DynaSpecGenerationConfig:
    """`config` with the chosen settings: the tree fields under `device_trees[device_type]` (the tree was measured
    on that device type only; elsewhere the library's per-device default applies), the others flat."""
    tree = {k: v for k, v in settings.items() if k in TREE_FIELDS}
    for key, value in settings.items():
        setattr(config, key, None if key in tree else value)  # a flat tree field would apply on every device
    trees = dict(config.device_trees or {})
    trees[device_type] = {**trees.get(device_type, {}), **tree}
    config.device_trees = trees
    return config


def markdown(rows: list[dict], best: str | None, meta: dict) -> str:
    """One row per candidate, best first; a column per setting the candidates vary."""
    settings = dict.fromkeys(k for r in rows for k in r if k not in MEASURED)  # every setting, in first-seen order
    keys = [k for k in settings if len({str(r.get(k)) for r in rows}) > 1]
    lines = [f"Tree tuning on {meta['prompts']} tuning prompts ({meta['max_new_tokens']} new tokens), {meta['machine']}.", "",
             "| " + " | ".join(LABELS.get(k, k) for k in keys) + " | speedup | accepted length | mean shortlist | "
             "differs from plain | chosen |", "|---" * (len(keys) + 5) + "|"]
    for r in sorted(rows, key=lambda r: -r["speedup"]):
        lines.append("| " + " | ".join(str(r.get(k, "default")) for k in keys) + f" | {r['speedup']:.2f}x | "
                     f"{r['accepted_length']:.2f} | {r['mean_shortlist_size']:,.0f} | {r['mismatches']} | "
                     f"{'yes' if r['method'] == best else ''} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--target", default="smollm2", help="the drafter's target: 'smollm2', 'gemma3' or a Hub dir")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=ROOT / "data/tuning_prompts.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-format", default="chat", help="how prompts are encoded (targets.PROMPT_FORMATS)")
    parser.add_argument("--methods", type=parse_methods, default=None,
                        help="candidates as bench methods, e.g. 'dynaspec[num_draft_nodes=8,shortlist_k0=4],...' "
                             "(default: the five trees of CANDIDATES)")
    parser.add_argument("--write", action="store_true", help="store the chosen tree in the drafter's generation config")
    parser.add_argument("--doc", type=Path, default=HERE / "training.md", help="markdown file for the generated table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if "tuning" not in args.prompts.name:
        raise SystemExit(f"{args.prompts} is not a tuning set: the default tree must not be chosen on evaluation prompts")
    prompts = load_bench_prompts(args.prompts)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target).eval()
    methods = args.methods or [method_name(*c) for c in CANDIDATES]
    args.out.mkdir(parents=True, exist_ok=True)
    records = run_bench(target, tokenizer, drafter, prompts, methods, args.max_new_tokens,
                        records_path=args.out / "records.jsonl", prompt_format=args.prompt_format)
    best, rows = choose(summarize(records), methods)
    meta = {"prompts": len(prompts), "prompt_file": args.prompts.relative_to(ROOT).as_posix()
            if args.prompts.is_relative_to(ROOT) else str(args.prompts), "max_new_tokens": args.max_new_tokens,
            "prompt_format": args.prompt_format, "machine": machine_description(), "drafter": str(args.drafter), "chosen": best}
    (args.out / "tune.json").write_text(json.dumps({"meta": meta, "candidates": rows}, indent=1) + "\n")
    (args.out / "tune.md").write_text(markdown(rows, best, meta))
    write_doc_block(args.doc, "tree-tuning", markdown(rows, best, meta).rstrip())
    print(markdown(rows, best, meta))
    if best is None:
        raise SystemExit("no candidate reproduced plain greedy on every prompt: nothing written")
    if args.write:
        config = store_tree(DynaSpecGenerationConfig.from_pretrained(args.drafter), method_settings(best),
                            target.device.type)
        config.save_pretrained(args.drafter)
        (args.drafter / TREE_TUNING).write_text(json.dumps({"meta": meta, "candidates": rows}, indent=1) + "\n")
        print(f"wrote {best} into {args.drafter}/generation_config.json")


if __name__ == "__main__":
    main()

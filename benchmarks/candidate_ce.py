"""Does the candidate CE (`hf-dynaspec train --head-vocab`) train a better drafter in the same CPU time than the
full-vocabulary CE? Each variant trains a copy of the same initial drafter on the same features for its own number
of steps (chosen so the variants take about the same wall time: `benchmarks/train_step.py` gives the step costs),
then every variant is evaluated alike: held-out top-1 over the *whole* vocabulary at draft depths 1-3
(`evaluate_drafter`, float32), whatever it was trained on.

    python benchmarks/candidate_ce.py --drafter runs/gemma3-ml/init --data runs/gemma3-ml/features/en \\
        --variant full:64:300 --variant candidates:16384:512:380 --out benchmarks/results/cpu-gemma3-candidate-ce
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from results_io import save_results

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target
from hf_dynaspec.training import TrainingArguments, train_drafter
from hf_dynaspec.training.losses import LossWeights


def parse_variant(text: str) -> dict:
    """"full:POSITIONS:STEPS" or "candidates:VOCAB:POSITIONS:STEPS" -> train_drafter settings."""
    kind, *numbers = text.split(":")
    if kind == "full" and len(numbers) == 2:
        return {"name": f"full @ {numbers[0]}", "head_positions": int(numbers[0]), "steps": int(numbers[1])}
    if kind == "candidates" and len(numbers) == 3:
        return {"name": f"candidates {int(numbers[0]):,} @ {numbers[1]}", "head_vocab": int(numbers[0]),
                "head_positions": int(numbers[1]), "steps": int(numbers[2])}
    raise SystemExit(f"--variant takes full:POSITIONS:STEPS or candidates:VOCAB:POSITIONS:STEPS, got {text!r}")


def run_variant(target, init: Path, data: list[str], variant: dict, args: argparse.Namespace) -> dict:
    """Train a copy of `init` as `variant` says; its wall time, learning curve and final held-out evaluation."""
    settings = {k: v for k, v in variant.items() if k != "name"}
    with tempfile.TemporaryDirectory() as ckpt:
        drafter = DynaSpecDrafter.from_pretrained(init)
        start = time.perf_counter()
        arguments = TrainingArguments(lr=args.lr, batch_size=8, seq_len=256, unroll=4, autocast_dtype=torch.bfloat16,
                                      eval_every=args.eval_every, eval_positions=args.eval_positions,
                                      weights=LossWeights(0.0, 1.0, 0.2), ckpt_every=10**9, **settings)
        result = train_drafter(drafter, target, data, ckpt, arguments, resume=False)
        seconds = time.perf_counter() - start
    return {"name": variant["name"], "settings": settings, "seconds": seconds, "curve": result["curve"],
            "eval": {k: v for k, v in result["eval"].items() if k != "router_recall"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="gemma3")
    parser.add_argument("--drafter", type=Path, required=True, help="the initial drafter (`hf-dynaspec init`)")
    parser.add_argument("--data", nargs="+", required=True, help="feature folders (`hf-dynaspec features`)")
    parser.add_argument("--variant", action="append", required=True, type=parse_variant,
                        help="full:POSITIONS:STEPS or candidates:VOCAB:POSITIONS:STEPS (repeat)")
    parser.add_argument("--data-note", default="", help="how the feature folders were made (kept in the results)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-every", type=int, default=0,
                        help="learning-curve points (their evaluations count in the wall time; 0: final one only)")
    parser.add_argument("--eval-positions", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target)
    runs = [run_variant(target, args.drafter, args.data, v, args) for v in args.variant]
    result = {"machine": machine_description(), "drafter": str(args.drafter), "data": args.data,
              "data_note": args.data_note, "lr": args.lr, "runs": runs}
    print(save_results(args.out, result, report))


def report(r: dict) -> str:
    lines = [f"Candidate CE against the full-vocabulary CE, each training a copy of `{r['drafter']}` (batch 8 x 256, "
             f"unroll 4, bf16 autocast, lr {r['lr']}) on {', '.join(r['data'])}; held-out top-1 over the whole "
             f"vocabulary (float32), {r['machine']}. `python benchmarks/candidate_ce.py`",
             *([f"Data: {r['data_note']}"] if r.get("data_note") else []), "",
             "| variant | steps | minutes (training + final evaluation) | held-out positions | top-1 depth 1 | depth 2 | depth 3 |",
             "|---|---|---|---|---|---|---|"]
    for run in r["runs"]:
        top1 = run["eval"]["top1_at_depth"]
        lines.append(f"| {run['name']} | {run['settings']['steps']} | {run['seconds'] / 60:.1f} | "
                     f"{run['eval']['positions']:,} | " + " | ".join(f"{v:.3f}" for v in top1[:3]) + " |")
    lines += ["", "Learning curves (held-out top-1 at depth 1 by step):", ""] if any(x["curve"] for x in r["runs"]) else []
    for run in (x for x in r["runs"] if x["curve"]):
        points = ", ".join(f"{p['step']}: {p['top1_at_depth'][0]:.3f}" for p in run["curve"])
        lines.append(f"- {run['name']}: {points}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""Seconds per drafter training step (`hf-dynaspec train`'s step: unrolled losses, backward, AdamW) under bf16
autocast, with the target's frozen LM head cast by autocast on every call ("per-call") or cast once
(`losses.DenseHead`, "cast-once", what `train_drafter` does), and with the candidate CE (`--candidates N:P`: the N
most frequent answer tokens plus each position's 16 likeliest, P scored positions per batch), in alternating rounds
on the same batches; scored positions per second beside each.

    python benchmarks/train_step.py --target gemma3 --drafter runs/gemma3-ml/init \\
        --data runs/gemma3-ml/features/en --out benchmarks/results/cpu-gemma3-train-step
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from results_io import save_results

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target
from hf_dynaspec.training.data import most_frequent
from hf_dynaspec.training.losses import Candidates, DenseHead, LossWeights, drafter_losses
from hf_dynaspec.training.trainer import frozen, length_grouped_batches, load_split_groups


def timed_steps(drafter, variant: dict, batches: list, optimizer, args: argparse.Namespace) -> float:
    """Mean seconds of one training step over `batches` (the recipe's loss weights: CE 1, router 0.2)."""
    weights, generator = LossWeights(regression=0.0, ce=1.0, router=0.2), torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            parts = drafter_losses(drafter, batch, variant["positions"], 8, True, generator, args.unroll, 0.8,
                                   variant["dense"], variant.get("candidates"))
            loss = weights.total(parts)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / len(batches)


def variants(drafter, train: list, args: argparse.Namespace) -> dict[str, dict]:
    """{name: {"dense", "positions", "candidates"?}}: the head cast per call and once, then each --candidates."""
    once = DenseHead.of(drafter, torch.bfloat16)
    out = {"per-call": {"dense": drafter.dense_logits, "positions": args.head_positions},
           "cast-once": {"dense": once, "positions": args.head_positions}}
    for spec in args.candidates:
        size, positions = (int(x) for x in spec.split(":"))
        frequent = most_frequent(train, size, drafter.config.vocab_size)
        out[f"candidates {size:,} @ {positions}"] = {"dense": once, "positions": positions,
                                                      "candidates": Candidates(frequent, 16)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="gemma3")
    parser.add_argument("--drafter", required=True, help="drafter folder (`hf-dynaspec init`)")
    parser.add_argument("--data", nargs="+", required=True, help="feature folders (`hf-dynaspec features`)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--unroll", type=int, default=4)
    parser.add_argument("--head-positions", type=int, default=64)
    parser.add_argument("--candidates", nargs="*", default=[], metavar="N:P",
                        help="candidate-CE variants: N most frequent tokens, P scored positions per batch")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and variant")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target)
    train, _, _ = load_split_groups(args.data, 0.05, 0)
    stream = length_grouped_batches(train, args.batch_size, args.seq_len, torch.Generator().manual_seed(0), 16)
    batches = [next(stream) for _ in range(args.steps + 1)]
    runs = variants(drafter, train, args)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-5)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    with frozen(target):
        for variant in runs.values():  # warm-up
            timed_steps(drafter, variant, batches[:1], optimizer, args)
        for _ in range(args.rounds):
            for name, variant in runs.items():
                seconds[name].append(timed_steps(drafter, variant, batches[1:], optimizer, args))
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    result = {"machine": machine_description(), "settings": settings, "seconds_per_step": seconds,
              "scored_positions": {name: v["positions"] for name, v in runs.items()}}
    print(save_results(args.out, result, report))


def report(r: dict) -> str:
    s = r["settings"]
    lines = [f"Drafter training step (batch {s['batch_size']} x {s['seq_len']}, unroll {s['unroll']}, "
             f"{s['head_positions']} head positions unless named, bf16 autocast), {s['target']} target, {r['machine']}; "
             f"{s['steps']} steps per round, {s['rounds']} alternating rounds. `python benchmarks/train_step.py`", "",
             "| head | scored positions | seconds per step (per round) | speed vs per-call | scored positions/s |",
             "|---|---|---|---|---|"]
    base = statistics.mean(r["seconds_per_step"]["per-call"])
    for name, rounds in r["seconds_per_step"].items():
        mean, positions = statistics.mean(rounds), r.get("scored_positions", {}).get(name, s["head_positions"])
        lines.append(f"| {name} | {positions} | {mean:.2f} ({', '.join(f'{x:.2f}' for x in rounds)}) | "
                     f"{base / mean:.2f}x | {positions / mean:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

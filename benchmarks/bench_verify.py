"""Cost of one target forward over n draft tokens on top of a cache (the verification step), per n.

Speculative decoding pays one target forward over the root + n - 1 draft nodes per step; on CPU its cost is
not flat in n, so the best tree size depends on where it bends. Prints ms per forward and the ratio to n = 1
with logits for all n tokens, with logits for the first 3 only (as CPU verification runs: the likeliest walk's
rows in the pass, the LM head applied on demand to other nodes the walk visits, `generation.verify`), and
with all logits for the weights re-laid by `hf_dynaspec.prepare_for_cpu` (each number: the median of
`--repeats` runs, the cache cropped back after each run).

    python benchmarks/bench_verify.py --target tiny --max-nodes 6 --context 64
    python benchmarks/bench_verify.py --target smollm2 --threads 2
"""

from __future__ import annotations

import argparse

import torch
from transformers import DynamicCache

from hf_dynaspec.cpu import prepare_for_cpu
from hf_dynaspec.generation.calibration import measure_walk_head, time_forward
from hf_dynaspec.targets import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, _ = load_target(args.target)
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=torch.randint(0, target.config.vocab_size, (1, args.context)), cache=cache, use_cache=True)
    sizes = range(1, args.max_nodes + 1)
    loaded = [time_forward(target, cache, args.context, n, args.repeats) for n in sizes]
    head = measure_walk_head(target)
    walk = [time_forward(target, cache, args.context, n, args.repeats, walk_head=head) for n in sizes]
    prepare_for_cpu(target)
    relaid = [time_forward(target, cache, args.context, n, args.repeats) for n in sizes]
    print(f"target {args.target}, context {args.context}, {torch.get_num_threads()} threads, {target.dtype}")
    print(f"| n tokens | all logits: ms | x (n = 1) | walk logits ({head.rows} rows, {head.layout} layout): ms "
          "| x (n = 1) | re-laid, all logits: ms | x (n = 1) |\n|---|---|---|---|---|---|---|")
    for n, a, r, b in zip(sizes, loaded, walk, relaid):
        print(f"| {n} | {a * 1e3:.1f} | {a / loaded[0]:.2f} | {r * 1e3:.1f} | {r / loaded[0]:.2f} | {b * 1e3:.1f} "
              f"| {b / loaded[0]:.2f} |")


if __name__ == "__main__":
    main()

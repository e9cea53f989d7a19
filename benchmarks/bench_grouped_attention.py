"""What reading grouped key / value heads in place saves a CPU verification (`generation/verification/grouped_attention.py`).

Times the verifier's forward (`calibration.time_forward`: a chain of n nodes after `context` cached tokens, the walk
rows' logits included) with the target's attention as the verifier runs it (grouped heads read in place) and as
transformers' SDPA path runs a masked forward (`repeat_kv`: each layer's keys and values copied once per query
group), one after the other at each shape, each figure the median of --repeats runs, after one untimed warm-up
of both paths. That both give the same logits bit for bit is tested (tests/test_grouped_attention.py). Writes
results.json / results.md under --out.

    python benchmarks/bench_grouped_attention.py --target smollm2 --out benchmarks/results/cpu-smollm2-grouped-attention
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_io, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a source checkout

from results_io import save_results  # noqa: E402

from hf_dynaspec.generation.planning.calibration import time_forward  # noqa: E402
from hf_dynaspec.generation.verification import verifier  # noqa: E402
from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.targets import load_target  # noqa: E402


def timed(target, context: int, n: int, repeats: int, in_place: bool) -> float:
    """Seconds of one verification forward over n nodes after `context` tokens, grouped heads read in place or
    copied (the verifier then finds no config to switch: transformers' own path)."""
    cache = DynamicCache(config=target.config)
    vocab = target.config.get_text_config().vocab_size
    with torch.no_grad():
        target(input_ids=torch.randint(0, vocab, (1, context)), cache=cache, use_cache=True)
        if in_place:
            return time_forward(target, cache, context, n, repeats)
        with mock.patch.object(verifier, "gqa_configs", lambda _: ()):
            return time_forward(target, cache, context, n, repeats)


def report(result: dict) -> str:
    rows = [f"# Grouped key / value heads in a CPU verification: read in place vs copied per group\n\n"
            f"{result['target']}, {result['machine']}, {result['dtype']}; one verification forward over n nodes (a "
            f"chain, the walk rows' logits included), median of {result['repeats']} runs.\n",
            "| context | n | copied (repeat_kv): ms | in place: ms | copied / in place |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        rows.append(f"| {r['context']} | {r['n']} | {r['copied'] * 1e3:.1f} | {r['in_place'] * 1e3:.1f} | "
                    f"{r['copied'] / r['in_place']:.2f}x |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target)
    for in_place in (False, True):  # warm-up: a process's first forwards are slower, whichever path runs them
        timed(target, args.contexts[0], args.nodes[0], args.repeats, in_place)
    rows = []
    for context in args.contexts:
        for n in args.nodes:
            copied = timed(target, context, n, args.repeats, in_place=False)
            in_place = timed(target, context, n, args.repeats, in_place=True)
            rows.append(dict(context=context, n=n, copied=copied, in_place=in_place))
            print(f"context {context}, n {n}: copied {copied * 1e3:.1f} ms, in place {in_place * 1e3:.1f} ms")
    result = dict(target=args.target, machine=machine_description(), dtype=str(target.dtype), repeats=args.repeats,
                  rows=rows)
    print(save_results(args.out, result, report))


if __name__ == "__main__":
    main()

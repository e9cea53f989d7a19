"""Cost of one target forward over n draft tokens on top of a cache (the verification step), per n.

Speculative decoding pays one target forward over the root + n - 1 draft nodes per step; on CPU its cost is
not flat in n, so the best tree size depends on where it bends. Prints ms per forward and the ratio to n = 1
with logits for all n tokens, with logits for the first 3 only (as CPU verification runs: the likeliest walk's
rows in the pass, the LM head applied on demand to other nodes the walk visits, `generation.verification.verify`), and
with all logits for the weights re-laid by `hf_dynaspec.prepare_for_cpu` (each number: the median of
`--repeats` runs, the cache cropped back after each run). With --out, writes results.json / results.md there;
with --doc, the table into that markdown file's `verify-cost-<target>` block (docs quote it only through that block).

    python benchmarks/bench_verify.py --target tiny --max-nodes 6 --context 64
    python benchmarks/bench_verify.py --target smollm2 --threads 2 --repeats 5 \
        --out benchmarks/results/cpu-smollm2-verify-cost --doc docs/architecture.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_io, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a source checkout

from results_io import save_results  # noqa: E402

from hf_dynaspec.bench import write_doc_block  # noqa: E402
from hf_dynaspec.cpu import prepare_for_cpu  # noqa: E402
from hf_dynaspec.generation.planning.calibration import measure_walk_head, time_forward  # noqa: E402
from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.targets import load_target  # noqa: E402


def report(result: dict) -> str:
    """The markdown table of `result`: ms per forward over n tokens and its ratio to n = 1 (all logits) per column."""
    first = result["rows"][0]["all_logits"]
    lines = [f"{result['target']}, {result['context']} tokens of context, {result['dtype']}, {result['machine']}; "
             f"median of {result['repeats']} runs (`benchmarks/bench_verify.py`):\n",
             f"| n tokens | all logits: ms | x (n = 1) | walk logits ({result['walk_rows']} rows, "
             f"{result['walk_layout']} layout): ms | x (n = 1) | re-laid, all logits: ms | x (n = 1) |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [f"{r[k] * 1e3:.1f} | {r[k] / first:.2f}" for k in ("all_logits", "walk_logits", "relaid")]
        lines.append(f"| {r['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json / results.md")
    parser.add_argument("--doc", type=Path, default=None,
                        help="markdown file whose verify-cost-<target> block gets the table (e.g. docs/architecture.md)")
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
    rows = [dict(n=n, all_logits=a, walk_logits=w, relaid=r) for n, a, w, r in zip(sizes, loaded, walk, relaid)]
    result = dict(target=args.target, context=args.context, threads=torch.get_num_threads(), dtype=str(target.dtype),
                  machine=machine_description(), repeats=args.repeats, walk_rows=head.rows, walk_layout=head.layout,
                  rows=rows)
    text = save_results(args.out, result, report) if args.out else report(result)
    if args.doc:
        write_doc_block(args.doc, f"verify-cost-{args.target}", text.strip())
    print(text)


if __name__ == "__main__":
    main()

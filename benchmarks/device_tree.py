"""The default draft tree for CUDA targets, chosen from measured costs (runs without a GPU).

A tree's speed on a device, in plain decoding steps per emitted token, is modelled as

    speedup = tau / (c(1 + nu) + depth * r)

- tau, nu: tokens emitted and draft nodes verified per step. They depend on the drafter, the target and the
  prompts, not on the device (greedy fp32 verification is exact), so a CPU run of `hf-dynaspec bench` over
  candidate trees measures them (`--sweeps`).
- c(n): the cost of verifying n tokens in plain decoding steps, as the step policy plans with it. From the GPU suite's
  verify section (`--gpu`): a tree-masked forward over n tokens over a one-token causal forward at the same
  context, made non-decreasing (as `calibration.measure_verify_costs` does: timing noise must not make a larger
  forward look cheaper), a size between two measured ones costing as the larger, averaged over the contexts.
- r: one drafter call (layer, router, head over `DRAFT_ROWS` rows) over a one-token target forward, from the
  suite's drafter section at the same target shape. A step makes `depth` drafter calls (the extend over the
  accepted tokens, then depth - 1 expansions).
- Where the suite also has a trees section (step costs of these very trees, timed end to end on that device),
  the measured step cost replaces c(1 + nu) + depth * r.

r depends on the target: the suite measured a Llama-3.1-8B shape, and a smaller target makes the drafter
relatively dearer. A library default serves every target, so each candidate is modelled at r and at 2r, and
the one with the best geometric mean of the two, among those whose outputs all equal plain greedy, is the tree
`DEFAULT_DEVICE_TREES["cuda"]` must hold (tests/test_device_tree.py checks it). Trees within `TIE` of the best
count as tied (26 prompts cannot rank them closer); of those, the one emitting most tokens per step wins, as it
gains most from a stronger drafter.

    for S in cpu-smollm2-tree-sweep cpu-smollm2-tree-sweep-shallow; do      # the sweeps (CPU, resumable)
      hf-dynaspec bench --target smollm2 --drafter drafters/smollm2-135m-instruct --threads 2 \
          --prompts data/tuning_prompts.jsonl --max-new-tokens 96 --methods "$(python benchmarks/device_tree.py \
          --methods $S)" --out benchmarks/results/$S
    done
    python benchmarks/device_tree.py --gpu benchmarks/results/gpu-h200 --out benchmarks/results/cuda-default-tree
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hf_dynaspec.generation.loop.stats import SpeculativeStats  # noqa: E402
from hf_dynaspec.generation.planning.policy import VerifyCosts  # noqa: E402
from hf_dynaspec.generation_config import TREE_FIELDS  # noqa: E402

if TYPE_CHECKING:
    from hf_dynaspec.bench import Record
# hf_dynaspec.bench is imported where used: the GPU suite (gpu_decoding.py) reads SWEEPS on machines without `evaluate`

DRAFTER_SHAPE = "llama3-8b"  # the suite's drafter shape that matches its verify section's target
DRAFT_HEAD = "dynamic"  # the library's default head mode
DRAFT_ROWS = 8  # rows per drafter call: an expansion reads top-k (4-16) nodes (8 and 32 rows: within 2% on the H200)
TIE = 0.01  # modelled speedups within 1% of the best are tied
# candidate trees (nodes, depth, top-k) per sweep (a bench run each), no probability floor: on a GPU a node costs
# next to nothing to verify. The second sweep explores below depth 3, where the first one's best tree sat.
SWEEPS = {
    "cpu-smollm2-tree-sweep": ((12, 5, 4), (32, 4, 8), (24, 6, 6), (32, 6, 8), (48, 6, 8), (60, 6, 10), (60, 8, 10),
                               (24, 3, 8), (48, 4, 10), (60, 5, 10)),
    "cpu-smollm2-tree-sweep-shallow": ((48, 3, 16), (32, 3, 10), (16, 2, 8), (32, 2, 16)),
}


def sweep_methods(sweep: str) -> str:
    """The bench methods of a sweep: plain and each of its candidate trees."""
    trees = [f"dynaspec[num_draft_nodes={n},draft_depth={d},draft_top_k={k},min_draft_prob=0.0]"
             for n, d, k in SWEEPS[sweep]]
    return ",".join(["plain", *trees])


def device_costs(verify: dict) -> VerifyCosts:
    """c(1..N) on the suite's device (module docstring): per context, tree-masked ms over one-token causal ms,
    non-decreasing, filled up to the next measured size; then the mean over contexts."""
    contexts = sorted({r["context"] for r in verify["rows"]})
    per_context = [context_costs(verify["rows"], context) for context in contexts]
    return VerifyCosts(tuple(statistics.fmean(costs) for costs in zip(*per_context)))


def context_costs(rows: list[dict], context: int) -> list[float]:
    """[c(1), ..., c(N)] at one context, N the largest measured tree."""
    plain = next(r["ms"] for r in rows if r["context"] == context and r["mask"] == "causal" and r["nodes"] == 1)
    tree = sorted((r["nodes"], r["ms"] / plain) for r in rows if r["context"] == context and r["mask"] == "tree")
    costs, highest = [], 0.0
    for (lower, _), (nodes, cost) in zip([(0, 0.0), *tree], tree):
        highest = max(highest, cost)
        costs += [highest] * (nodes - lower)  # sizes lower+1 .. nodes cost as the measured `nodes`
    return costs


def drafter_ratio(drafter: dict, verify: dict) -> float:
    """r: one drafter call over one plain target step (mean of the one-token causal forwards)."""
    step = next(r["step_sequential_ms"] for r in drafter["rows"] if r["shape"] == DRAFTER_SHAPE
                and r["head_mode"] == DRAFT_HEAD and r["positions"] == DRAFT_ROWS)
    plain = statistics.fmean(r["ms"] for r in verify["rows"] if r["mask"] == "causal" and r["nodes"] == 1)
    return step / plain


def tree_rows(records: list[Record], costs: VerifyCosts, r: float, measured: dict[tuple, float] | None = None
              ) -> list[dict]:
    """One row per speculative method of the sweep: its tree, what it emitted and verified per step (merged over
    prompts), its measured CPU speedup and its speedup on the device at r and 2r. A step costs
    c(1 + nodes) + depth * r plain steps, or what the GPU suite's trees section measured for the same tree
    (`measured`, keyed by `tree_key`; at 2r, + depth * r)."""
    from hf_dynaspec.bench import method_settings, summarize

    overall = {s.method: s for s in summarize(records) if s.category == "overall"}
    rows = []
    for method, summary in overall.items():
        settings = method_settings(method)
        if settings is None:
            continue  # plain
        stats = SpeculativeStats.merged([SpeculativeStats.from_dict(x.stats) for x in records
                                         if x.method == method and x.stats is not None])
        tokens, nodes = stats.mean_accepted_length, stats.mean_tree_size
        depth = settings["draft_depth"]
        verify = costs(round(1 + nodes))  # c of the mean verified size (root + drafts)
        step = (measured or {}).get(tree_key(settings))
        source = "modelled" if step is None else "measured"
        step = verify + depth * r if step is None else step
        at_r, at_2r = tokens / step, tokens / (step + depth * r)
        rows.append(dict(method=method, tree={k: v for k, v in settings.items() if k in TREE_FIELDS},
                         tokens_per_step=tokens, nodes_per_step=nodes, verify_cost=verify, step_cost=step,
                         step_cost_source=source, modelled_speedup=at_r, modelled_speedup_2r=at_2r,
                         modelled_speedup_geomean=math.sqrt(at_r * at_2r),
                         cpu_speedup=summary.speedup, mismatches=summary.mismatches, prompts=summary.prompts))
    return rows


def tree_key(settings: dict) -> tuple[int, int, int]:
    return settings["num_draft_nodes"], settings["draft_depth"], settings["draft_top_k"]


def measured_step_costs(gpu: dict) -> dict[tuple, float]:
    """Step costs the GPU suite's trees section measured (an older run has none: {})."""
    section = gpu["sections"].get("trees")
    return {tree_key(row["tree"]): row["cost"] for row in section["rows"]} if section else {}


def choose(rows: list[dict], key: str = "modelled_speedup_geomean", tie: float = TIE) -> dict | None:
    """Of the exact rows (no output differing from plain greedy) within `tie` of the best `key`, the one with
    the most tokens per step."""
    exact = [row for row in rows if row["mismatches"] == 0]
    if not exact:
        return None
    best = max(row[key] for row in exact)
    return max((row for row in exact if row[key] >= best * (1 - tie)), key=lambda row: row["tokens_per_step"])


def markdown(rows: list[dict], chosen: dict | None, meta: dict) -> str:
    lines = [f"Default CUDA tree, modelled from measured costs: c(n) and r from {meta['gpu_device']} "
             f"(`{meta['gpu']}`), tokens and nodes per step from {meta['prompts']} tuning prompts on "
             f"{meta['machine']} ({', '.join(f'`{s}`' for s in meta['sweeps'])}, fp32; CPU speedups against each "
             f"run's own plain runs). One drafter call costs r = {meta['r']:.3f} plain steps; verification costs "
             f"c(n) = {span(meta['c_min'], meta['c_max'])} plain steps for n = 2..{meta['c_sizes']} (made "
             "non-decreasing, so one slow small forward lifts every larger size).", "",
             "| nodes | depth | top-k | min_draft_prob | tokens / step | nodes verified / step | c(1 + nodes) | "
             "step cost | modelled speedup | modelled, r x 2 | geometric mean | CPU speedup (measured) | "
             "differs from plain | chosen |",
             "|---" * 14 + "|"]
    for row in sorted(rows, key=lambda row: -row["modelled_speedup_geomean"]):
        t = row["tree"]
        lines.append(f"| {t['num_draft_nodes']} | {t['draft_depth']} | {t['draft_top_k']} | {t['min_draft_prob']} | "
                     f"{row['tokens_per_step']:.2f} | {row['nodes_per_step']:.1f} | {row['verify_cost']:.2f} | "
                     f"{row['step_cost']:.2f} ({row['step_cost_source']}) | "
                     f"{row['modelled_speedup']:.2f}x | {row['modelled_speedup_2r']:.2f}x | "
                     f"{row['modelled_speedup_geomean']:.3f}x | {row['cpu_speedup']:.2f}x | "
                     f"{row['mismatches']} | {'yes' if chosen and row['method'] == chosen['method'] else ''} |")
    if chosen is not None:
        best = {key: choose(rows, key)["method"] for key in ("modelled_speedup", "modelled_speedup_2r")}
        tied = [row["method"] for row in rows if row["mismatches"] == 0 and row is not chosen
                and row["modelled_speedup_geomean"] >= chosen["modelled_speedup_geomean"] * (1 - TIE)]
        lines += ["", f"Chosen (best geometric mean, most tokens per step among those within {TIE:.0%}): "
                  f"`{chosen['method']}`" + (f", tied with {', '.join(f'`{m}`' for m in tied)}" if tied else "")
                  + f". Best at r: `{best['modelled_speedup']}`; at 2r: `{best['modelled_speedup_2r']}`."]
    return "\n".join(lines) + "\n"


def span(low: float, high: float) -> str:
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", type=Path, nargs="+", default=[ROOT / "benchmarks/results" / s for s in SWEEPS],
                        help="bench runs of candidate trees (each one's CPU speedups against its own plain runs)")
    parser.add_argument("--gpu", type=Path, default=ROOT / "benchmarks/results/gpu-h200")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cuda-default-tree")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs/architecture.md")
    parser.add_argument("--methods", choices=SWEEPS, default=None, help="print a sweep's bench methods and exit")
    args = parser.parse_args()
    if args.methods:
        print(sweep_methods(args.methods))
        return
    gpu = json.loads((args.gpu / "results.json").read_text())
    sweeps = [json.loads((sweep / "results.json").read_text())["meta"] for sweep in args.sweeps]
    from hf_dynaspec.bench import read_records, write_doc_block

    runs = [read_records(sweep / "records.jsonl") for sweep in args.sweeps]
    verify, costs = gpu["sections"]["verify"], device_costs(gpu["sections"]["verify"])
    r = drafter_ratio(gpu["sections"]["drafter"], verify)
    measured = measured_step_costs(gpu)
    rows = [row for records in runs for row in tree_rows(records, costs, r, measured)]
    chosen = choose(rows)
    meta = dict(gpu=relative(args.gpu), gpu_device=gpu["meta"]["device"],
                sweeps=[relative(sweep) for sweep in args.sweeps], machine=" / ".join({m["machine"] for m in sweeps}),
                prompts=" / ".join(dict.fromkeys(str(len({x.question_id for x in records})) for records in runs)), r=r,
                c_min=min(costs.costs[1:]), c_max=max(costs.costs[1:]), c_sizes=len(costs.costs),
                costs=list(costs.costs), chosen=chosen and chosen["method"], tree=chosen and chosen["tree"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    text = markdown(rows, chosen, meta)
    (args.out / "results.md").write_text(text)
    write_doc_block(args.doc, "cuda-default-tree", text.rstrip())
    print(text)
    if chosen is None:
        raise SystemExit("no candidate tree reproduced plain greedy on every prompt")


def relative(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    main()

"""The GPU section of docs/architecture.md and docs/results.md's GPU advice, written from a GPU suite's results.json.

Every figure comes from `benchmarks/gpu_suite.py`'s output (committed under benchmarks/results/gpu-h200), so the
docs cannot drift from the run. Needs no GPU:

    python benchmarks/gpu_doc.py --results benchmarks/results/gpu-h200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "kernels" / "torch-ext"))
sys.path.insert(0, str(ROOT))

from dynaspec_gathered_head import launch_plan  # noqa: E402

from hf_dynaspec.bench import write_doc_block  # noqa: E402

SM_COUNT = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132}  # streaming multiprocessors, for the tile count


def load(results: Path) -> dict:
    return json.loads((results / "results.json").read_text())


def tiles(row: dict) -> int:
    """Output tiles the Triton kernel launches for one head case, with its default blocks."""
    return launch_plan(row["rows"], row["shortlist"], row["d"])["tiles"]


def programs(row: dict) -> str:
    """"tiles x d-ranges" as the run launched them (runs before split-K recorded no launch: tiles alone)."""
    launch = row.get("triton_launch")
    return f"{launch['tiles']} x {launch['split_k']}" if launch else str(tiles(row))


def head_lines(head: dict, sms: int | None) -> list[str]:
    rows = [r for r in head["rows"] if r["rows"] == max(x["rows"] for x in head["rows"])]
    lines = [f"Gathered LM head, bf16, {rows[0]['rows']} rows, L2 flushed before each call (median of timed calls):", "",
             "| V | d | shortlist | rows read | Triton ms | index_select + matmul ms | Triton speedup | Triton % of HBM roofline | programs (tiles x d-ranges) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['vocab']:,} | {r['d']} | {r['share']:.1%} | {r['shortlist']:,} | {r['triton_ms']:.4f} | "
                     f"{r['index_select_ms']:.4f} | {r['speedup_triton_vs_index_select']:.2f}x | "
                     f"{r['triton_roofline_fraction']:.0%} | {programs(r)} |")
    s = head["summary"]
    best = max(rows, key=lambda r: r["triton_roofline_fraction"])
    lines += ["", f"Over all {len(head['rows'])} cases (1, 8 and 64 rows) the Triton kernel's speedup over index_select + "
              f"matmul has a geometric mean of {s['speedup_geomean']:.2f}x (from {s['speedup_min']:.2f}x to "
              f"{s['speedup_max']:.2f}x). At {best['rows']} rows it reaches {best['triton_roofline_fraction']:.0%} of "
              f"the HBM roofline on the largest shortlist ({best['shortlist']:,} rows of {best['vocab']:,} x "
              f"{best['d']})."]
    below = [r for r in rows if r["triton_roofline_fraction"] < 0.7]
    if sms and below and not any("triton_launch" in r for r in rows):
        small = [r for r in below if tiles(r) < sms]
        lines.append(f"Below 70% ({len(below)} of {len(rows)} shapes), the kernel launched fewer output tiles than the "
                     f"GPU's {sms} multiprocessors on {len(small)}, so most of the chip idled; the launch-config sweep "
                     "moved it only a little. Splitting d across programs (split-K, below) is the measured attempt "
                     "to fill the chip.")
    elif below:
        lines.append(f"Below 70% ({len(below)} of {len(rows)} shapes, split-K on): each of them needs at most "
                     f"{1e3 * max(r['roofline_ms'] for r in below):.0f} us at the roofline and took at least "
                     f"{1e3 * min(r['triton_ms'] for r in below):.0f} us, so a kernel's fixed start-up time, not "
                     "bandwidth, likely sets their cost.")
    return lines


def split_lines(head: dict, split_head: dict) -> list[str]:
    """Split-K (a later run that split d while the output tiles left multiprocessors idle) against the main run,
    64-row shapes."""
    rows = max(r["rows"] for r in head["rows"])
    key = lambda r: (r["vocab"], r["d"], r["rows"], r["share"])  # noqa: E731
    base = {key(r): r for r in head["rows"] if r["rows"] == rows}
    pairs = [(base[key(r)], r) for r in split_head["rows"] if key(r) in base and r["triton_launch"]["split_k"] > 1]
    ratios = [b["triton_ms"] / r["triton_ms"] for b, r in pairs]
    helped = [b for (b, r), x in zip(pairs, ratios) if x > 1.1]
    shapes = ", ".join(sorted({f"{b['vocab']:,} x {b['d']}" for b in helped}))
    return ["", f"Split-K, measured in a third run (`benchmarks/results/gpu-h200-run3-splitk`, another machine of the same "
            f"kind): on the {len(pairs)} {rows}-row shapes it split, its time against the run above ranged "
            f"{min(ratios):.2f}x-{max(ratios):.2f}x faster; it helped (> 1.1x) on {len(helped)} "
            f"({shapes}) and the extra partial-sum pass cost "
            "more elsewhere, so it is opt-in (`split_k=`), not the default."]


def verify_lines(verify: dict, peak_gbps: float) -> list[str]:
    by = {(r["context"], r["mask"], r["nodes"]): r for r in verify["rows"]}
    contexts = sorted({r["context"] for r in verify["rows"]})
    nodes = sorted({r["nodes"] for r in verify["rows"]})
    model = verify["model"]
    lines = ["", f"Verification on a random Llama of Llama-3.1-8B shape ({model['num_hidden_layers']} layers, d "
             f"{model['hidden_size']}, bf16, transformers eager): a forward over n tree tokens, ms and c(n) = "
             "cost / cost of one token:", "",
             "| n | " + " | ".join(f"{c} cached: ms | c(n)" for c in contexts) + " |",
             "|---|" + "---|---|" * len(contexts)]
    for n in nodes:
        cells = [f"{by[(c, 'tree', n)]['ms']:.1f} | {by[(c, 'tree', n)]['cost']:.2f}" for c in contexts]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    fastest = min(r["ms"] for r in verify["rows"])
    costs = [r["cost"] for r in verify["rows"]]
    floor = 1e3 * 2 * llama_parameters(model) / (peak_gbps * 1e9)  # bf16 weights read once per forward
    lines += ["", f"Reading the bf16 weights once takes {floor:.1f} ms at the HBM peak; the fastest forward took "
              f"{fastest:.1f} ms. The forward is bound by launching its kernels from Python, not by the GPU, so its "
              f"cost barely depends on n, and the ratios scatter ({min(costs):.2f}-{max(costs):.2f}, below 1 where a "
              "one-token forward happened to be slow): read them as flat, not as exact."]
    return lines


def llama_parameters(model: dict) -> int:
    """Parameters of a Llama with these config fields (untied embeddings and LM head)."""
    d, layers, vocab, inner = model["hidden_size"], model["num_hidden_layers"], model["vocab_size"], model["intermediate_size"]
    kv = d // model["num_attention_heads"] * model["num_key_value_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * inner + 2 * d
    return layers * per_layer + 2 * vocab * d + d


def drafter_lines(drafter: dict) -> list[str]:
    rows = [r for r in drafter["rows"] if r["positions"] == 8]
    lines = ["", "One drafter step over 8 draft positions (layer + router + head), ms:", "",
             "| target shape | head | shortlist | step, router beside | step, sequential | head alone |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} (V {r['vocab']:,}) | {r['head_mode']} | {r['shortlist_mean']:,.0f} | "
                     f"{r['step_beside_ms']:.2f} | {r['step_sequential_ms']:.2f} | {r['head_ms']:.3f} |")
    return lines


def exact_and_sync_lines(exactness: dict, syncs: dict) -> list[str]:
    shares = ", ".join(f"{dtype.removeprefix('torch.')} {share:.0%}" for dtype, share in
                       exactness["identical_share_by_dtype"].items())
    runs = sum(r["runs"] for r in exactness["summary"])
    means = [r["mean"] for r in syncs["rows"]]
    trees = ", ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in settings.items()) or 'the drafter default then'})"
                      for name, settings in exactness["trees"].items())
    return ["", f"Greedy exactness on the GPU ({runs} runs: tiny Llama, tiny Qwen2 and a SmolLM2-shaped random "
            f"target; trees {trees}): identical to plain greedy in {shares}. Host reads per "
            f"decoding step: {min(means):.1f}-{max(means):.1f} on average."]


def advice(verify: dict, meta: dict, tree_choice: dict | None) -> str:
    """The README's GPU paragraph; `tree_choice`: benchmarks/device_tree.py's results (None: not run yet)."""
    tree = [r for r in verify["rows"] if r["mask"] == "tree" and r["nodes"] > 1]
    largest = max(r["nodes"] for r in tree)
    low, high = min(r["cost"] for r in tree), max(r["cost"] for r in tree)
    text = (f"On a GPU verification is nearly free per node: on an {meta['device']}, forwards of a Llama-3.1-8B-shaped "
            f"target (bf16, transformers eager) over 2 to {largest} tree tokens cost {low:.2f}-{high:.2f} times a "
            "one-token forward, flat within timing noise, because launching the kernels bounds them "
            "(`benchmarks/results/gpu-h200`, docs/architecture.md).")
    if tree_choice is None:
        return text + " Use larger trees there (`num_draft_nodes=60, draft_depth=6`)."
    chosen = ", ".join(f"`{k}={v!r}`" for k, v in tree_choice["meta"]["tree"].items())
    return (text + f" So on CUDA `generate()` drafts a larger tree by default ({chosen}, unless the drafter stores "
            "its own CUDA tree in `device_trees`), chosen by `benchmarks/device_tree.py` from these costs and the "
            "tokens per step each candidate tree emits (`benchmarks/results/cuda-default-tree`). "
            "The step policy (`step_policy=\"auto\"`, the default) times your GPU once and keeps only the drafts that pay "
            "there.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/gpu-h200")
    parser.add_argument("--split-run", type=Path, default=ROOT / "benchmarks/results/gpu-h200-run3-splitk",
                        help="a run with split-K on by default, compared with --results (skipped if absent)")
    parser.add_argument("--tree-choice", type=Path, default=ROOT / "benchmarks/results/cuda-default-tree",
                        help="benchmarks/device_tree.py's output: the default CUDA tree (skipped if absent)")
    args = parser.parse_args()
    results = load(args.results)
    meta, sections = results["meta"], results["sections"]
    header = (f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, transformers {meta['transformers']}, "
              f"run {meta['timestamp'][:10]}: `bash benchmarks/gpu_run.sh` (results in "
              f"`{args.results.relative_to(ROOT) if args.results.is_absolute() else args.results}`).")
    lines = [header, ""] + head_lines(sections["head"], SM_COUNT.get(meta["device"]))
    if (args.split_run / "results.json").exists():
        lines += split_lines(sections["head"], load(args.split_run)["sections"]["head"])
    lines += verify_lines(sections["verify"], meta["peak_gbps"]) + drafter_lines(sections["drafter"])
    lines += exact_and_sync_lines(sections["exactness"], sections["syncs"])
    write_doc_block(ROOT / "docs/architecture.md", "gpu-h200", "\n".join(lines))
    choice = args.tree_choice / "results.json"
    tree_choice = json.loads(choice.read_text()) if choice.is_file() else None
    write_doc_block(ROOT / "docs" / "results.md", "gpu-advice", advice(sections["verify"], meta, tree_choice))
    print("wrote docs/architecture.md (gpu-h200) and docs/results.md (gpu-advice)")


if __name__ == "__main__":
    main()

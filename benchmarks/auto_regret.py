"""Regret of the automatic choices: the defaults (step policy and verification layout "auto") against every fixed
configuration, measured in one run, interleaved per prompt.

Runs `hf-dynaspec bench` (resumable records, every method on one prompt before the next, each output checked
against plain greedy) with the defaults (`dynaspec`) and the fixed configurations `FIXED` (the whole tree in each
verification layout, the chain, transformers' prompt lookup), then writes under `--out`/regret:
- `results.json` / `results.md`: each method's pooled speedup over plain (ratio of summed times), the best fixed
  configuration of the run, the defaults against it (pooled, with a paired bootstrap 95% interval over prompts),
  the prompts where the defaults fall below 0.95x plain or 0.95x of the best fixed configuration, mismatches;
- `regret.png`: per prompt, the defaults' speed over the best fixed configuration's and over plain, sorted.

    python benchmarks/auto_regret.py --target smollm2 --drafter drafters/smollm2-135m-instruct --limit 4 \
        --out benchmarks/results/cpu-smollm2-auto-regret-amd
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_io, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a source checkout

from results_io import save_results  # noqa: E402

from hf_dynaspec.bench import Record, parse_methods, read_records  # noqa: E402

AUTO = "dynaspec"
FIXED = (
    "dynaspec[step_policy=off,verify_head=rows]",
    "dynaspec[step_policy=off,verify_head=columns]",
    "dynaspec[step_policy=off,verify_head=prefilter]",
    "dynaspec[step_policy=off,verify_head=full]",
    "dynaspec[step_policy=off,tree_policy=chain]",
    "prompt-lookup",
)
SLOW = 0.95  # below this ratio a prompt counts as slower (than plain, or than the best fixed configuration)
BOOTSTRAP = 2000


def seconds_by_method(records: list[Record]) -> dict[str, dict[str, float]]:
    """{method: {question id: seconds}}, on the prompts every method of the run finished."""
    table: dict[str, dict[str, float]] = {}
    for r in records:
        table.setdefault(r.method, {})[r.question_id] = r.seconds
    common = set.intersection(*(set(v) for v in table.values()))
    return {m: {q: s for q, s in v.items() if q in common} for m, v in table.items()}


def pooled_ratio(faster: dict[str, float], slower: dict[str, float], prompts: list[str]) -> float:
    """Summed seconds of `slower` over summed seconds of `faster` on `prompts` (> 1: `faster` is faster)."""
    return sum(slower[q] for q in prompts) / sum(faster[q] for q in prompts)


def bootstrap_interval(faster: dict[str, float], slower: dict[str, float], seed: int = 0) -> tuple[float, float]:
    """Paired bootstrap 95% interval of `pooled_ratio` over prompts."""
    rng, prompts = random.Random(seed), sorted(faster)
    draws = sorted(pooled_ratio(faster, slower, [rng.choice(prompts) for _ in prompts]) for _ in range(BOOTSTRAP))
    return draws[int(0.025 * BOOTSTRAP)], draws[int(0.975 * BOOTSTRAP) - 1]


def analyse(records: list[Record], auto: str = AUTO) -> dict:
    """The run's figures (module docstring) from its records."""
    seconds = seconds_by_method(records)
    if "plain" not in seconds or auto not in seconds:
        raise ValueError(f"The records need 'plain' and {auto!r}; they hold {sorted(seconds)}.")
    plain, mine = seconds["plain"], seconds[auto]
    prompts = sorted(plain)
    fixed = [m for m in seconds if m not in ("plain", auto)]
    if not fixed:
        raise ValueError("The records hold no fixed configuration to compare the defaults with.")
    speedups = {m: pooled_ratio(seconds[m], plain, prompts) for m in seconds if m != "plain"}
    best = max(fixed, key=speedups.get)
    low, high = bootstrap_interval(mine, seconds[best])
    per_prompt = {q: {"vs_plain": plain[q] / mine[q], "vs_best_fixed": seconds[best][q] / mine[q]} for q in prompts}
    machines = sorted({r.machine for r in records if r.machine})
    return {
        "machines": machines, "prompts": len(prompts), "auto": auto, "best_fixed": best,
        "speedup_over_plain": speedups,
        "auto_over_best_fixed": pooled_ratio(mine, seconds[best], prompts), "interval_95": [low, high],
        "below_plain": sorted(q for q, v in per_prompt.items() if v["vs_plain"] < SLOW),
        "below_best_fixed": sorted(q for q, v in per_prompt.items() if v["vs_best_fixed"] < SLOW),
        "mismatches": sorted(f"{r.method} on {r.question_id}" for r in records if not r.matches_plain),
        "per_prompt": per_prompt,
    }


def report(result: dict) -> str:
    """results.md from results.json."""
    rows = "\n".join(f"| `{m}` | {s:.2f}x |" + (" best fixed |" if m == result["best_fixed"] else
                                                 " defaults |" if m == result["auto"] else " |")
                     for m, s in sorted(result["speedup_over_plain"].items(), key=lambda kv: -kv[1]))
    low, high = result["interval_95"]
    return (
        f"# Defaults against every fixed configuration ({result['prompts']} prompts)\n\n"
        f"Machine: {', '.join(result['machines']) or 'unknown'}. Greedy; each prompt runs every method in turn.\n\n"
        "| method | speedup over plain (pooled) | |\n|---|---|---|\n" + rows + "\n\n"
        f"Defaults / best fixed configuration (`{result['best_fixed']}`): **{result['auto_over_best_fixed']:.3f}x** "
        f"(paired bootstrap 95% interval {low:.3f}-{high:.3f}).\n\n"
        f"Prompts where the defaults run below {SLOW}x plain: {len(result['below_plain'])} of {result['prompts']}; "
        f"below {SLOW}x the best fixed configuration: {len(result['below_best_fixed'])}.\n\n"
        f"Outputs differing from plain greedy: {len(result['mismatches'])}"
        + (f" ({'; '.join(result['mismatches'])})" if result["mismatches"] else "") + ".\n"
    )


def plot(result: dict, path: Path) -> None:
    """Per prompt, the defaults' speed over the best fixed configuration's and over plain, each sorted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("vs_best_fixed", f"over the best fixed ({result['best_fixed']})"), ("vs_plain", "over plain")):
        values = sorted(v[key] for v in result["per_prompt"].values())
        ax.plot(range(1, len(values) + 1), values, marker=".", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axhline(SLOW, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("prompt (sorted)")
    ax.set_ylabel("defaults' speed ratio")
    ax.set_title("Defaults per prompt")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="bench folder (records.jsonl); the report goes to OUT/regret")
    parser.add_argument("--analyse-only", action="store_true", help="report on the records already in --out")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default=None, help="drafter folder (required unless --analyse-only)")
    parser.add_argument("--prompts", default=None, help="JSONL prompts (default: Spec-Bench)")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt-format", default="chat")
    parser.add_argument("--methods", default=",".join((AUTO, *FIXED)), help="the defaults first, then fixed ones")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if not args.analyse_only:
        if args.drafter is None:
            parser.error("--drafter is required unless --analyse-only")
        from hf_dynaspec.cli import main as cli

        bench = ["bench", "--target", args.target, "--drafter", args.drafter, "--methods", f"plain,{args.methods}",
                 "--max-new-tokens", str(args.max_new_tokens), "--out", args.out, "--prompt-format", args.prompt_format]
        bench += ["--prompts", args.prompts] if args.prompts else []
        bench += ["--limit", str(args.limit)] if args.limit else []
        bench += ["--threads", str(args.threads)] if args.threads else []
        cli(bench)  # non-zero on a mismatch: reported below too
    result = analyse(read_records(Path(args.out) / "records.jsonl"), parse_methods(args.methods)[0])
    out = Path(args.out) / "regret"
    print(save_results(out, result, report))
    plot(result, out / "regret.png")
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

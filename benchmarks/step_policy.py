"""Never slower than plain: per-prompt speedups of a Spec-Bench run with and without the step policy.

Reads the records of one `hf-dynaspec bench` run (plain and the speculative methods measured in the same
process) and writes, under --out:
- `results.json` / `results.md`: per method the pooled speedup over plain (ratio of summed times, as the bench
  reports it), the prompts below 0.95x plain before and after re-running them, the policy's predicted against
  realised accepted length (per run, and pooled), plain / lookup steps and mean tree size;
- `speedup_sorted.png`: each method's per-prompt speedups, sorted (the distribution, before and after).

A prompt below 0.95x counts only after `--rerun`: it is run again paired with plain, in `ROUNDS` alternating rounds
(plain, method, plain, method, ...), and its speedup becomes the ratio of the summed times of those rounds; the
rounds go to `reruns.jsonl` (a stopped rerun resumes). So noise is told from loss, and both counts are reported.

    python benchmarks/step_policy.py --bench benchmarks/results/cpu-smollm2-step-policy --rerun --readme

The rerun loads the target the bench folder names (its run.json) and, unless --drafter names one, the drafter
shipped for it; a drafter whose weights differ from the bench's is refused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_io, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a source checkout

from results_io import save_results  # noqa: E402

from hf_dynaspec.bench import Record, earlier_meta, read_records, write_doc_block  # noqa: E402
from hf_dynaspec.generation.loop.stats import SpeculativeStats  # noqa: E402

SLOW = 0.95  # a prompt below this speedup over plain is "slower than plain"
ROUNDS = 3
README = Path(__file__).resolve().parent.parent / "docs" / "results.md"  # where --readme writes


def per_prompt(records: list[Record]) -> dict[str, dict[str, float]]:
    """{method: {question id: plain seconds / method seconds}} over the prompts each method ran."""
    plain = {r.question_id: r.seconds for r in records if r.method == "plain"}
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r.method != "plain" and r.question_id in plain:
            out[r.method][r.question_id] = plain[r.question_id] / r.seconds
    return dict(out)


def pooled(records: list[Record], method: str) -> float:
    """Summed plain seconds over summed method seconds, on the prompts both ran."""
    mine = {r.question_id: r.seconds for r in records if r.method == method}
    plain = {r.question_id: r.seconds for r in records if r.method == "plain" and r.question_id in mine}
    return sum(plain.values()) / sum(mine[q] for q in plain)


def prediction(records: list[Record], method: str) -> dict | None:
    """The policy's predicted vs realised accepted length: pooled, and the mean per-run deviation (each run
    counted once, and weighted by its steps that verified a draft: a short run's deviation is mostly its few
    steps' noise); where the records carry the prediction's variance (its own model's noise,
    `policy.accepted_variance`), each run's z = (realised - predicted) / sqrt(variance) summed over its steps:
    within 2 in about 95% of the runs and centred on 0 when the prediction is honest, whatever the runs' lengths."""
    runs = [SpeculativeStats.from_dict(r.stats) for r in records if r.method == method and r.stats]
    runs = [s for s in runs if s.predicted_steps]
    if not runs:
        return None
    ratios = [s.predicted_tokens / s.realized_tokens for s in runs]
    total = SpeculativeStats.merged(runs)
    result = {"pooled_ratio": total.predicted_tokens / total.realized_tokens,
              "predicted": total.predicted_accepted_length, "realized": total.realized_accepted_length,
              "mean_abs_deviation": statistics.fmean(abs(x - 1) for x in ratios),
              "step_weighted_deviation": statistics.fmean([abs(x - 1) for x in ratios],
                                                          weights=[s.predicted_steps for s in runs]),
              "runs_within_10pct": sum(abs(x - 1) <= 0.10 for x in ratios), "runs": len(ratios)}
    z = [(s.realized_tokens - s.predicted_tokens) / s.predicted_variance ** 0.5 for s in runs
         if s.predicted_variance > 0]
    if z:
        result |= {"z_runs": len(z), "z_within_2": sum(abs(x) <= 2 for x in z), "z_mean": statistics.fmean(z)}
    return result


def step_mix(records: list[Record], method: str) -> dict:
    total = SpeculativeStats.merged([SpeculativeStats.from_dict(r.stats) for r in records
                                     if r.method == method and r.stats])
    return {"steps": total.steps, "plain_steps": total.plain_steps, "lookup_steps": total.lookup_steps,
            "mean_tree_size": total.mean_tree_size, "mean_accepted_length": total.mean_accepted_length,
            "mismatches": sum(not r.matches_plain for r in records if r.method == method)}


def read_reruns(path: Path) -> dict[tuple[str, str], dict]:
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(row["method"], row["question_id"]): row for row in rows}


DRAFTERS = Path(__file__).resolve().parent.parent / "drafters"
SHIPPED_DRAFTERS = {"HuggingFaceTB/SmolLM2-135M-Instruct": DRAFTERS / "smollm2-135m-instruct",
                    "google/gemma-3-270m": DRAFTERS / "gemma-3-270m"}  # a bench's target (run.json) -> its drafter


def rerun(bench: Path, drafter_dir: str | None, slow: dict[str, list[str]]) -> None:
    """Each (method, prompt) of `slow` again, paired with plain in ROUNDS alternating rounds (appended to
    reruns.jsonl; pairs already there are skipped), with the bench's target and drafter (`bench_models`)."""
    from tqdm.auto import tqdm

    from hf_dynaspec.bench import run_method
    from hf_dynaspec.bench_prompts import load_bench_prompts
    from hf_dynaspec.targets import encode_formatted, load_target

    path = bench / "reruns.jsonl"
    done = read_reruns(path)
    todo = [(m, q) for m, qids in slow.items() for q in qids if (m, q) not in done]
    if not todo:
        return
    run = json.loads((bench / "run.json").read_text())
    target, tokenizer, drafter = bench_models(run, drafter_dir, load_target)
    source = bench_prompt_source(bench)
    prompts = {row["question_id"]: row for row in load_bench_prompts(None if source == "Spec-Bench" else source)}
    for method, qid in tqdm(todo, desc="rerun", unit="prompt"):
        ids = encode_formatted(tokenizer, prompts[qid]["prompt"], run["prompt_format"])
        plain_s, method_s = [], []
        for _ in range(ROUNDS):
            plain_s.append(run_method(target, drafter, "plain", ids, run["max_new_tokens"])[1])
            method_s.append(run_method(target, drafter, method, ids, run["max_new_tokens"])[1])
        with open(path, "a") as file:
            file.write(json.dumps({"method": method, "question_id": qid, "plain_seconds": plain_s,
                                   "method_seconds": method_s}) + "\n")


def bench_models(run: dict, drafter_dir: str | Path | None, load_target) -> tuple:
    """(target, tokenizer, drafter) a bench folder was measured with: the target its run.json names, the drafter
    `drafter_dir` or the one shipped for that target, checked against the run's drafter weights digest."""
    from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.bench import run_identity

    drafter_dir = drafter_dir or SHIPPED_DRAFTERS.get(run["target"])
    if drafter_dir is None:
        raise SystemExit(f"the bench ran {run['target']}, which has no shipped drafter here: pass --drafter DIR")
    target, tokenizer = load_target(run["target"])
    drafter = DynaSpecDrafter.from_pretrained(drafter_dir).bind(target).eval()  # as the bench digests it
    digest = run_identity(target, drafter, run["max_new_tokens"], run["prompt_format"])["drafter_weights_sha256"]
    if digest != run["drafter_weights_sha256"]:
        raise SystemExit(f"{drafter_dir} is not the drafter this bench measured (weights digest {digest}, the bench's "
                         f"{run['drafter_weights_sha256']}): pass the bench's drafter with --drafter DIR")
    return target, tokenizer, drafter


def analyse(records: list[Record], reruns: dict[tuple[str, str], dict], meta: dict) -> dict:
    speedups = per_prompt(records)
    methods = {}
    for method, by_prompt in speedups.items():
        slow = sorted(q for q, s in by_prompt.items() if s < SLOW)
        after = {q: sum(reruns[(method, q)]["plain_seconds"]) / sum(reruns[(method, q)]["method_seconds"])
                 for q in slow if (method, q) in reruns}
        methods[method] = {
            "pooled_speedup": pooled(records, method), "prompts": len(by_prompt),
            "median_speedup": statistics.median(by_prompt.values()), "lowest_speedup": min(by_prompt.values()),
            "below_first_run": len(slow), "rerun": len(after),
            "below_after_rerun": sum(s < SLOW for s in after.values()) + len(slow) - len(after),
            "slow_prompts": {q: {"first": by_prompt[q], "rerun": after.get(q)} for q in slow},
            "per_prompt": by_prompt, "prediction": prediction(records, method), **step_mix(records, method),
        }
    return {"meta": meta, "methods": methods}


def bench_prompt_source(bench: Path) -> str:
    """The prompts an `hf-dynaspec bench` folder ran: its meta's `prompt_source` (the --prompts file), else
    Spec-Bench (runs before that field, or no results.json yet)."""
    return earlier_meta(bench).get("prompt_source", "Spec-Bench")


def prompt_label(meta: dict) -> str:
    """What the run's prompts were: Spec-Bench, or the file `hf-dynaspec bench --prompts` read (its stem)."""
    source = meta.get("prompt_source", "Spec-Bench")
    return source if source == "Spec-Bench" else f"`{Path(source).stem}`"


def report(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Per-prompt speedups and the step policy\n\n{meta['prompts']} {prompt_label(meta)} prompts, greedy, "
             f"{meta['max_new_tokens']} new tokens, fp32, batch 1, on {meta['machine']}; `{meta['bench']}`.\n",
             f"A prompt below {SLOW}x is run again paired with plain ({ROUNDS} alternating rounds) before it counts.\n",
             "| method | pooled speedup | median / lowest per prompt | below 0.95x: first run / after rerun "
             "| accepted length | tree nodes per step | plain / lookup steps | predicted vs realised accepted length "
             "(per-run mean deviation, by steps; runs within 10%; runs within 2 sd of the model's own noise, mean z) "
             "| mismatches |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method, m in result["methods"].items():
        p = m["prediction"]
        pred = "" if p is None else (f"{p['predicted']:.2f} vs {p['realized']:.2f} ({p['pooled_ratio']:.3f}x; mean "
                                     f"deviation {p['mean_abs_deviation']:.1%}, {p['step_weighted_deviation']:.1%} by "
                                     f"steps, {p['runs_within_10pct']}/{p['runs']}"
                                     + (f"; {p['z_within_2']}/{p['z_runs']}, z {p['z_mean']:+.2f}" if "z_runs" in p
                                        else "") + ")")
        lines.append(f"| `{method}` | {m['pooled_speedup']:.2f}x | {m['median_speedup']:.2f}x / "
                     f"{m['lowest_speedup']:.2f}x | {m['below_first_run']} / {m['below_after_rerun']} of "
                     f"{m['prompts']} | {m['mean_accepted_length']:.2f} | {m['mean_tree_size']:.2f} | "
                     f"{m['plain_steps']} / {m['lookup_steps']} of {m['steps']} | {pred} | {m['mismatches']} |")
    lines.append("\nSorted per-prompt speedups: `speedup_sorted.png`.\n")
    return "\n".join(lines)


def plot(result: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, m in result["methods"].items():
        values = sorted(m["per_prompt"].values())
        ax.plot(range(1, len(values) + 1), values, label=f"{method} ({m['pooled_speedup']:.2f}x pooled)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(SLOW, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("prompts, sorted by speedup")
    ax.set_ylabel("speedup over plain (same run)")
    ax.set_title(f"Per-prompt speedup, first run ({result['meta']['machine'].split(',')[0]})")
    ax.legend(fontsize=8)
    path = out / "speedup_sorted.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", type=Path, required=True, help="an `hf-dynaspec bench` folder")
    parser.add_argument("--out", type=Path, default=None, help="default: <bench>/step-policy")
    parser.add_argument("--rerun", action="store_true", help="re-run the prompts below 0.95x paired with plain")
    parser.add_argument("--rerun-methods", default=None, help="comma-separated: rerun only these methods' slow prompts")
    parser.add_argument("--drafter", default=None, help="default: the drafter shipped for the bench's target")
    parser.add_argument("--readme", action="store_true", help="write the step-policy-smollm2 block of docs/results.md")
    args = parser.parse_args(argv)
    out = args.out or args.bench / "step-policy"
    records = read_records(args.bench / "records.jsonl")
    if args.rerun:
        wanted = args.rerun_methods.split(",") if args.rerun_methods else None
        slow = {m: [q for q, s in by.items() if s < SLOW] for m, by in per_prompt(records).items()
                if wanted is None or m in wanted}
        rerun(args.bench, args.drafter, slow)
    machines = sorted({r.machine for r in records if r.machine})
    meta = {"bench": str(args.bench), "prompts": len({r.question_id for r in records}),
            "max_new_tokens": json.loads((args.bench / "run.json").read_text())["max_new_tokens"],
            "machine": "; ".join(machines),
            "prompt_source": bench_prompt_source(args.bench)}
    result = analyse(records, read_reruns(args.bench / "reruns.jsonl"), meta)
    text = save_results(out, result, report)
    plot(result, out)
    if args.readme:
        write_doc_block(README, "step-policy-smollm2", text.split("\n", 2)[2].strip())
    print(text)
    return result


if __name__ == "__main__":
    main()

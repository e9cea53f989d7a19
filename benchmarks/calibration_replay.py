"""How honest the step policy's predicted accepted length is per run, for calibrations that forget at different rates.

Step 1 (`--log`, needs the models): decode each prompt with the drafter's defaults (greedy, 128 new tokens) and log
every verified step of its run: the tree (parents, depths, lookup flags, draft log-probabilities) and the accepted
path, one JSON line per prompt in <out>/<name>.jsonl (a stopped run resumes).

Step 2 (always): replay the logged steps through `policy.Calibration` with each `--decays` value (1.0: counts pooled
over the whole sequence, as before `CALIBRATION_DECAY`; the shipped prior weights), and with each
`--lookup-weights` value (what the lookup rate's prior, the depth above's rate, is worth; the shipped decay), runs in
order with the last run's calibration carried
(`Calibration.carried`), as in one process of `hf-dynaspec bench`. Per run: the predicted accepted length of every
step that verified a draft (E = sum of the acceptance estimates a_i of its tree, before the step is counted) against
the realised one, pooled over the run, and z = (realised - predicted) / sd with the policy's own variance
(`policy.accepted_variance`). Reported per decay: runs within 10%, mean |deviation|, pooled ratio, runs with |z| < 2
(an honest model puts ~95% there), mean z. The trees are those the logged run verified: a replay measures the
estimates, not the decisions they would have led to.

    python benchmarks/calibration_replay.py --log data/tuning_prompts.jsonl --name tuning \
        --out benchmarks/results/cpu-smollm2-calibration-replay
    python benchmarks/calibration_replay.py --log spec-bench --limit 2 --name spec-bench \
        --out benchmarks/results/cpu-smollm2-calibration-replay
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import save_results  # noqa: E402

from hf_dynaspec.generation.planning.policy import (  # noqa: E402
    CALIBRATION_DECAY,
    CARRY_WEIGHT,
    LOOKUP_PRIOR_WEIGHT,
    Calibration,
    acceptance_estimates,
    accepted_variance,
)

DECAYS = (1.0, 0.95, 0.9, CALIBRATION_DECAY, 0.8, 0.7)
LOOKUP_WEIGHTS = (2.0, 1.0, LOOKUP_PRIOR_WEIGHT, 0.25)


def log_runs(args: argparse.Namespace, path: Path) -> None:
    """Decode every prompt not yet in `path` and append its verified steps."""
    import torch
    from tqdm.auto import tqdm

    from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.bench_prompts import load_bench_prompts
    from hf_dynaspec.generation.planning import policy
    from hf_dynaspec.targets import encode_formatted, load_target

    prompts = load_bench_prompts(None if args.log == "spec-bench" else args.log, limit=args.limit)
    done = {json.loads(line)["question_id"] for line in path.read_text().splitlines()} if path.exists() else set()
    todo = [p for p in prompts if p["question_id"] not in done]
    if not todo:
        return
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target)
    steps: list[dict] = []
    record = policy.StepPolicy.record

    def logged(self, plan, tree, path_, *rest, **kwargs):
        steps.append(dict(parents=tree.parent_list, depths=tree.depth_list, grafted=[bool(g) for g in tree.grafted_list],
                          log_q=tree.log_q_list, path=list(path_)))
        return record(self, plan, tree, path_, *rest, **kwargs)

    policy.StepPolicy.record = logged
    try:
        with path.open("a") as sink:
            for prompt in tqdm(todo, desc="runs", unit="run"):
                steps.clear()
                ids = encode_formatted(tokenizer, prompt["prompt"], args.prompt_format)
                with torch.no_grad():
                    target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter)
                sink.write(json.dumps(dict(question_id=prompt["question_id"], steps=steps)) + "\n")
                sink.flush()
    finally:
        policy.StepPolicy.record = record


def replay(runs: list[dict], decay: float, lookup_weight: float = LOOKUP_PRIOR_WEIGHT) -> dict:
    """Per-run predicted vs realised accepted length under a calibration with this `decay` and lookup prior weight
    (module docstring)."""
    calibration, per_run = None, []
    for run in runs:
        calibration = (Calibration(decay=decay, lookup_weight=lookup_weight) if calibration is None
                       else calibration.carried(CARRY_WEIGHT))
        predicted = realised = variance = 0.0
        for step in run["steps"]:
            tree = SimpleNamespace(parent_list=step["parents"], depth_list=step["depths"], grafted_list=step["grafted"],
                                   log_q_list=step["log_q"], num_nodes=len(step["parents"]))
            if tree.num_nodes > 1:
                a = acceptance_estimates(tree, calibration)
                predicted, realised = predicted + sum(a), realised + len(step["path"])
                variance += accepted_variance(tree, a)
            calibration.update(tree, step["path"])
        if realised:
            per_run.append(dict(question_id=run["question_id"], ratio=predicted / realised,
                                z=(realised - predicted) / math.sqrt(max(variance, 1e-12)), predicted=predicted,
                                realised=realised))
    deviations = [abs(r["ratio"] - 1.0) for r in per_run]
    return dict(decay=decay, lookup_weight=lookup_weight, runs=len(per_run), within_10pct=sum(d <= 0.10 for d in deviations),
                mean_deviation=statistics.fmean(deviations),
                pooled_ratio=sum(r["predicted"] for r in per_run) / sum(r["realised"] for r in per_run),
                within_2sd=sum(abs(r["z"]) < 2 for r in per_run), mean_z=statistics.fmean(r["z"] for r in per_run),
                per_run=per_run)


def report(result: dict) -> str:
    meta = result["meta"]
    lines = ["# Predicted vs realised accepted length per run, by calibration decay and lookup prior weight", "",
             f"Logged runs of `{meta['drafter']}` on `{meta['target']}` (greedy, defaults); each prompt set replayed "
             "with the calibration forgetting at each rate (1.0: no forgetting), then with the lookup rate's prior (the "
             f"depth above's rate) worth each weight. Shipped: decay {meta['shipped_decay']}, lookup prior weight "
             f"{meta['shipped_lookup_weight']}.", ""]
    for title, key, column in (("By decay (shipped lookup prior weight)", "sets", "decay"),
                               ("By lookup prior weight (shipped decay)", "weights", "lookup_weight")):
        lines += [f"## {title}", "", f"| prompts | {column.replace('_', ' ')} | runs within 10% | mean deviation "
                  "| pooled predicted / realised | runs with abs(z) < 2 | mean z |", "|---|---|---|---|---|---|---|"]
        for name, rows in result.get(key, {}).items():
            for r in rows:
                lines.append(f"| {name} | {r[column]} | {r['within_10pct']} / {r['runs']} | "
                             f"{100 * r['mean_deviation']:.1f}% | {r['pooled_ratio']:.3f} | {r['within_2sd']} / {r['runs']} "
                             f"| {r['mean_z']:+.2f} |")
        lines.append("")
    lines += ["Regenerate: `python benchmarks/calibration_replay.py --out <this folder> [--target ... --drafter ...]` "
              "(replays every logged set).", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Mean |predicted / realised - 1| per run against the decay and against the lookup prior weight, one line per
    prompt set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = result["meta"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, key, column, label, shipped in (
            (axes[0], "sets", "decay", "calibration decay per step (1.0: none)", meta["shipped_decay"]),
            (axes[1], "weights", "lookup_weight", "lookup prior weight (observations)", meta["shipped_lookup_weight"])):
        for name, rows in result[key].items():
            ax.plot([r[column] for r in rows], [100 * r["mean_deviation"] for r in rows], marker="o", label=name)
        ax.axhline(10.0, color="grey", lw=0.8, ls="--")
        ax.axvline(shipped, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(label)
    axes[0].set_ylabel("mean per-run deviation (%)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", default=None, help="prompts to log first: a JSONL file, or 'spec-bench'")
    parser.add_argument("--name", default=None, help="the logged set's name (its <name>.jsonl)")
    parser.add_argument("--limit", type=int, default=None, help="Spec-Bench / file prompts per category")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="drafters/smollm2-135m-instruct")
    parser.add_argument("--prompt-format", default="chat")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decays", type=lambda s: [float(x) for x in s.split(",")], default=list(DECAYS))
    parser.add_argument("--lookup-weights", type=lambda s: [float(x) for x in s.split(",")],
                        default=list(LOOKUP_WEIGHTS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.log is not None:
        if not args.name:
            parser.error("--log needs --name (the logged set's file name)")
        log_runs(args, args.out / f"{args.name}.jsonl")
    sets, weights = {}, {}
    for path in sorted(args.out.glob("*.jsonl")):
        runs = [json.loads(line) for line in path.read_text().splitlines()]
        sets[path.stem] = [replay(runs, decay) for decay in args.decays]
        weights[path.stem] = [replay(runs, CALIBRATION_DECAY, weight) for weight in args.lookup_weights]
    meta = dict(target=args.target, drafter=args.drafter, shipped_decay=CALIBRATION_DECAY,
                shipped_lookup_weight=LOOKUP_PRIOR_WEIGHT, carry_weight=CARRY_WEIGHT)
    result = {"meta": meta, "sets": sets, "weights": weights}
    print(save_results(args.out, result, report))
    plot(result, args.out / "deviation.png")
    return result


if __name__ == "__main__":
    main()

"""The README's speed table: each shipped drafter at its shipped defaults against plain decoding and transformers'
prompt lookup, per target and kind of task, measured in one resumable run per (target, task).

Each run is `hf-dynaspec bench` (every method on one prompt before the next, each output checked against plain
greedy, records appended as they come: a stopped run resumes) with the methods plain, prompt-lookup and
`defaults` (the drafter's own generation config, nothing overridden). Task kinds: chat (Spec-Bench, every
category but coding and translation; the chat template, or "Question: ... Answer:" for a base model), code (held-out
code files, continued as plain text) and multilingual (the multilingual slice; Gemma only: SmolLM2 is English).
transformers' assisted generation needs a smaller model of the target's family, and neither target has one.
Then it writes `--out`/results.json, results.md and speedups.png, the table between the README's `speedups`
markers, and each drafter's rows into its card's `speed` block (the card's first screen).

    python benchmarks/headline.py --limit-scale 1 --out benchmarks/results/cpu-headline-amd
    python benchmarks/headline.py --analyse-only --out benchmarks/results/cpu-headline-amd
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_io, beside this script
sys.path.insert(0, str(ROOT))  # run from a source checkout

from results_io import save_results  # noqa: E402

from hf_dynaspec.bench import Record, read_records, write_doc_block  # noqa: E402

METHODS = ("plain", "prompt-lookup", "defaults")
NOT_CHAT = ("coding", "translation")  # Spec-Bench categories counted as code / multilingual, not chat


@dataclass(frozen=True)
class Task:
    target: str  # `--target` name
    label: str  # as the README names the target
    drafter: str  # shipped drafter folder
    kind: str  # chat, code, multilingual
    prompts: str | None  # JSONL (None: Spec-Bench)
    limit: int  # prompts per category
    prompt_format: str


TASKS = (
    Task("smollm2", "SmolLM2-135M-Instruct", "drafters/smollm2-135m-instruct", "chat", None, 1, "chat"),
    Task("smollm2", "SmolLM2-135M-Instruct", "drafters/smollm2-135m-instruct", "code", "data/code_heldout.jsonl", 4,
         "plain"),
    Task("gemma3", "Gemma 3 270M (base)", "drafters/gemma-3-270m", "chat", None, 1, "qa"),
    Task("gemma3", "Gemma 3 270M (base)", "drafters/gemma-3-270m", "code", "data/code_heldout.jsonl", 4, "plain"),
    Task("gemma3", "Gemma 3 270M (base)", "drafters/gemma-3-270m", "multilingual", "data/multilingual_slice.jsonl", 1,
         "qa"),
)


def folder(out: Path, task: Task) -> Path:
    return out / f"{task.target}-{task.kind}"


def run_task(task: Task, out: Path, max_new_tokens: int, scale: int) -> None:
    """One resumable `hf-dynaspec bench` run of the task's prompts."""
    command = [sys.executable, "-m", "hf_dynaspec.cli", "bench", "--target", task.target, "--drafter", task.drafter,
               "--methods", ",".join(METHODS), "--limit", str(task.limit * scale), "--max-new-tokens",
               str(max_new_tokens), "--prompt-format", task.prompt_format, "--out", str(folder(out, task))]
    if task.prompts:
        command += ["--prompts", task.prompts]
    subprocess.run(command, cwd=ROOT, check=True)


def in_kind(record: Record, task: Task) -> bool:
    return task.prompts is not None or record.category not in NOT_CHAT


def task_figures(records: list[Record], task: Task) -> dict:
    """Plain tokens/s, each method's pooled speedup over plain (summed seconds, prompts every method finished),
    the defaults' accepted length and the mismatches of the task's records."""
    chosen = [r for r in records if in_kind(r, task)]
    done = {m: {r.question_id for r in chosen if r.method == m} for m in METHODS}
    common = set.intersection(*done.values())
    by = {m: [r for r in chosen if r.method == m and r.question_id in common] for m in METHODS}
    seconds = {m: sum(r.seconds for r in recs) for m, recs in by.items()}
    stats = [r.stats for r in by["defaults"] if r.stats]
    steps = sum(s["steps"] for s in stats)
    return {
        "target": task.label, "drafter": task.drafter, "kind": task.kind, "prompts": len(common),
        "plain_tokens_per_s": sum(r.new_tokens for r in by["plain"]) / max(seconds["plain"], 1e-9),
        "speedup": {m: seconds["plain"] / seconds[m] for m in METHODS if m != "plain" and seconds[m] > 0},
        "accepted_length": sum(s["accepted_tokens"] for s in stats) / steps if steps else None,
        "mismatches": sum(not r.matches_plain for r in chosen if r.question_id in common),
        "machines": sorted({r.machine for r in chosen if r.machine}),
    }


def figure_cells(t: dict) -> str:
    """A task's measured cells: prompts, plain tok/s, prompt lookup's and the defaults' speedups, accepted length."""
    accepted = f"{t['accepted_length']:.2f}" if t["accepted_length"] else ""
    return (f"{t['prompts']} | {t['plain_tokens_per_s']:.1f} | {t['speedup']['prompt-lookup']:.2f}x | "
            f"**{t['speedup']['defaults']:.2f}x** | {accepted} |")


def readme_table(result: dict) -> str:
    """The README block: one row per (target, task kind)."""
    rows = ["| target | task | prompts | plain tok/s | prompt lookup (transformers) | DynaSpec, shipped defaults "
            "| tokens per target step |", "|---|---|---|---|---|---|---|"]
    rows += [f"| {t['target']} | {t['kind']} | {figure_cells(t)}" for t in result["tasks"]]
    machines = sorted({m for t in result["tasks"] for m in t["machines"]})
    rows.append("")
    rows.append(f"Greedy, fp32, batch 1, {result['max_new_tokens']} new tokens; speedup = plain's summed seconds over "
                f"the method's on the same prompts, every output checked equal to plain greedy "
                f"({sum(t['mismatches'] for t in result['tasks'])} mismatches). Machine: {'; '.join(machines)}. "
                f"Source: `{result['out']}` (`python benchmarks/headline.py`).")
    return "\n".join(rows)


def card_block(result: dict, drafter: str) -> str | None:
    """The `speed` block of a drafter's card: its rows of the run (None: the run has none)."""
    tasks = [t for t in result["tasks"] if t["drafter"] == drafter]
    if not tasks:
        return None
    rows = ["Speed at the shipped defaults (this folder's `generation_config.json`), against plain `generate()`:", "",
            "| task | prompts | plain tok/s | prompt lookup (transformers) | this drafter | tokens per target step |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {t['kind']} | {figure_cells(t)}" for t in tasks]
    machines = sorted({m for t in tasks for m in t["machines"]})
    rows += ["", f"Greedy, fp32, batch 1, {result['max_new_tokens']} new tokens, every output identical to plain "
             f"greedy ({sum(t['mismatches'] for t in tasks)} mismatches); {'; '.join(machines)}; "
             f"`{result['out']}` in the hf-dynaspec repository. CPU figures: they vary with the processor."]
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{t['target'].split(' (')[0]}\n{t['kind']}" for t in result["tasks"]]
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 2, 3.6))
    width = 0.38
    for i, (method, name) in enumerate((("prompt-lookup", "prompt lookup"), ("defaults", "DynaSpec defaults"))):
        values = [t["speedup"][method] for t in result["tasks"]]
        ax.bar([x + (i - 0.5) * width for x in range(len(labels))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("speedup over plain greedy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def analyse(out: Path, max_new_tokens: int) -> dict:
    tasks = [task_figures(read_records(folder(out, t) / "records.jsonl"), t) for t in TASKS
             if (folder(out, t) / "records.jsonl").is_file()]
    return {"out": str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out), "max_new_tokens": max_new_tokens,
            "methods": list(METHODS), "tasks": tasks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--limit-scale", type=int, default=1, help="multiply each task's prompts per category")
    parser.add_argument("--only", default=None, help="comma-separated targets to run (default: all)")
    parser.add_argument("--analyse-only", action="store_true", help="rewrite the report from the records")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if not args.analyse_only:
        for task in TASKS:
            if args.only is None or task.target in args.only.split(","):
                run_task(task, out, args.max_new_tokens, args.limit_scale)
    result = analyse(out, args.max_new_tokens)
    if not result["tasks"]:
        raise SystemExit(f"No records under {out}: run without --analyse-only first.")
    text = save_results(out, result, lambda r: "# Speed at the shipped defaults\n\n" + readme_table(r) + "\n")
    plot(result, out / "speedups.png")
    write_doc_block(args.readme, "speedups", readme_table(result))
    for drafter in sorted({t["drafter"] for t in result["tasks"]}):
        card = ROOT / drafter / "README.md"
        if card.is_file():
            write_doc_block(card, "speed", card_block(result, drafter))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

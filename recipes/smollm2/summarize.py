"""The results summary of a committed Spec-Bench run: the model card's headline section (`export.py`) and the
"SmolLM2" section of docs/results.md.

Every number comes from the run's `results.json` (and `early-exit/results.json` when that side run exists),
so the summary cannot drift from the measurements.

    python recipes/smollm2/summarize.py --bench benchmarks/results/cpu-smollm2-full
    python recipes/smollm2/summarize.py --bench benchmarks/results/cpu-smollm2-eagle3-stage3 \
        --previous benchmarks/results/cpu-smollm2-full --readme
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.bench import (
    Record,
    Summary,
    headline_table,
    speedup_cell,
    summarize,
    write_doc_block,
)
from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.generation.loop.stats import SpeculativeStats
from hf_dynaspec.sharing import TREE_TUNING

ROOT = Path(__file__).resolve().parents[2]
TUNING_IDS = Path(__file__).with_name("tuning_question_ids.json")  # the EAGLE-1 drafter's tree was chosen on these
README_BLOCK = "smollm2-results"  # the README's results section, written by --readme

# row labels of the overall table, in order; methods missing from the run are skipped
LABELS = {
    "plain": "plain `generate()`",
    "prompt-lookup": "prompt lookup decoding (transformers)",
    "early-exit": "`assistant_early_exit` self-speculation (transformers)",
    "dynaspec": "**DynaSpec** (router shortlist), default tree + lookup branch",
    "dynaspec-dyspec": "same, DySpec tree policy",
    "full": "same tree + lookup, full-vocabulary head",
    "static": "same tree + lookup, static frequent-token shortlist (FR-Spec-style)",
    "dynaspec[lookup_num_tokens=0]": "DynaSpec, tree without the lookup branch",
    "full[lookup_num_tokens=0]": "full-vocabulary head, tree without lookup (EAGLE-2-style)",
}


def load(path: Path) -> tuple[dict, list[Summary]]:
    payload = json.loads(path.read_text())
    return payload, [Summary(**s) for s in payload["summaries"]]


def overall_row(s: Summary, vocab: float, side_run: str = "") -> str:
    if s.method in ("plain", "prompt-lookup", "early-exit"):
        name = LABELS[s.method] + (f" ({s.tokens_per_s:.1f} tok/s)" if s.method == "plain" else "") + side_run
        return f"| {name} | {speedup_cell(s, 'plain') if s.method != 'plain' else '1.00x'} | | | |"
    lookup = s.extra.get("lookup_share", 0.0)
    accepted = f"{s.mean_accepted_length:.2f}" + (f" ({lookup:.0%} from lookup)" if lookup else "")
    recovery = f"{s.extra['recovery_vs_full']:.1%}" if "recovery_vs_full" in s.extra else ""
    recall = f" ({s.shortlist_recall:.1%})" if s.shortlist_recall is not None and s.shortlist_recall < 1 else ""
    shortlist = f"{s.mean_shortlist_size:,.0f} = {s.mean_shortlist_size / vocab:.1%}{recall}"
    return f"| {LABELS[s.method]} | {speedup_cell(s, 'plain')} | {accepted} | {recovery} | {shortlist} |"


def describe_defaults(fields: dict) -> str:
    """"`tree_policy='eagle2'`, `num_draft_nodes=8`, ...": a drafter's speculative defaults."""
    return ", ".join(f"`{k}={v!r}`" for k, v in fields.items())


def drafter_defaults(drafter: str) -> str:
    """The speculative defaults of the drafter a run measured (its folder, relative to the repo root), with its
    CPU tree (`device_trees["cpu"]`: these runs measure on a CPU) in place of the flat tree fields."""
    fields = DynaSpecGenerationConfig.from_pretrained(ROOT / drafter).speculative_fields()
    trees = fields.pop("device_trees", {})
    return describe_defaults({**fields, **trees.get("cpu", {})})


def held_out_text(records: list[dict], drafter: str) -> str:
    """Which prompts the drafter's default tree was chosen on, and the headline figures without them."""
    tuning = ROOT / drafter / TREE_TUNING
    if tuning.is_file():
        meta = json.loads(tuning.read_text())["meta"]
        return (f"The default tree was chosen on {meta['prompts']} prompts outside Spec-Bench (`{meta['prompt_file']}`, "
                f"`{TREE_TUNING}` in the drafter's folder), so every prompt here is held out.")
    tuned = {str(i) for i in json.loads(TUNING_IDS.read_text())["question_ids"]}
    rest = summarize([Record(**r) for r in records if str(r["question_id"]) not in tuned])
    by = {(s.method, s.category): s for s in rest}
    prompts = len({r["question_id"] for r in records} - tuned)
    full = [s for s in rest if s.method == "full" and s.category != "overall"]
    low = min(full, key=lambda s: s.mean_accepted_length)
    dyn, full_all = by[("dynaspec", "overall")], by[("full", "overall")]
    return (
        f"The default was chosen on {len(tuned)} Spec-Bench prompts (the 6th of each category, "
        f"`{TUNING_IDS.name}`) that are among those measured here; on the other {prompts}: DynaSpec "
        f"{dyn.speedup:.2f}x, accepted length {dyn.mean_accepted_length:.2f} (full head {full_all.mean_accepted_length:.2f}, "
        f"lowest category {low.category} {low.mean_accepted_length:.2f})."
    )


def static_verdict(static: Summary, dyn: Summary, tolerance: float = 0.02) -> str:
    """How the static frequency shortlist of about the same size compares with DynaSpec's, from the figures."""
    ratio = static.speedup / dyn.speedup
    word = "as fast" if abs(ratio - 1) <= tolerance else ("faster" if ratio > 1 else "slower")
    return (f"a static frequency shortlist of about the same size is {word} ({static.speedup:.2f}x vs {dyn.speedup:.2f}x; "
            f"accepted length {static.mean_accepted_length:.2f} vs {dyn.mean_accepted_length:.2f}, recall "
            f"{static.shortlist_recall:.0%} vs {dyn.shortlist_recall:.0%})")


def verification_cost(records: list[dict], method: str = "dynaspec") -> tuple[float, float]:
    """(mean cost of one verification, forward and walk, in plain decoding steps; the speedup over plain
    the same steps would give if a verification cost one plain step), over the whole run."""
    plain = [r for r in records if r["method"] == "plain"]
    spec = [r for r in records if r["method"] == method]
    plain_seconds = sum(r["seconds"] for r in plain)
    plain_step = plain_seconds / sum(r["new_tokens"] for r in plain)  # seconds per token, prefill included
    stats = SpeculativeStats.merged([SpeculativeStats.from_dict(r["stats"]) for r in spec])
    steps, verify = stats.steps, stats.time("verify")
    as_one_step = sum(r["seconds"] for r in spec) - verify + steps * plain_step
    return verify / steps / plain_step, plain_seconds / as_one_step


def summary_text(bench: Path) -> str:
    payload, summaries = load(bench / "results.json")
    meta = payload["meta"]
    overall = {s.method: s for s in summaries if s.category == "overall"}
    vocab = overall["full"].mean_shortlist_size  # the full head's "shortlist" is the whole vocabulary
    side, note = bench / "early-exit" / "results.json", ""
    if side.is_file():
        side_payload, side_summaries = load(side)
        overall["early-exit"] = next(s for s in side_summaries if s.category == "overall" and s.method == "early-exit")
        note = f", {side_payload['meta']['prompts']} prompts, `early-exit/`"
    records = payload["records"]
    speculative = [r for r in records if r["method"] != "plain"]
    mismatches = sum(not r["matches_plain"] for r in speculative)
    rows = [overall_row(overall[m], vocab, note if m == "early-exit" else "") for m in LABELS if m in overall]
    dyn, full, static = overall["dynaspec"], overall["full"], overall["static"]
    shares = {s.category: s.extra.get("lookup_share", 0.0) for s in summaries if s.method == "dynaspec"}
    top = sorted(shares, key=shares.get, reverse=True)[:2]
    rest = [v for c, v in shares.items() if c not in top and c != "overall"]
    bare = overall.get("dynaspec[lookup_num_tokens=0]")
    per_category = Counter(r["category"] for r in records if r["method"] == "plain")
    lift = f" from {bare.mean_accepted_length:.2f} to {dyn.mean_accepted_length:.2f}" if bare else ""
    cost, as_one_step = verification_cost(records)
    scope = (
        "all of them, 13 categories" if meta["prompts"] == len(load_bench_prompts())
        else f"the first {max(per_category.values())} of each category, or all of a smaller one"
    )
    return "\n".join([
        f"Spec-Bench, {meta['prompts']} prompts ({scope}), greedy, {meta['max_new_tokens']} new tokens, fp32 target, batch 1, on "
        f"{meta['machine']}; {mismatches} mismatches with plain greedy over {len(speculative)} speculative runs. "
        f"Full tables, per-prompt records and plots: `{bench.as_posix()}/`. The drafter's defaults on a "
        f"CPU (`generation_config.json`): {drafter_defaults(meta['drafter'])}. " + held_out_text(records, meta["drafter"]),
        "",
        "Speedups carry their paired bootstrap 95% interval over prompts; * marks a difference that is significant "
        "(Wilcoxon signed-rank test over prompts, p < 0.05; local `evaluate` module `paired_speedup`).",
        "",
        "| method | speedup vs plain | accepted length | recovery vs full head | mean shortlist (recall) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "Per category (DynaSpec, default settings, against plain and the same tree with the other heads):",
        "",
        headline_table(summaries, "dynaspec"),
        "",
        f"The lookup branch lifts the accepted length{lift}, supplying {shares[top[1]]:.0%}-{shares[top[0]]:.0%} of the emitted tokens on {top[1]} and {top[0]} (where "
        f"SmolLM2 copies its prompt) and {min(rest):.0%}-{max(rest):.0%} elsewhere. The shortlisted head makes "
        f"drafting cheap (DynaSpec {dyn.extra['speedup_vs_full']:.2f}x faster than the same tree with the full head); "
        f"on this CPU {static_verdict(static, dyn)}. Verification is "
        f"{dyn.verify_share:.0%} of DynaSpec's time, drafting {dyn.draft_share:.0%} (head {dyn.head_share:.0%}, "
        f"router {dyn.router_share:.1%}); {full.head_share:.0%} of the full-head run goes to its head. One "
        f"verification (target forward over the tree, then the walk) costs {cost:.2f} plain decoding steps on "
        f"average; were it as cheap as one step (as on GPUs for small trees), the same accepted lengths would "
        f"give {as_one_step:.2f}x.",
    ])


def previous_text(bench: Path, previous: Path) -> str:
    """Accepted lengths of this run's drafter and of a previous one (another run) on the prompts both measured,
    with and without the lookup branch. Speeds are not compared: the runs may come from other machines."""
    runs = [json.loads((folder / "results.json").read_text()) for folder in (bench, previous)]
    shared = set.intersection(*({r["question_id"] for r in run["records"] if r["method"] == "plain"} for run in runs))
    cells = []
    for method, label in (("dynaspec", "with the lookup branch"), ("dynaspec[lookup_num_tokens=0]", "without")):
        kept = [[SpeculativeStats.from_dict(r["stats"]) for r in run["records"]
                 if r["method"] == method and r["question_id"] in shared] for run in runs]
        if all(kept):
            now, before = (SpeculativeStats.merged(k).mean_accepted_length for k in kept)
            cells.append(f"{now:.2f} against {before:.2f} {label}")
    return (f"On the {len(shared)} prompts that `{previous.as_posix()}` (the previous drafter, on "
            f"{runs[1]['meta']['machine']}) also measured, the accepted length is {' and '.join(cells)}; speeds are "
            "not compared across the two runs.")


def quality_text(folder: Path) -> str:
    """One paragraph from a `hf-dynaspec quality` run (results.json): sampled accuracy of both methods with
    their intervals, the McNemar test, greedy text agreement."""
    summary = json.loads((folder / "results.json").read_text())["summary"]
    plain, dyn = summary["methods"]["plain-sample"], summary["methods"]["dynaspec-sample"]
    paired = summary["mcnemar_dynaspec_vs_plain_sampling"]
    lo, hi = paired["difference_ci"]
    verdict = "not significant" if paired["p_value"] > 0.05 else "significant"
    return (
        f"Sampling quality (GSM8K test, first {summary['questions']} questions, temperature 0.7, top-p 0.9, "
        f"`{folder.as_posix()}/`): final-answer exact match {dyn['accuracy']:.1%} with DynaSpec sampling vs "
        f"{plain['accuracy']:.1%} with plain sampling (95% intervals {dyn['accuracy_ci'][0]:.1%}-"
        f"{dyn['accuracy_ci'][1]:.1%} and {plain['accuracy_ci'][0]:.1%}-{plain['accuracy_ci'][1]:.1%}); paired "
        f"difference {paired['difference']:+.1%} ({lo:+.1%} to {hi:+.1%}), McNemar p = {paired['p_value']:.2f} "
        f"({verdict}); mean answer length {dyn['mean_length']:.0f} vs {plain['mean_length']:.0f} tokens. Greedy "
        f"DynaSpec texts equal plain greedy texts on {summary['greedy_text_exact_match']:.0%} of the questions."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, required=True, help="folder of a bench run (results.json)")
    parser.add_argument("--quality", type=Path, default=None, help="folder of a `hf-dynaspec quality` run")
    parser.add_argument("--previous", type=Path, default=None,
                        help="bench folder of the drafter this one replaced: accepted lengths on the shared prompts")
    parser.add_argument("--readme", action="store_true",
                        help=f"also write the summary into docs/results.md (generated block `{README_BLOCK}`)")
    args = parser.parse_args()
    text = summary_text(args.bench)
    if args.previous is not None:
        text += "\n\n" + previous_text(args.bench, args.previous)
    if args.quality is not None:
        text += "\n\n" + quality_text(args.quality)
    if args.readme:
        write_doc_block(ROOT / "docs" / "results.md", README_BLOCK, text)
    print(text)


if __name__ == "__main__":
    main()

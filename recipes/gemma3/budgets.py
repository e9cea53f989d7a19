"""DynaSpec against a static list of its own mean size, at several shortlist budgets, from one bench run.

Each `dynaspec[...]` method of the run is paired with the `static[static_size=N,...]` method whose other settings
are the same and whose N is DynaSpec's mean shortlist size on that run (rounded), and the two are compared over the
prompts both ran: accepted length, draft-tree nodes per step (the tree policy keeps a draft only while its path
probability passes `min_draft_prob`, and a shortlist's renormalised probabilities decide how many do), the share of
steps whose target token lay in the root's shortlist (the bench's shortlist recall), mean shortlist size and
tokens/s.
Writes budgets.json / budgets.md / budgets.png into the run folder and prints the markdown; with --doc also
docs/architecture.md's block `gemma3-budgets`.

    python recipes/gemma3/budgets.py benchmarks/results/cpu-gemma3-ml-budgets --doc
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_dynaspec.bench import method_settings, read_records, write_doc_block
from hf_dynaspec.generation.loop.stats import SpeculativeStats

DOC_BLOCK = "gemma3-budgets"  # in docs/architecture.md
BUDGET_KEYS = {"head_mode", "shortlist_k0", "shortlist_k1", "static_size"}  # what a pair may differ in


def tree_settings(method: str) -> tuple:
    """The settings of a method other than its head and the head's budget, as a hashable key."""
    return tuple(sorted((k, v) for k, v in method_settings(method).items() if k not in BUDGET_KEYS))


def merged_stats(records: list, method: str, prompts: set[str]) -> tuple[SpeculativeStats, float]:
    """The method's stats merged over `prompts`, and its tokens/s there (new tokens over seconds)."""
    runs = [r for r in records if r.method == method and r.question_id in prompts]
    stats = SpeculativeStats.merged([SpeculativeStats.from_dict(r.stats) for r in runs])
    return stats, sum(r.new_tokens for r in runs) / sum(r.seconds for r in runs)


def partner_method(dynaspec: str, size: int) -> str:
    """The static method of `size` tokens with a DynaSpec method's other settings (its base method's included),
    spelled as the bench takes it: "dynaspec[shortlist_k0=4,min_draft_prob=0]", 1460 ->
    "static[static_size=1460,min_draft_prob=0]"."""
    return "static[" + ",".join([f"static_size={size}"] + [f"{k}={v}" for k, v in tree_settings(dynaspec)]) + "]"


def prompts_by_method(records: list) -> dict[str, set[str]]:
    """The prompts each speculative method ran."""
    out: dict[str, set[str]] = {}
    for r in records:
        if r.stats is not None:
            out.setdefault(r.method, set()).add(r.question_id)
    return out


def dynaspec_sizes(records: list, ran: dict[str, set[str]]) -> dict[str, int]:
    """Each DynaSpec method's mean shortlist size over the prompts it ran (`ran`), rounded."""
    return {m: round(merged_stats(records, m, prompts)[0].mean_shortlist_size) for m, prompts in sorted(ran.items())
            if method_settings(m).get("head_mode") == "dynamic"}


def find_partner(dynaspec: str, size: int, ran: dict[str, set[str]]) -> str | None:
    """The static method of the run with `size` tokens and the DynaSpec method's other settings, however spelled."""
    return next((m for m in ran if method_settings(m).get("head_mode") == "static"
                 and method_settings(m).get("static_size") == size and tree_settings(m) == tree_settings(dynaspec)),
                None)


def pairs(records: list) -> list[dict]:
    """One row per DynaSpec method that has its equal-size static partner in the run."""
    ran = prompts_by_method(records)
    rows = []
    for dyn, size in dynaspec_sizes(records, ran).items():
        if (partner := find_partner(dyn, size, ran)) is None:
            continue
        prompts = ran[dyn] & ran[partner]
        (a, a_speed), (b, b_speed) = (merged_stats(records, m, prompts) for m in (dyn, partner))
        rows.append({"dynaspec": dyn, "static": partner, "prompts": len(prompts), "mean_shortlist": size,
                     "accepted": [a.mean_accepted_length, b.mean_accepted_length],
                     "tree_nodes": [a.mean_tree_size, b.mean_tree_size],
                     "recall": [a.shortlist_recall, b.shortlist_recall],
                     "tokens_per_s": [a_speed, b_speed]})
    return sorted(rows, key=lambda row: (tree_settings(row["dynaspec"]), row["mean_shortlist"]))


def missing_partners(records: list) -> list[str]:
    """The static methods still to run, one per DynaSpec method without its partner, spelled for the bench."""
    ran = prompts_by_method(records)
    return [partner_method(d, n) for d, n in dynaspec_sizes(records, ran).items() if find_partner(d, n, ran) is None]


def markdown(rows: list[dict], machine: str) -> str:
    lines = [f"DynaSpec vs the static list of its mean size, paired prompts, {machine}.", "",
             "| DynaSpec method | static partner | prompts | mean shortlist | accepted length (ratio) | "
             "tree nodes per step | target's token in the root shortlist | tokens/s (ratio) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        (a, b), (na, nb), (ra, rb), (sa, sb) = r["accepted"], r["tree_nodes"], r["recall"], r["tokens_per_s"]
        lines.append(f"| `{r['dynaspec']}` | `{r['static']}` | {r['prompts']} | {r['mean_shortlist']:,} | "
                     f"{a:.2f} vs {b:.2f} ({a / b:.3f}x) | {na:.2f} vs {nb:.2f} | {ra:.1%} vs {rb:.1%} | "
                     f"{sa:.1f} vs {sb:.1f} ({sa / sb:.3f}x) |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for tree in sorted({tree_settings(r["dynaspec"]) for r in rows}):
        group = [r for r in rows if tree_settings(r["dynaspec"]) == tree]
        label = ", ".join(f"{k}={v}" for k, v in tree) or "the drafter's tree"
        for side, style in ((0, "o-"), (1, "s--")):
            ax.plot([r["mean_shortlist"] for r in group], [r["accepted"][side] for r in group], style,
                    label=f"{('DynaSpec', 'static')[side]} ({label})")
    ax.set_xscale("log")
    ax.set_xlabel("mean shortlist (tokens)")
    ax.set_ylabel("accepted length")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="bench run folder (records.jsonl)")
    parser.add_argument("--partners", action="store_true",
                        help="print the static methods still to run (comma-separated, for hf-dynaspec bench --methods)")
    parser.add_argument("--doc", action="store_true", help=f"also write docs/architecture.md's block {DOC_BLOCK}")
    args = parser.parse_args()
    records = read_records(args.run / "records.jsonl")
    if args.partners:
        print(",".join(missing_partners(records)))
        return
    rows = pairs(records)
    if not rows:
        raise SystemExit(f"{args.run}: no dynaspec method has a static[static_size=N] partner of its mean size; "
                         "run one (hf-dynaspec bench --methods ...) and summarize again.")
    text = markdown(rows, records[0].machine)
    (args.run / "budgets.json").write_text(json.dumps({"machine": records[0].machine, "pairs": rows}, indent=1))
    (args.run / "budgets.md").write_text(text + "\n")
    plot(rows, args.run / "budgets.png")
    if args.doc:
        write_doc_block(Path(__file__).resolve().parents[2] / "docs/architecture.md", DOC_BLOCK, text)
    print(text)


if __name__ == "__main__":
    main()

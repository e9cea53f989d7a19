"""The Gemma 3 270M comparison (issue #15) read from its two committed bench runs, Spec-Bench and the held-out
code slice: every condition the issue sets, measured against its goal, plus the per-category table of the
shortlist modes. Writes `conditions.json` and `conditions.md` into the Spec-Bench run's folder and prints the
markdown; nothing is typed in, every figure comes from the runs' `results.json`.

Methods it reads (names as `hf-dynaspec bench --methods` spells them): `plain`, `dynaspec` (router shortlist),
`full` (same tree, full head), `static` (the drafter's 32,768 ranked tokens), `static[static_size=N]` (a static
shortlist of about DynaSpec's mean size: the one such method in the run), `context[...]` (in-context tokens + a
frequent core), `union` (router clusters + in-context tokens). A condition whose methods are missing reads
"not measured", never "holds".

    python recipes/gemma3/summarize.py --bench benchmarks/results/cpu-gemma3-270m \
        --code benchmarks/results/cpu-gemma3-270m-code --readme
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from hf_dynaspec.bench import Summary, write_doc_block
from hf_dynaspec.generation.loop.stats import SpeculativeStats

ROOT = Path(__file__).resolve().parents[2]
README_BLOCK = "gemma3-results"  # the README's Gemma results, written by --readme

MODES = {"dynaspec": "router clusters", "context": "in-context tokens + core", "union": "router + in-context"}


@dataclass
class Condition:
    name: str
    goal: str
    measured: str
    holds: bool | None  # None: the run lacks a method the condition reads


def load_summaries(folder: Path) -> tuple[dict, list[Summary]]:
    payload = json.loads((folder / "results.json").read_text())
    return payload, [Summary(**s) for s in payload["summaries"]]


def by_method(summaries: list[Summary], category: str = "overall") -> dict[str, Summary]:
    return {s.method: s for s in summaries if s.category == category}


def find_method(methods: dict[str, Summary], prefix: str) -> Summary | None:
    """The one method of the run named `prefix[...]` (e.g. the equal-size static shortlist), or None."""
    found = [s for name, s in methods.items() if name.startswith(prefix + "[") and "lookup_num_tokens" not in name]
    if len(found) > 1:
        raise ValueError(f"the run holds several {prefix}[...] methods ({[s.method for s in found]}): keep one")
    return found[0] if found else None


def missing(name: str, goal: str, *needed: str) -> Condition:
    return Condition(name, goal, f"not measured ({', '.join(needed)} missing from the run)", None)


def speed_conditions(overall: dict[str, Summary]) -> list[Condition]:
    dyn, full = overall.get("dynaspec"), overall.get("full")
    out = []
    if dyn is None or full is None:
        out.append(missing("DynaSpec vs the same tree with the full head", ">= 1.50x", "dynaspec", "full"))
    else:
        ratio = dyn.tokens_per_s / full.tokens_per_s
        out.append(Condition("DynaSpec vs the same tree with the full head", ">= 1.50x", f"{ratio:.2f}x", ratio >= 1.5))
    if dyn is None:
        out.append(missing("DynaSpec vs plain, overall", ">= 1.40x", "dynaspec"))
    else:
        out.append(Condition("DynaSpec vs plain, overall", ">= 1.40x", f"{dyn.speedup:.2f}x", dyn.speedup >= 1.4))
    return out


def static_conditions(bench: list[Summary], code: list[Summary]) -> list[Condition]:
    """Against the equal-size static shortlist (categories, code slice, speed) and the 32k one."""
    overall = by_method(bench)
    dyn, equal, big = overall.get("dynaspec"), find_method(overall, "static"), overall.get("static")
    if dyn is None or equal is None:
        name = "DynaSpec vs an equal-size static shortlist"
        return [missing(name, "see the issue", "dynaspec", "static[static_size=N]")]
    cats = sorted({s.category for s in bench if s.category != "overall"})
    wins = [c for c in cats if by_method(bench, c)["dynaspec"].mean_accepted_length
            > by_method(bench, c)[equal.method].mean_accepted_length]
    out = [Condition(f"accepted length above {equal.method} (its {equal.mean_shortlist_size:,.0f} tokens, "
                     f"DynaSpec's {dyn.mean_shortlist_size:,.0f}), categories", ">= 10 of 13",
                     f"{len(wins)} of {len(cats)}", len(wins) >= 10)]
    code_overall = by_method(code)
    if "dynaspec" in code_overall and equal.method in code_overall:
        a, b = code_overall["dynaspec"].mean_accepted_length, code_overall[equal.method].mean_accepted_length
        out.append(Condition("accepted length above the equal-size static shortlist, code slice", "higher",
                             f"{a:.2f} vs {b:.2f}", a > b))
    else:
        out.append(missing("accepted length above the equal-size static shortlist, code slice", "higher",
                           "code-slice dynaspec / " + equal.method))
    ratio = dyn.tokens_per_s / equal.tokens_per_s
    out.append(Condition("speed vs the equal-size static shortlist", ">= 1.05x", f"{ratio:.2f}x", ratio >= 1.05))
    if big is None:
        out.append(missing("vs the 32k static shortlist", "accepted length >=, shortlist <= half", "static"))
    else:
        holds = dyn.mean_accepted_length >= big.mean_accepted_length and dyn.mean_shortlist_size <= big.mean_shortlist_size / 2
        out.append(Condition("vs the 32k static shortlist: accepted length, shortlist size",
                             ">= its accepted length with <= half its size",
                             f"{dyn.mean_accepted_length:.2f} vs {big.mean_accepted_length:.2f}; "
                             f"{dyn.mean_shortlist_size:,.0f} vs {big.mean_shortlist_size:,.0f} tokens", holds))
    return out


def recovery_condition(overall: dict[str, Summary], vocab: int) -> Condition:
    dyn, full = overall.get("dynaspec"), overall.get("full")
    goal = ">= 98% with a mean shortlist <= 5% of the vocabulary"
    if dyn is None or full is None:
        return missing("recovery of the full head's accepted length", goal, "dynaspec", "full")
    recovery, share = dyn.mean_accepted_length / full.mean_accepted_length, dyn.mean_shortlist_size / vocab
    return Condition("recovery of the full head's accepted length", goal, f"{recovery:.1%} at {share:.1%}",
                     recovery >= 0.98 and share <= 0.05)


def shortlist_modes(overall: dict[str, Summary]) -> dict[str, Summary]:
    """The run's shortlist modes a drafter can ship as its default: {"dynaspec", "union", "context"} -> summary,
    the in-context one under whatever static size it ran with; the modes that did not run are absent."""
    modes = {m: overall[m] for m in ("dynaspec", "union") if m in overall}
    context = find_method(overall, "context") or overall.get("context")
    return modes | ({"context": context} if context is not None else {})


def mode_conditions(overall: dict[str, Summary]) -> tuple[list[Condition], str | None]:
    """The union against its two parts, and the fastest shortlist mode (the one to make the default)."""
    modes = shortlist_modes(overall)
    if len(modes) < 3:
        return [missing("union vs the better of router and in-context", "accepted length >=",
                        "dynaspec / context / union")], None
    union, parts = modes["union"], max(modes["dynaspec"].mean_accepted_length, modes["context"].mean_accepted_length)
    best = max(modes, key=lambda m: modes[m].tokens_per_s)
    cond = Condition("union vs the better of router and in-context", "accepted length >=",
                     f"{union.mean_accepted_length:.2f} vs {parts:.2f}", union.mean_accepted_length >= parts)
    return [cond], modes[best].method


def mode_columns(overall: dict[str, Summary]) -> list[str]:
    """The run's shortlist modes and baselines, in table order: router, in-context, union, full, static of equal
    size, static 32k."""
    columns = [m for m in ("dynaspec", "union", "full", "static") if m in overall]
    for prefix, at in (("context", 1), ("static", len(columns))):
        found = find_method(overall, prefix)
        if found is not None:
            columns.insert(at, found.method)
    return columns


def mode_table(bench: list[Summary], code: list[Summary], cell) -> str:
    """One row per category (then overall, then the code slice), one column per mode: `cell(summary)`."""
    overall = by_method(bench)
    columns = mode_columns(overall)
    rows = ["| category | " + " | ".join(f"`{c}`" for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    groups = [(c, by_method(bench, c)) for c in sorted({s.category for s in bench} - {"overall"})]
    groups += [("**overall**", overall)] + ([("code slice", by_method(code))] if code else [])
    for name, methods in groups:
        rows.append(f"| {name} | " + " | ".join(cell(methods[c]) if c in methods else "" for c in columns) + " |")
    return "\n".join(rows)


def accepted_cell(s: Summary) -> str:
    return f"{s.mean_accepted_length:.2f} ({s.speedup:.2f}x)"


def recall_cell(s: Summary) -> str:
    recall = "n/a" if s.shortlist_recall is None else f"{s.shortlist_recall:.1%}"
    return f"{recall} ({s.mean_shortlist_size:,.0f})"


def tree_table(records: list[dict]) -> str:
    """Per speculative method over `records`: what the tree did per step (draft nodes, tokens emitted, root
    recall, mean shortlist), most nodes first. A shortlist's softmax is renormalised over its tokens, so a smaller
    one lets more drafts pass `min_draft_prob`: the table shows whether tokens per step follow the tree's size or
    the shortlist's recall."""
    per_method: dict[str, list[SpeculativeStats]] = {}
    for r in (r for r in records if r["stats"] is not None):
        per_method.setdefault(r["method"], []).append(SpeculativeStats.from_dict(r["stats"]))
    totals = {method: SpeculativeStats.merged(stats) for method, stats in per_method.items()}
    rows = ["| method | draft nodes / step | tokens / step | root recall | mean shortlist |", "|---|---|---|---|---|"]
    for method, t in sorted(totals.items(), key=lambda kv: (-kv[1].mean_tree_size, -kv[1].mean_accepted_length)):
        recall = f"{t.shortlist_recall:.1%}" if t.recall_checks else "n/a"
        rows.append(f"| `{method}` | {t.mean_tree_size:.2f} | {t.mean_accepted_length:.2f} | {recall} | "
                    f"{t.mean_shortlist_size:,.0f} |")
    return "\n".join(rows)


def same_walks(records: list[dict], a: str, b: str) -> str:
    """How often methods `a` and `b` took the same steps with the same tree sizes on a prompt (for the router and
    the union: how often the union's extra in-context tokens changed nothing)."""
    walks: dict[str, dict[str, tuple]] = {}
    for r in records:
        if r["method"] in (a, b):
            walks.setdefault(r["question_id"], {})[r["method"]] = (r["stats"]["steps"], r["stats"]["tree_nodes"])
    both = [w for w in walks.values() if len(w) == 2]
    same = sum(w[a] == w[b] for w in both)
    return f"`{a}` and `{b}` took the same steps with the same tree sizes on {same} of {len(both)} prompts."


def conditions(bench_dir: Path, code_dir: Path | None) -> tuple[list[Condition], str | None, list[str]]:
    payload, bench = load_summaries(bench_dir)
    code_payload, code = load_summaries(code_dir) if code_dir else ({"records": []}, [])
    overall = by_method(bench)
    if "full" not in overall:
        raise ValueError(f"{bench_dir} has no `full` method: the vocabulary size and recovery come from it")
    vocab = int(overall["full"].mean_shortlist_size)  # the full head's shortlist is the whole vocabulary
    speculative = [r for r in payload["records"] + code_payload["records"] if r["method"] != "plain"]
    mismatches = sum(not r["matches_plain"] for r in speculative)
    found = [Condition("greedy output identical to plain greedy", "every prompt",
                       f"{mismatches} mismatches over {len(speculative)} speculative runs", mismatches == 0)]
    found += speed_conditions(overall) + static_conditions(bench, code) + [recovery_condition(overall, vocab)]
    modes, best = mode_conditions(overall)
    tables = [mode_table(bench, code, accepted_cell), mode_table(bench, code, recall_cell)]
    tree = tree_table(payload["records"])
    if {"dynaspec", "union"} <= overall.keys():
        tree += "\n\n" + same_walks(payload["records"], "dynaspec", "union")
    return found + modes, best, tables + [tree]


def fixed_tree_text(folder: Path) -> str:
    """The diagnostic run (stage 7b of the English recipe, recipes/gemma3/run.sh at 46a1249): the drafter alone, every tree drafted to its full size, one row per
    method over all its prompts."""
    payload = json.loads((folder / "results.json").read_text())
    return (f"Why, for accepted length: the drafter alone (no lookup branch) with every tree drafted to its full "
            f"size (`min_draft_prob=0`), so the shortlists differ only in which tokens the drafter can rank, not in "
            f"how many drafts pass the probability floor ({payload['meta']['prompts']} prompts, `{folder}`):\n\n"
            + tree_table(payload["records"]))


def markdown(found: list[Condition], best: str | None, tables: list[str], meta: dict) -> str:
    verdict = {True: "holds", False: "**missed**", None: "not measured"}
    lines = [f"Gemma 3 270M, Spec-Bench ({meta['prompts']} prompts) + code slice, greedy, {meta['max_new_tokens']} "
             f"new tokens, on {meta['machine']}.", "", "| condition | goal | measured | |", "|---|---|---|---|"]
    lines += [f"| {c.name} | {c.goal} | {c.measured} | {verdict[c.holds]} |" for c in found]
    if best:
        lines += ["", f"Fastest shortlist mode overall: `{best}`."]
    lines += ["", "Accepted length (speedup vs plain) per category:", "", tables[0]]
    lines += ["", "Shortlist recall (the target's next token in the drafter's shortlist at the root; mean shortlist "
              "size in tokens) per category:", "", tables[1]]
    lines += ["", "What the tree did per step on Spec-Bench (draft nodes verified, root excluded; tokens emitted, accepted "
              "drafts + the bonus token; the root's shortlist recall; mean shortlist), most nodes first:", "", tables[2]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, required=True, help="Spec-Bench run folder (results.json)")
    parser.add_argument("--code", type=Path, default=None, help="code-slice run folder (results.json)")
    parser.add_argument("--fixed", type=Path, default=None,
                        help="the fixed-size-tree diagnostic run folder (stage 7b of the English recipe, recipes/gemma3/run.sh at 46a1249), added when given")
    parser.add_argument("--readme", action="store_true", help=f"also write docs/results.md's {README_BLOCK} block")
    args = parser.parse_args()
    found, best, tables = conditions(args.bench, args.code)
    meta = json.loads((args.bench / "results.json").read_text())["meta"]
    text = markdown(found, best, tables, meta)
    if args.fixed is not None:
        text += "\n\n" + fixed_tree_text(args.fixed)
    write_conditions(args.bench, found, best, text, README_BLOCK if args.readme else None)


def write_conditions(folder: Path, found: list[Condition], best: str | None, text: str, block: str | None) -> None:
    """A comparison's report: conditions.md (`text`), conditions.json (the conditions and the fastest shortlist mode,
    which `export.py` ships as the default), docs/results.md's `block` when named; the text printed."""
    (folder / "conditions.md").write_text(text + "\n")
    (folder / "conditions.json").write_text(json.dumps(
        {"conditions": [c.__dict__ for c in found], "fastest_mode": best}, indent=1) + "\n")
    if block is not None:
        write_doc_block(ROOT / "docs" / "results.md", block, text)
    print(text)


if __name__ == "__main__":
    main()

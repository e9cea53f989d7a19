"""The multilingual Gemma 3 comparison (issue #30) read from its committed bench runs: the held-out language
slices (`data/multilingual_slice.jsonl`, one category per language), the held-out code slice
(`data/code_heldout.jsonl`) and English Spec-Bench, plus the drafter's learning curve (held-out top-1 per data
folder). Every condition the issue sets, measured against its goal; per-slice tables of accepted length, root
recall and recovery; the fastest shortlist mode over every slice (`fastest_mode` in conditions.json, the default
`export.py` ships). Writes `conditions.json` / `conditions.md` into the language run's folder and prints the
markdown; with --readme also docs/results.md's block and docs/architecture.md's (what decides between the modes). Every
figure comes from the runs, a condition whose methods are missing reads "not measured". Where a slice's folder
holds `root_recall.json` (root_recall.py: recall at every continuation position against the target's next token
and the drafter's full-head top-1), its table and its root-draft ceiling follow.

Methods read (as `hf-dynaspec bench --methods` spells them): `plain`, `dynaspec`, `full`, `static` (32,768 ranked
tokens), `static[static_size=N]` (the equal-size static list), `context[...]`, `union`, and
`dynaspec[lookup_num_tokens=0]` (the drafter alone). Where `full` ran on fewer prompts than `dynaspec` (the issue
allows half of each slice), recovery compares the two on the prompts both ran.

    python recipes/gemma3/multilingual_report.py --languages benchmarks/results/cpu-gemma3-ml-languages \
        --code benchmarks/results/cpu-gemma3-ml-code --spec benchmarks/results/cpu-gemma3-ml-spec-bench \
        --curve benchmarks/results/cpu-gemma3-ml-train/curve.json \
        --heldout benchmarks/results/cpu-gemma3-ml-heldout/results.json --readme
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import root_recall  # noqa: E402
from languages import LANGUAGES  # noqa: E402
from summarize import (  # noqa: E402
    ROOT,
    Condition,
    by_method,
    find_method,
    load_summaries,
    missing,
    shortlist_modes,
    write_conditions,
)

from hf_dynaspec.bench import Summary, write_doc_block  # noqa: E402
from hf_dynaspec.generation.loop.stats import SpeculativeStats  # noqa: E402

README_BLOCK = "gemma3-multilingual-results"
DOC_BLOCK = "gemma3-multilingual-why"  # in docs/architecture.md
SLICE_NAMES = {"languages": "Language slices", "code": "Code slice", "spec-bench": "English Spec-Bench"}
NON_LATIN = tuple(code for code, spec in LANGUAGES.items() if spec["script"] != "latin")
ALONE = "dynaspec[lookup_num_tokens=0]"


def paired_accepted(records: list[dict], a: str, b: str, category: str | None = None) -> tuple[float, float, int]:
    """Mean accepted length of methods `a` and `b` over the prompts both ran (of `category`, or all), and how
    many prompts that is."""
    runs: dict[str, dict[str, dict]] = {}
    for r in records:
        if r["method"] in (a, b) and r["stats"] is not None and (category is None or r["category"] == category):
            runs.setdefault(r["question_id"], {})[r["method"]] = r["stats"]
    both = [q for q, m in runs.items() if len(m) == 2]
    merged = [SpeculativeStats.merged([SpeculativeStats.from_dict(runs[q][m]) for q in both]) for m in (a, b)]
    return merged[0].mean_accepted_length, merged[1].mean_accepted_length, len(both)


def language_conditions(summaries: list[Summary]) -> list[Condition]:
    """On the language slices together: accepted length and speed against the equal-size static list; per
    non-Latin-script slice: root recall at least 5 points above it."""
    overall = by_method(summaries)
    dyn, equal = overall.get("dynaspec"), find_method(overall, "static")
    if dyn is None or equal is None:
        return [missing("DynaSpec vs the equal-size static list, language slices", "see the issue", "dynaspec",
                        "static[static_size=N]")]
    length = dyn.mean_accepted_length / equal.mean_accepted_length
    speed = dyn.tokens_per_s / equal.tokens_per_s
    out = [Condition(f"accepted length vs {equal.method}, language slices together", ">= 1.05x",
                     f"{length:.3f}x ({dyn.mean_accepted_length:.2f} vs {equal.mean_accepted_length:.2f})",
                     length >= 1.05),
           Condition(f"tokens/s vs {equal.method}, language slices together", ">= 1.05x", f"{speed:.3f}x",
                     speed >= 1.05)]
    for code in NON_LATIN:
        methods = by_method(summaries, f"lang-{code}")
        a, b = methods.get("dynaspec"), methods.get(equal.method)
        name = f"root recall above the equal-size static list, {LANGUAGES[code]['name']}"
        if a is None or b is None or a.shortlist_recall is None or b.shortlist_recall is None:
            out.append(missing(name, ">= +5 points", f"lang-{code} dynaspec / {equal.method}"))
            continue
        gap = 100 * (a.shortlist_recall - b.shortlist_recall)
        out.append(Condition(name, ">= +5 points", f"{a.shortlist_recall:.1%} vs {b.shortlist_recall:.1%} "
                             f"({gap:+.1f})", gap >= 5))
    return out


def recovery_conditions(slices: dict[str, tuple[list[Summary], list[dict]]], vocab: int) -> list[Condition]:
    """Recovery of the full head's accepted length on every slice (each language, code, Spec-Bench), with the
    mean shortlist at most 5% of the vocabulary."""
    goal, out = ">= 98%, mean shortlist <= 5% of the vocabulary", []
    for name, (summaries, records) in slices.items():
        categories = sorted({s.category for s in summaries} - {"overall"}) if name == "languages" else [None]
        for category in categories:
            label = f"recovery of the full head, {category or name}"
            dyn = by_method(summaries, category or "overall").get("dynaspec")
            ours, full, prompts = paired_accepted(records, "dynaspec", "full", category)
            if dyn is None or not prompts:
                out.append(missing(label, goal, "dynaspec / full"))
                continue
            share = dyn.mean_shortlist_size / vocab
            out.append(Condition(label, goal, f"{ours / full:.1%} at {share:.1%} ({prompts} prompts)",
                                 ours / full >= 0.98 and share <= 0.05))
    return out


def spec_conditions(summaries: list[Summary]) -> list[Condition]:
    """English Spec-Bench: no slower than the equal-size static list, >= 1.5x the full head, >= 1.4x plain; the
    drafter alone (no lookup) at least plain's speed."""
    overall = by_method(summaries)
    dyn, equal, full, alone = overall.get("dynaspec"), find_method(overall, "static"), overall.get("full"), \
        overall.get(ALONE)
    out = []
    for name, goal, other, needed in (
        ("Spec-Bench: tokens/s vs the equal-size static list", ">= 0.98x", equal, 0.98),
        ("Spec-Bench: tokens/s vs the same tree with the full head", ">= 1.50x", full, 1.5),
    ):
        if dyn is None or other is None:
            out.append(missing(name, goal, "dynaspec / " + ("static[static_size=N]" if needed < 1 else "full")))
        else:
            ratio = dyn.tokens_per_s / other.tokens_per_s
            out.append(Condition(name, goal, f"{ratio:.2f}x", ratio >= needed))
    if dyn is None:
        out.append(missing("Spec-Bench: DynaSpec vs plain", ">= 1.40x", "dynaspec"))
    else:
        out.append(Condition("Spec-Bench: DynaSpec vs plain", ">= 1.40x", f"{dyn.speedup:.2f}x", dyn.speedup >= 1.4))
    if alone is None:
        out.append(missing("Spec-Bench: the drafter alone (no lookup) vs plain", ">= 1.00x", ALONE))
    else:
        out.append(Condition("Spec-Bench: the drafter alone (no lookup) vs plain", ">= 1.00x",
                             f"{alone.speedup:.2f}x", alone.speedup >= 1.0))
    return out


def curve_conditions(curve_path: Path | None) -> tuple[list[Condition], str]:
    """Held-out top-1 at draft depth 1 on English positions >= 0.55, and every data folder's at the last point."""
    name, goal = "held-out top-1 at depth 1, English positions", ">= 0.55"
    if curve_path is None or not curve_path.is_file():
        return [missing(name, goal, "the training curve")], ""
    last = json.loads(curve_path.read_text())["curve"][-1]
    groups = last.get("by_group") or {}
    per_group = ", ".join(f"{g} {v['top1_at_depth'][0]:.3f}" for g, v in groups.items())
    if "en" not in groups:
        return [missing(name, goal, "the English data folder's held-out figures")], per_group
    top1 = groups["en"]["top1_at_depth"][0]
    return [Condition(name, goal, f"{top1:.3f} (step {last['step']:,})", top1 >= 0.55)], per_group


def heldout_line(heldout_path: Path | None) -> str:
    """Every drafter `heldout_compare.py` scored on the training's own held-out split (the English-only drafter
    shipped before, for one), English and overall top-1 at depth 1: what the curve's English figure compares to."""
    if heldout_path is None:
        return ""
    if not heldout_path.is_file():
        raise FileNotFoundError(f"--heldout {heldout_path}: no such file. Run recipes/gemma3/heldout_compare.py "
                                "to write it, or leave --heldout out.")
    drafters = json.loads(heldout_path.read_text())["drafters"]
    cells = [f"{name} {point['by_group']['en']['top1_at_depth'][0]:.3f} English, "
             f"{point['top1_at_depth'][0]:.3f} overall" for name, point in drafters.items() if "en" in point["by_group"]]
    return f"The same held-out positions scored for other drafters (`heldout_compare.py`): {'; '.join(cells)}."


def fastest_mode(slices: dict[str, tuple[list[Summary], list[dict]]]) -> tuple[str | None, str]:
    """The shortlist mode to ship as the default: of router (`dynaspec`), in-context, union and the equal-size
    static list (where it ran on every slice: a frequency list the drafter stores, no router), the one with the
    most tokens/s over every slice's prompts together (new tokens / seconds, pooled), and each mode's figure with its
    ratio to the best. None unless router, in-context and union ran on every slice."""
    pooled: dict[str, list[float]] = {}  # method -> [new tokens, seconds, slices that ran it]
    required: set[str] = set()  # the router, in-context and union methods
    for summaries, records in slices.values():
        overall = by_method(summaries)
        modes = [s.method for s in shortlist_modes(overall).values()]
        required.update(modes)
        equal = find_method(overall, "static")
        for method in [*modes, *([equal.method] if equal else [])]:
            runs = [r for r in records if r["method"] == method]
            total = pooled.setdefault(method, [0, 0.0, 0])
            total[0] += sum(r["new_tokens"] for r in runs)
            total[1] += sum(r["seconds"] for r in runs)
            total[2] += 1
    complete = {m: tokens / seconds for m, (tokens, seconds, ran) in pooled.items() if ran == len(slices)}
    if len(required & complete.keys()) < 3:
        return None, "not measured (router, in-context and union must each run on every slice)"
    best = max(complete, key=complete.get)
    ranked = sorted(complete.items(), key=lambda kv: -kv[1])  # each beside its ratio to the best: ties read as ties
    return best, ", ".join(f"`{m}` {v:.1f} ({v / complete[best]:.3f}x)" for m, v in ranked)


def slice_table(slices: dict[str, tuple[list[Summary], list[dict]]]) -> str:
    """Per category of every slice: accepted length and root recall of DynaSpec, the equal-size static list and
    the full head, and DynaSpec's speedup over plain."""
    rows = ["| slice | DynaSpec accepted (recall) | equal-size static | full head | DynaSpec vs plain |",
            "|---|---|---|---|---|"]

    def cell(s: Summary | None) -> str:
        if s is None:
            return ""
        recall = "n/a" if s.shortlist_recall is None else f"{s.shortlist_recall:.1%}"
        return f"{s.mean_accepted_length:.2f} ({recall})"

    for name, (summaries, _) in slices.items():
        equal = find_method(by_method(summaries), "static")
        for category in sorted({s.category for s in summaries}, key=lambda c: (c == "overall", c)):
            methods = by_method(summaries, category)
            dyn = methods.get("dynaspec")
            rows.append(f"| {name} / {category} | {cell(dyn)} | {cell(methods.get(equal.method) if equal else None)}"
                        f" | {cell(methods.get('full'))} | {'' if dyn is None else f'{dyn.speedup:.2f}x'} |")
    return "\n".join(rows)


def ceiling_line(recall: dict | None, equal: str | None) -> str:
    """Why the accepted-length goal is or is not within reach, from a slice's root_recall.json (`recall`): how
    often each head's root draft is the target's next token. The full head's rate over the equal-size static
    list's bounds what any shortlist of this drafter can gain at the root ("" where not measured)."""
    if equal is None or recall is None:
        return ""
    overall = recall["categories"]["overall"]
    if "draft" not in overall.get("dynaspec", {}) or "draft" not in overall.get(equal, {}):
        return ""
    full, ours, theirs = overall["full head"]["next"], overall["dynaspec"]["draft"], overall[equal]["draft"]
    return (f"Root drafts that are the target's next token ({root_recall.NAME}.json, every continuation position): "
            f"DynaSpec {ours:.1%}, {equal} {theirs:.1%}, the full head {full:.1%}. No shortlist of this drafter "
            f"drafts the right root token more than {full / theirs:.3f}x as often as {equal} (DynaSpec: "
            f"{ours / theirs:.3f}x); the lookup branch's drafts are the same for both.")


def why_lines(slices: dict[str, tuple[list[Summary], list[dict]]], recalls: dict[str, dict], best: str | None,
              figures: str) -> list[str]:
    """What decides between the shortlist modes, one paragraph each: every measured slice's root-draft ceiling
    (`ceiling_line`), then the fastest mode over every slice and the default it ships."""
    out = []
    for name, recall in recalls.items():
        equal = find_method(by_method(slices[name][0]), "static")  # recalls come from the slices' own folders
        if ceiling := ceiling_line(recall, equal.method if equal else None):
            out.append(f"{SLICE_NAMES.get(name, name)}: {ceiling}")
    out.append(f"Fastest shortlist mode over every slice's prompts (tokens/s): {figures}; the shipped default: "
               f"`{best}`." if best else f"Fastest shortlist mode: {figures}.")
    return out


class Report(NamedTuple):
    found: list[Condition]  # every condition of the issue, measured against its goal
    best: str | None  # the fastest shortlist mode (the shipped default), None where not measured
    text: str  # the markdown report (conditions.md, the README block)
    why: str  # what decides between the modes (the docs/architecture.md block)


def report(languages: Path, code: Path | None, spec: Path | None, curve: Path | None,
           heldout: Path | None = None) -> Report:
    """The comparison read from its run folders; `heldout`: heldout_compare.py's results.json, other drafters on
    the curve's held-out positions."""
    loaded = {"languages": load_summaries(languages)}
    loaded |= {name: load_summaries(path) for name, path in (("code", code), ("spec-bench", spec)) if path}
    slices = {name: (summaries, payload["records"]) for name, (payload, summaries) in loaded.items()}
    full = by_method(slices["languages"][0]).get("full")
    if full is None:
        raise ValueError(f"{languages} has no `full` method: the vocabulary size and recovery come from it")
    vocab = int(full.mean_shortlist_size)
    speculative = [r for _, records in slices.values() for r in records if r["method"] != "plain"]
    mismatches = sum(not r["matches_plain"] for r in speculative)
    found = [Condition("greedy output identical to plain greedy", "every prompt",
                       f"{mismatches} mismatches over {len(speculative)} speculative runs", mismatches == 0)]
    found += language_conditions(slices["languages"][0]) + recovery_conditions(slices, vocab)
    found += spec_conditions(slices["spec-bench"][0]) if "spec-bench" in slices else [
        missing("Spec-Bench conditions", "see the issue", "the Spec-Bench run")]
    top1, per_group = curve_conditions(curve)
    found += top1
    meta = loaded["languages"][0]["meta"]
    verdict = {True: "holds", False: "**missed**", None: "not measured"}
    lines = [f"Gemma 3 270M, held-out slices (languages {meta['prompts']} prompts, code, Spec-Bench), greedy, "
             f"{meta['max_new_tokens']} new tokens, on {meta['machine']}.", "",
             "| condition | goal | measured | |", "|---|---|---|---|"]
    lines += [f"| {c.name} | {c.goal} | {c.measured} | {verdict[c.holds]} |" for c in found]
    recalls = {name: json.loads((folder / f"{root_recall.NAME}.json").read_text())
               for name, folder in (("languages", languages), ("code", code), ("spec-bench", spec))
               if folder is not None and (folder / f"{root_recall.NAME}.json").is_file()}
    best, figures = fastest_mode(slices)
    why = why_lines(slices, recalls, best, figures)
    lines += [line for paragraph in why for line in ("", paragraph)]
    lines += ["", "Accepted length (root recall) per slice and category:", "", slice_table(slices)]
    if per_group:
        lines += ["", f"Held-out top-1 at depth 1 per data folder at the last training point: {per_group}."]
    if compared := heldout_line(heldout):
        lines += ["", compared]
    for name, recall in recalls.items():
        lines += ["", f"**{name}**: {root_recall.markdown(recall)}"]
    return Report(found, best, "\n".join(lines), "\n\n".join(why))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--languages", type=Path, required=True, help="language-slice run folder (results.json)")
    parser.add_argument("--code", type=Path, default=None, help="code-slice run folder")
    parser.add_argument("--spec", type=Path, default=None, help="Spec-Bench run folder")
    parser.add_argument("--curve", type=Path, default=None, help="curve.json of the drafter's training")
    parser.add_argument("--heldout", type=Path, default=None,
                        help="heldout_compare.py's results.json: other drafters on the curve's held-out positions")
    parser.add_argument("--readme", action="store_true",
                        help=f"also write docs/results.md's {README_BLOCK} block and docs/architecture.md's {DOC_BLOCK}")
    args = parser.parse_args()
    found, best, text, why = report(args.languages, args.code, args.spec, args.curve, args.heldout)
    write_conditions(args.languages, found, best, text, README_BLOCK if args.readme else None)
    if args.readme:
        write_doc_block(ROOT / "docs/architecture.md", DOC_BLOCK, why)


if __name__ == "__main__":
    main()

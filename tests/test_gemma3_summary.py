"""recipes/gemma3/summarize.py: the issue's conditions read from bench runs, checked on small runs written here
(no model): a condition whose methods are missing reads "not measured", the category count and the union's
comparison follow the figures, the per-step tree table follows the records."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from helpers import REPO, load_script

from hf_dynaspec.bench import Summary


@pytest.fixture(scope="module")
def summarize():
    return load_script(REPO / "recipes" / "gemma3" / "summarize.py", "gemma3_summarize")


def summary(method: str, category: str, accepted: float, tokens_per_s: float, shortlist: float) -> Summary:
    return Summary(method=method, category=category, tokens_per_s=tokens_per_s, speedup=tokens_per_s / 10,
                   mean_accepted_length=accepted, mean_shortlist_size=shortlist, shortlist_recall=0.9,
                   draft_share=0.1, router_share=0.01, head_share=0.05, verify_share=0.8, extend_share=0.05,
                   mismatches=0, prompts=1)


def record(method: str, steps: int, accepted: int, nodes: int, matches: bool = True) -> dict:
    stats = {"steps": steps, "accepted_tokens": accepted, "tree_nodes": nodes, "recall_hits": steps - 1,
             "recall_checks": steps, "shortlist_total": 50 * steps, "shortlist_positions": steps}
    return {"method": method, "category": "a", "question_id": "1", "seconds": 1.0, "new_tokens": accepted,
            "matches_plain": matches, "stats": None if method == "plain" else stats}


def write_run(folder, accepted: dict[str, dict[str, float]], mismatch: bool = False, vocab: int = 1000):
    """A run over categories a, b (+ overall) with each method's accepted length per category given; every
    shortlist holds 50 tokens, the full head's `vocab`."""
    summaries = []
    for method, per_category in accepted.items():
        size = vocab if method == "full" else 50
        for category, length in per_category.items():
            speed = 30.0 if method == "full" else 10.0 * length
            summaries.append(summary(method, category, length, speed, size))
    records = [record(m, 10, 30, 60, matches=not (mismatch and m == "dynaspec")) for m in accepted]
    folder.mkdir()
    meta = {"prompts": 2, "max_new_tokens": 8, "machine": "test"}
    (folder / "results.json").write_text(json.dumps(
        {"meta": meta, "summaries": [asdict(s) for s in summaries], "records": records}))
    return folder


def run(**per_method):
    """{method: (a, b)} accepted lengths -> per-category dicts with an overall mean."""
    return {m: {"a": a, "b": b, "overall": (a + b) / 2} for m, (a, b) in per_method.items()}


def by_name(found):
    return {c.name.split(" (")[0]: c for c in found}


def test_missing_methods_read_not_measured(summarize, tmp_path):
    bench = write_run(tmp_path / "bench", run(plain=(1, 1), dynaspec=(3, 3), full=(3, 3)))
    found, best, _ = summarize.conditions(bench, None)
    assert best is None  # no context / union: no mode is named
    union = [c for c in found if c.name.startswith("union")]
    assert union and union[0].holds is None and "not measured" in union[0].measured
    static = [c for c in found if "static" in c.name]
    assert static and all(c.holds is None for c in static)


def test_conditions_follow_the_figures(summarize, tmp_path):
    bench = write_run(tmp_path / "bench", run(
        plain=(1, 1), dynaspec=(3.0, 2.0), full=(3.0, 2.0), **{"static[static_size=50]": (2.5, 2.5)},
        static=(2.0, 2.0), **{"context[static_size=20]": (3.2, 2.0)}, union=(3.1, 2.0)), mismatch=True)
    found, best, tables = summarize.conditions(bench, None)
    named = by_name(found)
    assert named["greedy output identical to plain greedy"].holds is False  # one mismatching record
    categories = [c for c in found if c.name.startswith("accepted length above static")][0]
    assert categories.measured == "1 of 2" and categories.holds is False  # a: 3.0 > 2.5; b: 2.0 < 2.5
    union = named["union vs the better of router and in-context"]
    assert union.measured == "2.55 vs 2.60" and union.holds is False
    assert best == "context[static_size=20]"  # the fastest of router / in-context / union here
    assert "| `dynaspec` | 6.00 | 3.00 | 90.0% | 50 |" in tables[2]
    assert "`dynaspec` and `union` took the same steps with the same tree sizes on 1 of 1 prompts." in tables[2]


@pytest.mark.parametrize("vocab, full_b, measured, holds", [
    (2000, 3.1, "98.4% at 2.5%", True),
    (2000, 3.2, "96.8% at 2.5%", False),  # recovers too little
    (800, 3.0, "100.0% at 6.2%", False),  # a shortlist over 5% of the vocabulary
])
def test_recovery_needs_both_the_length_and_a_small_shortlist(summarize, tmp_path, vocab, full_b, measured, holds):
    bench = write_run(tmp_path / "bench", run(plain=(1, 1), dynaspec=(3, 3), full=(3, full_b)), vocab=vocab)
    recovery = by_name(summarize.conditions(bench, None)[0])["recovery of the full head's accepted length"]
    assert (recovery.measured, recovery.holds) == (measured, holds)

"""recipes/gemma3/multilingual_report.py: the multilingual comparison's conditions read from small runs written
here (no model): language-slice ratios and per-script recall against the equal-size static list, recovery per
slice on the prompts both methods ran (the full head may run on half), Spec-Bench and the learning curve."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from helpers import REPO, load_script

from hf_dynaspec.bench import Summary

report = load_script(REPO / "recipes/gemma3/multilingual_report.py", "gemma3_multilingual_report")
EQUAL = "static[static_size=50]"


def summary(method, category, accepted, tokens_per_s, shortlist, recall=0.9, speedup=None):
    return Summary(method=method, category=category, tokens_per_s=tokens_per_s,
                   speedup=tokens_per_s / 10 if speedup is None else speedup, mean_accepted_length=accepted,
                   mean_shortlist_size=shortlist, shortlist_recall=recall, draft_share=0.1, router_share=0.01,
                   head_share=0.05, verify_share=0.8, extend_share=0.05, mismatches=0, prompts=2)


def record(method, category, qid, accepted, matches=True):
    stats = None if method == "plain" else {"steps": 10, "accepted_tokens": accepted, "tree_nodes": 60,
                                            "recall_hits": 9, "recall_checks": 10, "shortlist_total": 500,
                                            "shortlist_positions": 10}
    return {"method": method, "category": category, "question_id": qid, "seconds": 1.0, "new_tokens": accepted,
            "matches_plain": matches, "stats": stats}


def write_run(folder, categories, accepted, recall, speed, full_prompts=2, vocab=4000):
    """Methods' accepted length / root recall / tokens/s per category (the same in each), two prompts a category,
    the full head on `full_prompts` of them."""
    summaries, records = [], []
    for category in [*categories, "overall"]:
        for method in accepted:
            size = vocab if method == "full" else 50
            summaries.append(summary(method, category, accepted[method], speed[method], size, recall[method]))
    for category in categories:
        for qid in ("1", "2"):
            for method in accepted:
                if method == "full" and int(qid) > full_prompts:
                    continue
                records.append(record(method, category, f"{category}-{qid}", round(10 * accepted[method])))
    folder.mkdir()
    meta = {"prompts": 2 * len(categories), "max_new_tokens": 8, "machine": "test"}
    (folder / "results.json").write_text(json.dumps(
        {"meta": meta, "summaries": [asdict(s) for s in summaries], "records": records}))
    return folder


def by_name(found):
    return {c.name: c for c in found}


@pytest.fixture
def runs(tmp_path):
    languages = [f"lang-{c}" for c in ("zh", "ja", "ko", "ru", "ar", "hi", "de")]
    methods = {"plain": 1.0, "dynaspec": 3.3, "full": 3.32, EQUAL: 3.0, "static": 3.2}
    lang = write_run(tmp_path / "lang", languages, methods,
                     {"plain": None, "dynaspec": 0.9, "full": 1.0, EQUAL: 0.8, "static": 0.88},
                     {"plain": 10, "dynaspec": 22, "full": 12, EQUAL: 20, "static": 19}, full_prompts=1)
    spec = write_run(tmp_path / "spec", ["writing"], methods | {report.ALONE: 1.9},
                     {"plain": None, "dynaspec": 0.9, "full": 1.0, EQUAL: 0.9, "static": 0.9, report.ALONE: 0.9},
                     {"plain": 10, "dynaspec": 16, "full": 10, EQUAL: 16.5, "static": 15, report.ALONE: 9})
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"curve": [{"step": 500, "by_group": {
        "en": {"top1_at_depth": [0.58, 0.4, 0.3]}, "zh": {"top1_at_depth": [0.41, 0.3, 0.2]}}}]}))
    return lang, spec, curve


def test_conditions_follow_the_figures(runs):
    lang, spec, curve = runs
    found, best, text, _ = report.report(lang, None, spec, curve)
    assert best is None and "Fastest shortlist mode: not measured" in text  # no in-context / union runs
    got = by_name(found)
    assert got["greedy output identical to plain greedy"].holds
    assert got[f"accepted length vs {EQUAL}, language slices together"].holds  # 3.3 / 3.0 = 1.10x
    assert got[f"tokens/s vs {EQUAL}, language slices together"].holds is True  # 22 / 20 = 1.10x
    assert got["root recall above the equal-size static list, Chinese"].holds  # 90% vs 80%
    assert "German" not in text.split("Accepted length")[0]  # recall is asked of non-Latin scripts only
    assert got["recovery of the full head, lang-zh"].measured.endswith("(1 prompts)")  # full ran on one of two
    assert got["recovery of the full head, lang-zh"].holds  # 33 vs 33 tokens on the shared prompt
    assert got["Spec-Bench: tokens/s vs the equal-size static list"].holds is False  # 16 / 16.5 = 0.97x
    assert got["Spec-Bench: tokens/s vs the same tree with the full head"].holds  # 1.6x
    assert got["Spec-Bench: the drafter alone (no lookup) vs plain"].holds is False  # 0.9x
    assert got["held-out top-1 at depth 1, English positions"].holds and "zh 0.410" in text
    assert "| languages / lang-zh | 3.30 (90.0%) | 3.00 (80.0%) | 3.32 (100.0%) | 2.20x |" in text


def test_missing_runs_and_methods_read_not_measured(runs, tmp_path):
    lang, _, _ = runs
    found = report.report(lang, None, None, None).found
    got = by_name(found)
    assert got["Spec-Bench conditions"].holds is None
    assert got["held-out top-1 at depth 1, English positions"].holds is None
    bare = write_run(tmp_path / "bare", ["lang-zh"], {"plain": 1.0, "dynaspec": 2.0, "full": 2.0},
                     {"plain": None, "dynaspec": 0.9, "full": 1.0}, {"plain": 10, "dynaspec": 20, "full": 12})
    found = report.report(bare, None, None, None).found
    assert by_name(found)["DynaSpec vs the equal-size static list, language slices"].holds is None


def test_root_recall_tables_follow_when_measured(runs):
    lang, spec, curve = runs
    assert "Root recall" not in report.report(lang, None, spec, curve)[2]
    counts = {"next": 0.9, "top1": 0.95, "draft": 0.45, "size": 5000.0}
    (lang / "root_recall.json").write_text(json.dumps({"meta": {"shortlist_k0": 8}, "categories": {"overall": {
        "positions": 100, "full head": {"next": 0.5}, "dynaspec": counts, EQUAL: counts | {"next": 0.8, "draft": 0.4}}}}))
    text = report.report(lang, None, spec, curve)[2]
    assert "**languages**: Root recall" in text
    assert "| overall | 100 | 50.0% | 90.0% / 95.0% / 45.0% (5,000) | 80.0% / 95.0% / 40.0% (5,000) |" in text
    # the ceiling: the full head's right root drafts over the equal-size list's (0.5 / 0.4), DynaSpec's (0.45 / 0.4)
    assert f"more than 1.250x as often as {EQUAL} (DynaSpec: 1.125x)" in text
    # every slice with a recall file gets its own ceiling, in the report and in the docs block
    (spec / "root_recall.json").write_text(json.dumps({"meta": {"shortlist_k0": 8}, "categories": {"overall": {
        "positions": 10, "full head": {"next": 0.6}, "dynaspec": counts, EQUAL: counts | {"draft": 0.5}}}}))
    got = report.report(lang, None, spec, curve)
    paragraphs = got.why.split("\n\n")
    assert paragraphs[0].startswith("Language slices: ") and "1.250x" in paragraphs[0]
    assert paragraphs[1].startswith("English Spec-Bench: ") and "more than 1.200x" in paragraphs[1]
    assert paragraphs[2].startswith("Fastest shortlist mode") and all(p in got.text for p in paragraphs)


def test_the_fastest_mode_is_pooled_over_every_slice(tmp_path):
    context = "context[static_size=2048]"
    modes = {"plain": 1.0, "dynaspec": 3.3, "full": 3.3, EQUAL: 3.0, context: 3.0, "union": 3.5}
    recall = dict.fromkeys(modes, 0.9) | {"plain": None}
    speed = dict.fromkeys(modes, 10)  # summaries' tokens/s: the choice reads the records (new tokens / seconds)
    lang = write_run(tmp_path / "lang", ["lang-zh"], modes, recall, speed)
    spec = write_run(tmp_path / "spec", ["writing"], modes | {"union": 3.0, "dynaspec": 3.4}, recall, speed)
    found, best, text, _ = report.report(lang, None, spec, None)
    assert best == "dynaspec"  # (33 + 34) x 2 tokens in 4 s beats the union's (35 + 30) x 2
    assert (f"(tokens/s): `dynaspec` 33.5 (1.000x), `union` 32.5 (0.970x), `context[static_size=2048]` 30.0 (0.896x), "
            f"`{EQUAL}` 30.0 (0.896x)") in text
    # the equal-size static list competes too: where it is the fastest, it is the default the figures name
    static_first = write_run(tmp_path / "static-first", ["writing"], modes | {EQUAL: 3.6}, recall, speed)
    assert report.report(static_first, None, static_first, None)[1] == EQUAL
    no_union = write_run(tmp_path / "no-union", ["writing"], {k: v for k, v in modes.items() if k != "union"},
                         recall, speed)
    assert report.report(lang, None, no_union, None)[1] is None  # the union did not run on every slice


def test_other_drafters_on_the_same_heldout_split_follow_when_given(runs, tmp_path):
    lang, spec, curve = runs
    heldout = tmp_path / "heldout.json"
    assert "heldout_compare" not in report.report(lang, None, spec, curve, None)[2]  # not given: no line
    with pytest.raises(FileNotFoundError, match="heldout_compare.py"):  # given but missing: said, not dropped
        report.report(lang, None, spec, curve, heldout)
    point = {"top1_at_depth": [0.5, 0.4], "by_group": {"en": {"top1_at_depth": [0.44, 0.3]}}}
    heldout.write_text(json.dumps({"drafters": {"shipped": point, "code-only": {
        "top1_at_depth": [0.3], "by_group": {"code": {"top1_at_depth": [0.3]}}}}}))
    text = report.report(lang, None, spec, curve, heldout)[2]
    assert "(`heldout_compare.py`): shipped 0.440 English, 0.500 overall." in text  # a drafter without English: left out

"""recipes/gemma3/budgets.py: DynaSpec paired with the static list of its mean size and the same tree, from
records written here."""

from __future__ import annotations

import json
import sys

from helpers import REPO, load_script

from hf_dynaspec.bench import read_records
from hf_dynaspec.generation.loop.stats import SpeculativeStats

budgets = load_script(REPO / "recipes/gemma3/budgets.py", "budgets")


def record(method, question, accepted, nodes, size, seconds=1.0):
    stats = SpeculativeStats(steps=10, accepted_tokens=accepted, tree_nodes=nodes, shortlist_total=size * 4,
                             shortlist_positions=4, recall_hits=5, recall_checks=10)
    return {"method": method, "category": "c", "question_id": question, "seconds": seconds, "new_tokens": 20,
            "stats": stats.to_dict(), "machine": "test"}


def test_each_dynaspec_method_meets_its_equal_size_static_partner_with_the_same_tree(tmp_path):
    rows = [record("dynaspec", q, 40, 50, 1000) for q in "ab"]
    rows += [record("static[static_size=1000]", q, 50, 70, 1000, seconds=2.0) for q in "ab"]
    rows += [record("static[static_size=999]", q, 90, 70, 999) for q in "ab"]  # another size: not a partner
    rows += [record("dynaspec[min_draft_prob=0]", q, 45, 80, 1000) for q in "ab"]  # its partner ran one prompt
    rows += [record("static[static_size=1000,min_draft_prob=0]", "a", 45, 80, 1000)]
    rows += [record("dynaspec[shortlist_k0=2]", "a", 45, 80, 500)]  # no partner at all
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = budgets.pairs(read_records(tmp_path / "records.jsonl"))
    assert [(p["dynaspec"], p["static"], p["prompts"]) for p in pairs] == [
        ("dynaspec", "static[static_size=1000]", 2), ("dynaspec[min_draft_prob=0]",
                                                      "static[static_size=1000,min_draft_prob=0]", 1)]
    first = pairs[0]
    assert first["accepted"] == [4.0, 5.0] and first["tree_nodes"] == [5.0, 7.0]
    assert first["tokens_per_s"] == [20.0, 10.0] and first["mean_shortlist"] == 1000
    text = budgets.markdown(pairs, "test")
    assert "| `dynaspec` | `static[static_size=1000]` | 2 | 1,000 | 4.00 vs 5.00 (0.800x) | 5.00 vs 7.00 |" in text


def test_the_partner_is_spelled_as_the_bench_takes_it_and_only_missing_ones_are_listed(tmp_path, capsys,
                                                                                          monkeypatch):
    assert budgets.partner_method("dynaspec", 7075) == "static[static_size=7075]"
    assert (budgets.partner_method("dynaspec[shortlist_k0=4,shortlist_k1=2,min_draft_prob=0]", 1460)
            == "static[static_size=1460,min_draft_prob=0]")
    assert budgets.partner_method("dynaspec-dyspec", 900) == "static[static_size=900,tree_policy=dyspec]"
    rows = [record("dynaspec", "a", 40, 50, 1000), record("static[static_size=1000]", "a", 40, 50, 1000),
            record("dynaspec[min_draft_prob=0,shortlist_k0=2]", "a", 40, 50, 300)]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(sys, "argv", ["budgets.py", str(tmp_path), "--partners"])
    budgets.main()
    assert capsys.readouterr().out.strip() == "static[static_size=300,min_draft_prob=0]"


def test_a_partner_run_under_another_spelling_is_not_listed_again(tmp_path):
    rows = [record("dynaspec[min_draft_prob=0]", "a", 40, 50, 300),
            record("static[min_draft_prob=0,static_size=300]", "a", 40, 50, 300)]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = read_records(tmp_path / "records.jsonl")
    assert budgets.missing_partners(records) == []
    assert [p["static"] for p in budgets.pairs(records)] == ["static[min_draft_prob=0,static_size=300]"]

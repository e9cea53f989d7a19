"""benchmarks/bench_verify.py: the results it writes for each n (all logits, walk logits, re-laid weights) and the
table it puts into a doc's generated block, leaving the doc's other text as it was."""

from __future__ import annotations

import json

from helpers import load_benchmark_script


def test_the_costs_by_n_go_to_results_and_to_the_docs_block(tmp_path, monkeypatch, one_thread):
    doc = tmp_path / "doc.md"
    doc.write_text("before\n\n<!-- verify-cost-tiny:begin -->\nold table\n<!-- verify-cost-tiny:end -->\n\nafter\n")
    bench = load_benchmark_script("bench_verify")
    monkeypatch.setattr("sys.argv", ["bench_verify.py", "--target", "tiny", "--context", "16", "--max-nodes", "3",
                                     "--repeats", "2", "--threads", "1", "--out", str(tmp_path / "out"),
                                     "--doc", str(doc)])
    bench.main()
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["n"] for r in result["rows"]] == [1, 2, 3]
    assert all(r[k] > 0 for r in result["rows"] for k in ("all_logits", "walk_logits", "relaid"))
    table = (tmp_path / "out" / "results.md").read_text().strip()
    text = doc.read_text()
    assert table in text and "old table" not in text
    assert text.startswith("before\n") and text.endswith("after\n") and "| 3 | " in table

"""benchmarks/bf16_divergence.py: where two greedy outputs first differ, and the summary it reports."""

from __future__ import annotations

from helpers import load_benchmark_script


def load_script():
    return load_benchmark_script("bf16_divergence")


def test_first_divergence_and_summary(tmp_path):
    script = load_script()
    assert script.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert script.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert script.first_divergence([1, 2, 3], [1, 2]) == 2  # a shorter output differs where it stops
    records = [{"question_id": q, "method": m, "first_divergence": d}
               for q, m, d in [("a", "dynaspec", None), ("b", "dynaspec", 7), ("c", "dynaspec", 3),
                               ("a", "batch2", None), ("b", "batch2", None), ("c", "batch2", 9),
                               ("a", "lookup", None), ("b", "lookup", None), ("c", "lookup", None)]]
    summary = script.summarize(records)
    dynaspec = summary["dynaspec"]
    assert (dynaspec["prompts"], dynaspec["diverged"], dynaspec["median_first_divergence"]) == (3, 2, 5)
    assert dynaspec["mcnemar_vs_batch2"]["discordant"] == [0, 1]  # b kept by batch2 only; none the other way
    assert summary["lookup"]["diverged"] == 0 and summary["lookup"]["median_first_divergence"] is None
    script.write_results(tmp_path, records, {"prompts": 3, "max_new_tokens": 16, "machine": "test"})
    assert "| dynaspec | 3 | 2 | 66.7% | 5 |" in (tmp_path / "results.md").read_text()

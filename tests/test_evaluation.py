"""The local `evaluate` modules load offline and compute known values on small fixed inputs; the quality
run's answer parsing and summary; significance in the bench tables.

    python -m pytest tests/test_evaluation.py -q
"""

from __future__ import annotations

import math

import pytest
from scipy.stats import binom

from hf_dynaspec import quality
from hf_dynaspec.bench import Record, headline_table, summarize
from hf_dynaspec.evaluation import MODULES, load
from hf_dynaspec.generation.loop.stats import SpeculativeStats


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No network: the modules are loaded by path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")


def test_every_module_loads_and_unknown_names_are_refused():
    assert all(load(name).name for name in MODULES)
    with pytest.raises(ValueError, match="exact_match"):
        load("accuracy")


def test_exact_match():
    result = load("exact_match").compute(predictions=["18", " 3 ", "70000", ""], references=["18", "3", "7000", "5"])
    assert result == {"exact_match": 0.5, "matches": 2, "items": 4}


def test_mcnemar_counts_discordant_pairs_and_gives_the_exact_p_value():
    first = [1] * 10 + [1] * 8 + [0] * 2 + [0] * 30
    second = [1] * 10 + [0] * 8 + [1] * 2 + [0] * 30
    result = load("mcnemar").compute(predictions1=first, predictions2=second)
    assert result["discordant"] == [8, 2]
    assert result["p_value"] == pytest.approx(2 * binom.cdf(2, 10, 0.5))  # 0.109375
    assert result["difference"] == pytest.approx(6 / 50)
    se = math.sqrt(10 - 36 / 50) / 50
    assert result["difference_ci"] == pytest.approx([0.12 - 1.96 * se, 0.12 + 1.96 * se])
    same = load("mcnemar").compute(predictions1=[1, 0, 1], predictions2=[1, 0, 1])
    assert same["p_value"] == 1.0 and same["difference_ci"] == [0.0, 0.0]


def test_paired_speedup():
    method = [1.0, 2.0, 1.0, 1.0, 2.0, 1.0, 1.0, 2.0]
    baseline = [2.0 * t for t in method]  # exactly twice as slow on every prompt
    result = load("paired_speedup").compute(predictions1=method, predictions2=baseline)
    assert result["speedup"] == pytest.approx(2.0) and result["ci"] == pytest.approx([2.0, 2.0])
    assert result["p_value"] == pytest.approx(2 / 2**8)  # all 8 signed ranks positive: exact two-sided p
    noisy = load("paired_speedup").compute(predictions1=[1.0, 1.1, 0.9, 1.0], predictions2=[1.05, 1.0, 1.0, 0.95])
    assert noisy["ci"][0] < 1.0 < noisy["ci"][1] and noisy["p_value"] > 0.05


@pytest.mark.parametrize(("text", "number"), [
    ("so 3 + 4 = 7.\nThe answer is 18.", "18"), ("The answer is $1,200.50", "1200.5"),
    ("It costs -3 dollars", "-3"), ("no numbers here", ""), ("#### 70000", "70000"), ("2.0 apples", "2"),
])
def test_final_number(text, number):
    assert quality.final_number(text) == number


def test_quality_summary_from_records():
    rows = []
    for index in range(6):
        for method in quality.METHODS:
            correct = index < 3 if method != "dynaspec-sample" else index < 2
            rows.append(quality.Answer(index, method, f"text {index}" if "greedy" in method else f"{method} {index}",
                                       "1" if correct else "0", "1", correct, 10 + index, 1.0))
    summary = quality.summarize_quality(rows)
    assert summary["questions"] == 6 and summary["greedy_text_exact_match"] == 1.0
    assert summary["methods"]["plain-sample"]["accuracy"] == 0.5
    assert summary["methods"]["dynaspec-sample"]["correct"] == 2
    assert summary["mcnemar_dynaspec_vs_plain_sampling"]["discordant"] == [0, 1]
    lo, hi = summary["methods"]["plain-sample"]["accuracy_ci"]
    assert lo < 0.5 < hi
    with pytest.raises(ValueError, match="every method"):
        quality.summarize_quality(rows[:-1])


def test_bench_tables_carry_intervals_and_significance():
    def rec(method, qid, seconds):
        stats = SpeculativeStats(steps=10, accepted_tokens=20, shortlist_total=30, shortlist_positions=10)
        return Record(method, "c", qid, seconds, 20, stats=None if method == "plain" else stats.to_dict())

    records = []
    for i in range(12):
        records += [rec("plain", str(i), 2.0 + 0.1 * i), rec("dynaspec", str(i), 1.0 + 0.05 * i),
                    rec("full", str(i), 1.3 + 0.065 * i), rec("static", str(i), (1.0 + 0.05 * i) * (1.0 + 0.01 * (-1) ** i))]
    summaries = summarize(records)
    dyn = next(s for s in summaries if s.method == "dynaspec" and s.category == "overall")
    assert dyn.extra["p_vs_plain"] < 0.05 and dyn.extra["speedup_ci"] == pytest.approx([2.0, 2.0])
    assert dyn.extra["p_vs_static"] > 0.05  # alternating +-1%: no systematic difference
    line = headline_table(summaries, "dynaspec").splitlines()[-1]
    assert "| 2.00x* (2.00-2.00) | 1.30x* (1.30-1.30) |" in line and "| 1.00x (" in line

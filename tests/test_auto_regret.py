"""benchmarks/auto_regret.py on synthetic records: the best fixed configuration, the defaults against it (pooled and
per prompt), the prompts below plain, mismatches, and the files it writes."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from helpers import load_benchmark_script

from hf_dynaspec.bench import Record

SECONDS = {  # prompt -> method -> seconds
    "a": {"plain": 1.0, "dynaspec": 0.5, "tree": 0.6, "chain": 0.8},
    "b": {"plain": 1.0, "dynaspec": 1.2, "tree": 0.8, "chain": 0.9},
}


def records(mismatch: bool = False) -> list[Record]:
    return [Record(method, "qa", qid, seconds, 10, matches_plain=not (mismatch and method == "chain"),
                   machine="test machine")
            for qid, by_method in SECONDS.items() for method, seconds in by_method.items()]


def test_the_defaults_are_compared_with_the_best_fixed_configuration():
    regret = load_benchmark_script("auto_regret")
    result = regret.analyse(records())
    assert result["best_fixed"] == "tree"  # 1.4 s against chain's 1.7 s
    assert result["auto_over_best_fixed"] == pytest.approx(1.4 / 1.7)
    assert result["speedup_over_plain"]["dynaspec"] == pytest.approx(2.0 / 1.7)
    assert result["below_plain"] == ["b"] and result["below_best_fixed"] == ["b"]
    low, high = result["interval_95"]
    assert low <= result["auto_over_best_fixed"] <= high
    assert result["mismatches"] == [] and result["machines"] == ["test machine"]


def test_a_mismatch_is_reported_and_the_files_are_written(tmp_path):
    regret = load_benchmark_script("auto_regret")
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in records(mismatch=True)))
    assert regret.main(["--out", str(tmp_path), "--analyse-only", "--methods", "dynaspec,tree,chain"]) == 1
    report = (tmp_path / "regret" / "results.md").read_text()
    assert "Outputs differing from plain greedy: 2" in report and (tmp_path / "regret" / "regret.png").is_file()


def test_records_without_a_fixed_configuration_are_refused():
    regret = load_benchmark_script("auto_regret")
    with pytest.raises(ValueError, match="no fixed configuration"):
        regret.analyse([r for r in records() if r.method in ("plain", "dynaspec")])

"""benchmarks/step_policy.py on synthetic records: per-prompt speedups, the slow prompts before and after
their paired reruns, the policy's prediction figures and the files it writes."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from helpers import load_benchmark_script, tiny_drafter, tiny_target

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.bench import Record, run_identity
from hf_dynaspec.generation.loop.stats import SpeculativeStats


def records() -> list[Record]:
    """Three prompts: plain takes 1 s each; the policy 0.5 s, 0.9 s (slow) and 1.2 s (slow)."""
    out = []
    for qid, seconds in (("a", 0.5), ("b", 0.9), ("c", 1.2)):
        out.append(Record("plain", "writing", qid, 1.0, 10))
        stats = SpeculativeStats(steps=5, accepted_tokens=10, predicted_steps=4, predicted_tokens=8.4,
                                 realized_tokens=8, plain_steps=1)
        out.append(Record("dynaspec", "writing", qid, seconds, 10, stats=stats.to_dict()))
    return out


def test_slow_prompts_count_after_their_paired_reruns(tmp_path):
    script = load_benchmark_script("step_policy")
    recs = records()
    assert script.per_prompt(recs)["dynaspec"] == pytest.approx({"a": 2.0, "b": 1 / 0.9, "c": 1 / 1.2})
    reruns = {("dynaspec", "c"): {"plain_seconds": [1.0, 1.0, 1.0], "method_seconds": [0.9, 1.0, 1.0]}}
    meta = {"bench": "x", "prompts": 3, "max_new_tokens": 10, "machine": "test machine"}
    result = script.analyse(recs, reruns, meta)
    m = result["methods"]["dynaspec"]
    assert m["pooled_speedup"] == pytest.approx(3.0 / 2.6)
    assert (m["below_first_run"], m["rerun"], m["below_after_rerun"]) == (1, 1, 0)  # c was noise: 3 / 2.9
    assert m["prediction"]["pooled_ratio"] == pytest.approx(1.05) and m["prediction"]["runs_within_10pct"] == 3
    assert m["plain_steps"] == 3
    text = script.report(result)
    assert "| `dynaspec` | 1.15x |" in text and "1 / 0 of 3" in text
    assert script.plot(result, tmp_path).is_file()


def test_main_writes_results_from_a_bench_folder(tmp_path):
    script = load_benchmark_script("step_policy")
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in records()))
    (tmp_path / "run.json").write_text(json.dumps({"max_new_tokens": 10, "prompt_format": "chat"}))
    result = script.main(["--bench", str(tmp_path)])
    assert (tmp_path / "step-policy" / "results.md").is_file()
    assert result["methods"]["dynaspec"]["below_after_rerun"] == 1  # not rerun: the slow prompt counts


def test_a_rerun_loads_the_benchs_target_and_refuses_another_drafter(tmp_path):
    """The rerun reloads what the bench folder's run.json names; a drafter whose weights differ from the bench's
    is refused with a message that says what to pass (run on tiny models: the loader is passed in)."""
    script = load_benchmark_script("step_policy")
    target = tiny_target()
    tiny_drafter(target).save_pretrained(tmp_path / "shipped")
    tiny_drafter(target, seed=1).save_pretrained(tmp_path / "other")
    bound = DynaSpecDrafter.from_pretrained(tmp_path / "shipped").bind(target).eval()
    run = {**run_identity(target, bound, 16, "chat"), "target": "some/target"}
    asked = []

    def load(name):
        asked.append(name)
        return target, None

    loaded, _, drafter = script.bench_models(run, tmp_path / "shipped", load)
    assert asked == ["some/target"] and loaded is target and drafter.config.vocab_size == target.config.vocab_size
    with pytest.raises(SystemExit, match="not the drafter this bench measured"):
        script.bench_models(run, tmp_path / "other", load)
    with pytest.raises(SystemExit, match="no shipped drafter here: pass --drafter"):
        script.bench_models(run, None, load)

"""benchmarks/bench_head.py: one case timed and checked against the dense head, the results it writes (head
costs as shares of a decoding step), and the arguments it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import load_benchmark_script


def load_script():
    return load_benchmark_script("bench_head")


def test_one_case_and_the_results_it_writes(tmp_path):
    script = load_script()
    args = script.parse_args(["--shapes", "smollm", "--repeats", "1", "--quick"])
    weight = torch.randn(512, 16)  # (V, d): a small head with the smollm label
    row = script.bench_case("smollm", weight, n=2, fraction=4, args=args, gen=torch.Generator().manual_seed(0))
    times = [row.dense_ms, row.dense_t_ms, row.gathered_ms, row.index_select_ms, row.segmented_ms, row.static_ms]
    assert all(t > 0 for t in times) and (row.n, row.fraction) == (2, 4)
    meta = {"machine": "test", "dtype": "float32", "target": "smollm2", "plain_step_ms": 2 * row.dense_ms,
            "command": "python benchmarks/bench_head.py --test"}
    script.write_results(tmp_path, [row], meta)
    text = (tmp_path / "results.md").read_text()
    assert "(50%)" in text  # the full head's share of a step that costs twice as much
    assert "| 128 (1/4) |" in text  # the shortlist: V / fraction rows
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["fraction"] == 4


def test_gemma3_shape_takes_its_own_shortlist_fractions():
    script = load_script()
    assert script.SHAPES["gemma3"] == (262144, 640)
    assert min(script.SHAPE_FRACTIONS["gemma3"]) == 8  # 32,768 tokens: FR-Spec's usual size


@pytest.mark.parametrize("argv", [["--target", "gemma3", "--shapes", "smollm"],
                                  ["--target", "gemma3", "--shapes", "gemma3", "--device", "cuda"]])
def test_refuses_a_target_that_cannot_be_measured_as_asked(argv, capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(argv)
    assert "--target" in capsys.readouterr().err

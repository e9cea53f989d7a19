"""benchmarks/verify_prefilter.py: its measurement of the prefilter on stored states reports the candidates, the
fp32 argmax among them and the realised error within the bound."""

from __future__ import annotations

import torch
from helpers import REPO, load_script

probe = load_script(REPO / "benchmarks/verify_prefilter.py", "verify_prefilter")


def test_measure_reports_the_argmax_inside_and_the_error_within_the_bound():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 48, generator=generator)
    hidden = torch.randn(70, 48, generator=generator)  # two chunks of the measurement
    prefilter = probe.Prefilter.of(weight)
    found = probe.measure(hidden, prefilter)
    assert found["positions"] == found["argmax_among_candidates"] == 70
    assert found["prefilter_argmax_equals_fp32"] is True
    assert 0 < found["largest_error_over_bound"] < 1
    assert 1 <= found["candidates_median"] <= found["candidates_p99"] <= found["candidates_max"] < 3000
    table = probe.report({"meta": {"target": "t", "vocab": 3000, "hidden": 48, "features": "f", "machine": "m"},
                          "candidates": found, "timing_ms": probe.timings(hidden, prefilter, [1, 2], repeats=2)})
    assert "| 70 of 70 | True |" in table and "prefilter" in table

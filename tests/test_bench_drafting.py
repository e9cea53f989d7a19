"""benchmarks/bench_drafting.py on a tiny target: every path drafts the same trees (the script checks it), the device
path reads its tree once, the files are written. The compiled path is left out here (inductor takes a minute)."""

from __future__ import annotations

import json

from helpers import load_benchmark_script


def test_quick_run_writes_its_table(tmp_path, capsys):
    script = load_benchmark_script("bench_drafting")
    script.main(["--target", "tiny", "--quick", "--threads", "1", "--paths", "host", "device", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    by_path = {r["path"]: r for r in results["summary"]}
    assert set(by_path) == {"host", "device"}
    assert by_path["device"]["host_reads"] == 1 < by_path["host"]["host_reads"]
    assert by_path["host"]["vs_host"] == 1.0 and by_path["device"]["ms"] > 0
    assert "| (6, 3, 2) | device |" in (tmp_path / "results.md").read_text()

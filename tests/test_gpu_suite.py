"""benchmarks/gpu_suite.py, run as the GPU session will run it but with `--quick` on CPU (tiny shapes, the Triton
kernel under its interpreter): every section's JSON has its keys and plausible values, a rerun skips the saved
sections, `--force` redoes one, a failing section is reported and left unsaved, and results.md is made from
results.json.

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_gpu_suite.py
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_benchmark_script

QUICK = ["--quick", "--device", "cpu", "--triton-interpret"]  # conftest.py sets TRITON_INTERPRET=1

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def suite() -> ModuleType:
    return load_benchmark_script("gpu_suite")


@pytest.fixture(scope="module")
def run(suite, tmp_path_factory, one_thread) -> tuple[Path, dict]:
    """One quick run of every section into a fresh folder: (folder, results.json's content)."""
    out = tmp_path_factory.mktemp("gpu-suite")
    results = suite.main([*QUICK, "--out", str(out)])
    return out, results


def section(out: Path, name: str) -> dict:
    return json.loads((out / "sections" / f"{name}.json").read_text())


def test_every_section_is_saved_with_its_meta(suite, run):
    out, results = run
    assert results["errors"] == {}
    for name in suite.SECTIONS:
        data = section(out, name)
        assert {"name", "meta", "seconds", "rows", "notes"} <= set(data), name
        assert data["name"] == name and data["rows"] and data["seconds"] > 0
        meta = data["meta"]
        assert meta["quick"] is True and meta["device_type"] == "cpu"
        assert {"device", "torch", "triton", "transformers", "timestamp"} <= set(meta)
        assert results["sections"][name] == data  # results.json gathers the section files
    meta = results["meta"]
    assert meta["torch"] and meta["transformers"] and meta["timestamp"] and meta["plan"]["head_rows"]
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results, default=str))


def test_head_rows(suite, run):
    out, _ = run
    data = section(out, "head")
    plan = suite.QUICK
    assert len(data["rows"]) == len(plan.head_vocab) * len(plan.head_dims) * len(plan.head_rows) * len(
        plan.head_shares)
    for row in data["rows"]:
        assert row["shortlist"] == max(1, round(row["share"] * row["vocab"]))
        for key in ("dense_ms", "index_select_ms", "triton_ms", "speedup_triton_vs_index_select", "roofline_ms",
                    "triton_roofline_fraction", "index_select_roofline_fraction", "dense_roofline_fraction"):
            assert row[key] > 0, key
        # bf16 outputs on both sides: within a few bf16 steps of the logits' size
        assert row["triton_max_rel_err"] < 0.05
        expected_bytes = row["shortlist"] * row["d"] * 2 + row["rows"] * (row["d"] + row["shortlist"]) * 2
        assert row["bytes"] == expected_bytes + 8 * row["shortlist"]
    assert data["summary"]["triton_timed"] and data["summary"]["speedup_geomean"] > 0
    assert any("TRITON_INTERPRET" in note for note in data["notes"])


def test_head_tune_sweeps_every_launch_config(suite, run):
    out, _ = run
    data = section(out, "head")
    plan = suite.QUICK
    assert [(c["vocab"], c["d"], c["share"]) for c in data["tune"]] == list(plan.tune_cases)
    for case in data["tune"]:
        swept = [(c["block_s"], c["block_k"], c["num_warps"], c["num_stages"]) for c in case["configs"]]
        assert swept == list(plan.tune_configs) and case["rows"] == plan.tune_rows
        timed = [c for c in case["configs"] if "ms" in c]
        assert timed and case["best"]["ms"] == min(c["ms"] for c in timed)
        assert case["best"]["roofline_fraction"] == case["roofline_ms"] / case["best"]["ms"]
    assert "best block_s/block_k/warps/stages" in (out / "results.md").read_text()


def test_verify_rows(suite, run):
    out, _ = run
    data = section(out, "verify")
    plan = suite.QUICK
    got = {(r["context"], r["mask"], r["nodes"]) for r in data["rows"]}
    assert got == {(c, m, n) for c in plan.verify_contexts for m in ("tree", "causal") for n in plan.verify_nodes}
    for row in data["rows"]:
        assert row["ms"] > 0 and row["cost"] > 0
        if row["nodes"] == 1:
            assert row["cost"] == 1.0
    assert data["model"]["hidden_size"] == plan.verify_model["hidden_size"]


def test_drafter_rows(suite, run):
    out, _ = run
    data = section(out, "drafter")
    plan = suite.QUICK
    assert len(data["rows"]) == len(plan.drafter_targets) * len(plan.drafter_rows) * len(load_benchmark_script("gpu_common").TIMED_HEAD_MODES)
    for row in data["rows"]:
        assert row["step_beside_ms"] > 0 and row["step_sequential_ms"] > 0
        assert row["router_ms"] > 0 and row["head_ms"] > 0
        k0 = plan.num_clusters // 8
        expected = {"full": row["vocab"], "static": round(row["vocab"] * k0 / plan.num_clusters)}
        expected["dynamic"] = expected["dynamic-lanes"] = expected["static"]  # k0 of M equal random clusters
        assert row["shortlist_mean"] == expected[row["head_mode"]], row


def test_steps_replay_every_draft_step_shape_from_its_graph(suite, run):
    out, _ = run
    data = section(out, "steps")
    plan, modes = suite.QUICK, load_benchmark_script("gpu_steps").STEP_HEAD_MODES
    assert {(r["shape"], r["positions"], r["head_mode"]) for r in data["rows"]} == {
        (shape, f, mode) for shape in plan.step_targets for f in plan.drafter_rows for mode in modes}
    for row in data["rows"]:
        assert row["eager_ms"] > 0 and row["graphed_ms"] > 0 and row["fallback"] is None, row
        assert row["same_children"] and row["max_log_q_diff"] < 1e-4, row
        if row["head_mode"] == "full":
            assert row["vs_full_step"] == 1.0
    assert "## draft step / plain target step" in (out / "results.md").read_text()


def test_exactness_is_total_in_fp32_on_cpu(suite, run):
    out, _ = run
    data = section(out, "exactness")
    plan = suite.QUICK
    assert len(data["rows"]) == len(plan.exact_targets) * 2 * plan.prompts * len(plan.trees)
    assert data["identical_share_by_dtype"]["float32"] == 1.0
    for row in data["summary"]:
        assert 0.0 <= row["identical_share"] <= 1.0 and row["runs"] == plan.prompts
        if row["dtype"] == "float32":
            assert row["identical_share"] == 1.0 and row["first_divergences"] == []
    assert {r["target"] for r in data["rows"]} == set(plan.exact_targets)


def test_syncs_are_counted(suite, run):
    out, _ = run
    data = section(out, "syncs")
    assert {(r["target"], r["tree"], r["drafting"]) for r in data["rows"]} == {
        (t, tree, drafting) for t in suite.QUICK.sync_targets for tree in suite.QUICK.trees
        for drafting in ("host", "device")
    }
    for row in data["rows"]:
        assert row["steps"] > 0 and row["mean"] > 0 and row["max"] >= row["mean"]
        assert row["tokens_per_step"] >= 1 and sum(row["by_kind"].values()) == pytest.approx(row["mean"])
    by_key = {(r["target"], r["tree"], r["drafting"]): r for r in data["rows"]}
    for target, tree, drafting in by_key:
        if drafting == "device":  # the same drafts read from the device fewer times
            assert by_key[(target, tree, "device")]["mean"] < by_key[(target, tree, "host")]["mean"]


def test_trees_time_a_step_of_every_candidate_default_tree(suite, run):
    out, _ = run
    data = section(out, "trees")
    trees = [row["tree"] for row in data["rows"]]
    assert trees == load_benchmark_script("gpu_decoding").candidate_trees() and len(trees) > 1
    assert data["plain_ms_per_token"] > 0
    for row in data["rows"]:
        assert row["steps"] >= 1 and row["step_ms"] > 0 and row["cost"] == row["step_ms"] / data["plain_ms_per_token"]
        assert row["tokens_per_step"] >= 1 and row["tree_nodes_per_step"] > 0


def test_batch_rows_cover_every_size_and_method_and_are_exact(suite, run):
    out, _ = run
    data = section(out, "batch")
    methods = list(load_benchmark_script("gpu_decoding").BATCH_METHODS)
    assert [(r["batch_size"], r["method"]) for r in data["rows"]] == [
        (size, method) for size in suite.QUICK.batch_sizes for method in methods]
    for row in data["rows"]:
        assert row["ms"] > 0 and row["tokens_per_s"] > 0 and row["speedup"] > 0
        assert row["identical_rows"] == row["rows"] == row["batch_size"]  # fp32 on CPU: every row exact
    assert max(suite.QUICK.batch_sizes) > 2  # a batch of mixed prompt lengths is among them


def test_markdown_is_made_from_the_json(suite, run):
    out, _ = run
    text = (out / "results.md").read_text()
    assert text == suite.render_markdown(json.loads((out / "results.json").read_text()))
    for name in suite.SECTIONS:
        assert f"## {name}" in text
    assert "| n | ctx" in text and "Identical outputs:" in text


def test_rerun_skips_saved_sections_and_force_redoes_one(suite, run):
    out, _ = run
    paths = {name: out / "sections" / f"{name}.json" for name in suite.SECTIONS}
    stamps = {name: path.stat().st_mtime_ns for name, path in paths.items()}
    results = suite.main([*QUICK, "--out", str(out)])  # nothing runs: every section is on disk
    assert {name: path.stat().st_mtime_ns for name, path in paths.items()} == stamps
    log = (out / "log.txt").read_text()
    assert all(f"skip {name}" in log for name in suite.SECTIONS)
    assert set(results["sections"]) == set(suite.SECTIONS) and results["errors"] == {}

    suite.main([*QUICK, "--out", str(out), "--sections", "syncs", "--force"])
    after = {name: path.stat().st_mtime_ns for name, path in paths.items()}
    assert after["syncs"] != stamps["syncs"]
    assert {k: v for k, v in after.items() if k != "syncs"} == {k: v for k, v in stamps.items() if k != "syncs"}


def test_a_failing_section_is_reported_and_not_saved(suite, tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("device fell over")

    monkeypatch.setitem(suite.RUNNERS, "verify", broken)
    results = suite.main([*QUICK, "--out", str(tmp_path), "--sections", "verify"])
    assert "device fell over" in results["errors"]["verify"]
    assert not (tmp_path / "sections" / "verify.json").exists()
    assert "verify failed" in (tmp_path / "results.md").read_text()
    assert "FAILED verify" in (tmp_path / "log.txt").read_text()


def test_quick_sections_are_redone_by_a_full_run(suite, run):
    out, _ = run
    ctx = suite.Context(suite.parse_args(["--out", str(out), "--device", "cpu"]), suite.FULL,
                        suite.torch.device("cpu"), suite.torch.bfloat16)
    assert not suite.is_done(out / "sections" / "head.json", ctx)  # saved by a --quick run
    ctx.args.quick = True
    assert suite.is_done(out / "sections" / "head.json", ctx)


def test_sections_saved_by_other_code_are_redone(suite, run, monkeypatch):
    out, _ = run
    ctx = suite.Context(suite.parse_args(["--out", str(out), "--device", "cpu", "--quick"]), suite.QUICK,
                        suite.torch.device("cpu"), suite.torch.bfloat16)
    assert suite.is_done(out / "sections" / "head.json", ctx)
    monkeypatch.setattr(suite, "source_hash", lambda: "another version")
    assert not suite.is_done(out / "sections" / "head.json", ctx)

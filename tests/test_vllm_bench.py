"""benchmarks/serving/vllm_bench.py's summary, from per-configuration runs written here (vLLM itself runs only in
the serving benchmark's environment): speed against plain per batch, vLLM's acceptance counts, greedy identity."""

from __future__ import annotations

import json

import pytest
from helpers import REPO, load_script

bench = load_script(REPO / "benchmarks/serving/vllm_bench.py", "vllm_bench")
META = {"target": "t", "prompts": 2, "max_new_tokens": 4, "num_speculative_tokens": 3, "dtype": "float32",
        "vllm": "0.32.0", "machine": "test"}


def write(folder, name, batch, seconds, tokens, drafts=0, drafted=0, accepted=0, draft=None):
    metrics = dict(zip(bench.METRICS, (drafts, drafted, accepted)))
    run = {"seconds": seconds, "tokens": tokens, "metrics": metrics, "meta": META}
    (folder / f"{name}-b{batch}.json").write_text(json.dumps(run | ({} if draft is None else {"draft": draft})))


def test_summary_compares_each_configuration_with_plain_at_its_batch(tmp_path):
    same, other = [[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 6, 0, 8]]
    write(tmp_path, "plain", 1, 2.0, same)
    write(tmp_path, "dynaspec-plugin", 1, 1.0, same, drafts=4, drafted=12, accepted=6,
          draft={"calls": 4, "seconds": 0.1})  # the proposer's draft timer: 25 ms per step
    write(tmp_path, "plain", 8, 1.0, same)
    write(tmp_path, "static-eagle3", 8, 2.0, other, drafts=4, drafted=12, accepted=3)  # measured before the timer
    text = bench.summarize(tmp_path, readme=False)
    assert "| dynaspec-plugin | 1 | 8.0 | 2.00x | 4 | 6 / 12 | 1.50 | 25.0 | 2 of 2 |" in text
    assert "| static-eagle3 | 8 | 4.0 | 0.50x | 4 | 3 / 12 | 0.75 |  | 1 of 2 |" in text
    assert "| plain | 1 | 4.0 | 1.00x | 0 | 0 / 0 | 0.00 |  | 2 of 2 |" in text
    assert text.index("| plain | 1 |") < text.index("| dynaspec-plugin | 1 |") < text.index("| plain | 8 |")
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["configuration"], r["batch"]) for r in rows} == {("plain", 1), ("dynaspec-plugin", 1), ("plain", 8),
                                                                ("static-eagle3", 8)}
    assert (tmp_path / "tokens_per_s.png").is_file()


def test_the_plugin_is_compared_with_every_other_draft_at_its_batch(tmp_path):
    for batch, static_ms in ((1, 40.0), (8, 10.0)):
        write(tmp_path, "plain", batch, 1.0, [[1]])
        write(tmp_path, "static-32k", batch, 1.0, [[1]], drafts=10, drafted=30, accepted=8,
              draft={"calls": 10, "seconds": static_ms / 100})
        write(tmp_path, "dynaspec-plugin", batch, 1.0, [[1]], drafts=10, drafted=30, accepted=10,
              draft={"calls": 10, "seconds": 0.2})  # 20 ms per step
        write(tmp_path, "dynaspec-plugin-u8k", batch, 1.0, [[1]], drafts=10, drafted=30, accepted=1,
              draft={"calls": 10, "seconds": 0.01})  # a variant of the plugin: not a baseline
    text = bench.summarize(tmp_path, readme=False)
    assert ("Batch 1: the plugin's draft step takes 0.50x static-32k's (20.0 vs 40.0 ms) at 1.250x its acceptance "
            "(1.000 vs 0.800 accepted per draft).") in text
    assert "Batch 8: the plugin's draft step takes 2.00x static-32k's (20.0 vs 10.0 ms)" in text
    assert "u8k's" not in text


def test_drafts_keep_the_order_given_and_plain_comes_first(tmp_path):
    (tmp_path / "order.json").write_text(json.dumps(["plain", "static-32k", "full-head", "dynaspec-plugin"]))
    for name in ("dynaspec-plugin", "full-head", "static-32k", "plain"):
        write(tmp_path, name, 1, 1.0, [[1]])
    assert list(bench.read_runs(tmp_path)) == ["plain-b1", "static-32k-b1", "full-head-b1", "dynaspec-plugin-b1"]


def test_draft_names_are_checked():
    assert bench.parse_drafts(["a=/x", "static-32k=/y"]) == {"a": "/x", "static-32k": "/y"}
    for bad in ("plain=/x", "nofolder", "=/x", "x-b1=/y"):
        with pytest.raises(SystemExit, match="NAME=FOLDER"):
            bench.parse_drafts([bad])


def test_each_configuration_process_gets_this_runs_settings(tmp_path):
    args = bench.build_parser().parse_args([
        "--target", "t", "--out", str(tmp_path), "--draft", "x=/d", "--prompts", "3", "--per-category", "1",
        "--prompt-format", "qa", "--max-new-tokens", "7", "--batches", "8"])
    one = bench.build_parser().parse_args(bench.one_arguments(args, "/d", 8, tmp_path / "x-b8.json"))
    assert one.one and one.draft == "/d" and one.batch == 8 and one.json == tmp_path / "x-b8.json"
    for field in ("target", "out", "prompts", "per_category", "prompt_format", "max_new_tokens", "num_drafts",
                  "dtype", "prompts_file"):
        assert getattr(one, field) == getattr(args, field), field
    assert bench.build_parser().parse_args(bench.one_arguments(args, None, 1, tmp_path / "p.json")).draft is None


def test_base_model_format():
    assert bench.formatted(None, ["Why?"], "qa") == ["Question: Why?\nAnswer:"]


def test_a_run_is_kept_only_while_its_draft_comes_from_the_same_weights_and_plain_shares_its_run(tmp_path, monkeypatch):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "source-digest").write_text("aaaa\n")
    out = tmp_path / "out"
    out.mkdir()
    args = bench.build_parser().parse_args(["--target", "t", "--out", str(out), "--draft", f"x={draft}", "--batches", "1"])
    for name, digest in (("plain", None), ("x", "aaaa")):
        (out / f"{name}-b1.json").write_text(json.dumps({"meta": META | {"draft_digest": digest}}))
    ran = []
    monkeypatch.setattr(bench.subprocess, "run", lambda command, **kw: ran.append(command[command.index("--json") + 1]))
    bench.run_all(args)
    assert ran == []  # both measured with these weights: kept
    (draft / "source-digest").write_text("bbbb\n")  # the drafter was retrained and exported anew
    bench.run_all(args)
    assert ran == [str(out / "plain-b1.json"), str(out / "x-b1.json")]  # plain again: the ratios share a run
    assert bench.draft_digest(str(draft)) == "bbbb" and bench.draft_digest(None) is None

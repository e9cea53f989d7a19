"""The command line on a tiny random target: init, generate, push --dry-run (no network)."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from hf_dynaspec.cli import build_parser, main
from hf_dynaspec.targets import shipped_drafter


def test_init_generate_push(tmp_path, capsys):
    out = tmp_path / "drafter"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(out)]) == 0
    assert (out / "config.json").is_file() and any(p.endswith(".safetensors") for p in os.listdir(out))
    assert main(["generate", "--target", "tiny", "--drafter", str(out), "--prompt", "hello",
                 "--max-new-tokens", "8", "--tree-policy", "dyspec"]) == 0
    assert "| True |" in capsys.readouterr().out
    assert main(["generate", "--target", "tiny", "--drafter", str(out), "--prompt", "hello",
                 "--max-new-tokens", "8", "--step-policy", "auto"]) == 0
    assert "| True |" in capsys.readouterr().out
    assert main(["demo", "--target", "tiny", "--drafter", str(out), "--prompt", "hello", "--max-new-tokens", "8",
                 "--prompt-format", "qa"]) == 0
    assert "| True |" in capsys.readouterr().out
    assert main(["push", str(out), "me/drafter", "--dry-run"]) == 0
    assert "would upload to me/drafter" in capsys.readouterr().out


def test_demo_picks_the_drafter_shipped_for_its_target(capsys):
    assert shipped_drafter("gemma3").name == "gemma-3-270m" == shipped_drafter("google/gemma-3-270m").name
    assert shipped_drafter("smollm2").name == "smollm2-135m-instruct"
    assert main(["demo", "--target", "tiny"]) == 1  # no drafter ships for it: said, not SmolLM2's tried
    assert "pass --drafter" in capsys.readouterr().err


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["push", str(tmp_path), "me/drafter", "--dry-run"]) == 1
    assert "config.json is missing" in capsys.readouterr().err


def test_bench_on_a_tiny_target(tmp_path, capsys):
    import json

    drafter = tmp_path / "drafter"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(drafter)]) == 0
    out = tmp_path / "bench"
    code = main(["bench", "--target", "tiny", "--drafter", str(drafter), "--limit", "2", "--max-new-tokens", "8",
                 "--methods", "plain,dynaspec[step_policy=off],full[step_policy=off],dynaspec-dyspec,prompt-lookup", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    overall = {s["method"]: s for s in results["summaries"] if s["category"] == "overall"}
    # the two heads verify their whole trees every step (short calls might otherwise not draft): twins by head
    dynaspec, full = "dynaspec[step_policy=off]", "full[step_policy=off]"
    assert set(overall) == {"plain", dynaspec, full, "dynaspec-dyspec", "prompt-lookup"}
    assert all(s["mismatches"] == 0 for s in overall.values())
    assert len(results["records"]) == 5 * 2 * 13  # methods x prompts per category x categories
    assert f"| overall | {dynaspec} |" in (out / "results.md").read_text()
    assert (out / "speedup.png").is_file() and (out / "shortlist_vs_acceptance.png").is_file()
    assert overall[full]["shortlist_recall"] == 1.0  # the full head holds every token
    assert 0.0 <= overall[dynaspec]["shortlist_recall"] <= 1.0 and overall["plain"]["shortlist_recall"] is None
    assert overall[dynaspec]["extra"]["speedup_vs_full"] > 0
    assert "of rows / columns / prefilter)" in results["meta"]["verify_head_auto"]  # greedy: all three timed
    assert all(len(r["output_ids"]) == r["new_tokens"] for r in results["records"] if r["method"] == "plain")
    assert all(r["output_ids"] is None for r in results["records"] if r["method"] != "plain")

    # a stopped run resumes: cut the records to the first prompt and rerun; only the rest is measured again
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 5 * 2 * 13
    (out / "records.jsonl").write_text("\n".join(lines[:5]) + "\n")
    from hf_dynaspec import bench

    calls = []
    original = bench.bench_prompt
    bench.bench_prompt = lambda *a, **k: calls.append(a[3]["question_id"]) or original(*a, **k)
    try:
        assert main(["bench", "--target", "tiny", "--drafter", str(drafter), "--limit", "2", "--max-new-tokens",
                     "8", "--methods", "plain,dynaspec[step_policy=off],full[step_policy=off],dynaspec-dyspec,prompt-lookup", "--out", str(out)]) == 0
    finally:
        bench.bench_prompt = original
    assert len(calls) == 2 * 13 - 1 and json.loads(lines[0])["question_id"] not in calls
    assert len(json.loads((out / "results.json").read_text())["records"]) == 5 * 2 * 13
    # a rerun with nothing left to measure keeps what verify_head="auto" took for the records
    assert main(["bench", "--target", "tiny", "--drafter", str(drafter), "--limit", "2", "--max-new-tokens", "8",
                 "--methods", "plain,dynaspec[step_policy=off],full[step_policy=off],dynaspec-dyspec,prompt-lookup", "--out", str(out)]) == 0
    assert "of rows / columns / prefilter)" in json.loads((out / "results.json").read_text())["meta"]["verify_head_auto"]

    # but never with other settings or another drafter: their records would mix with these
    args = ["bench", "--target", "tiny", "--drafter", str(drafter), "--limit", "2", "--methods", "plain,dynaspec",
            "--out", str(out)]
    assert main([*args, "--max-new-tokens", "8", "--prompt-format", "qa"]) == 1
    assert "prompt_format: 'chat' -> 'qa'" in capsys.readouterr().err
    other = tmp_path / "other-drafter"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--seed", "1", "--out", str(other)]) == 0
    assert main([*args[:4], str(other), *args[5:], "--max-new-tokens", "8"]) == 1
    assert "drafter_weights_sha256" in capsys.readouterr().err
    assert main([*args, "--max-new-tokens", "8", "--prompt-format", "qa", "--restart"]) == 0
    assert json.loads((out / "run.json").read_text())["prompt_format"] == "qa"


def test_method_variants_parse():
    from hf_dynaspec.bench import method_settings, parse_methods

    methods = parse_methods("plain,dynaspec[num_draft_nodes=8,tree_policy=dyspec],full")
    assert methods == ["plain", "dynaspec[num_draft_nodes=8,tree_policy=dyspec]", "full"]
    assert method_settings(methods[1]) == {"head_mode": "dynamic", "num_draft_nodes": 8, "tree_policy": "dyspec"}
    assert method_settings("dynaspec[step_policy=off]")["step_policy"] == "off"
    assert method_settings("dynaspec[count_host_reads=true]")["implementation"] == {"count_host_reads": True}


def test_bench_prompts_per_category(tmp_path):
    import json

    from hf_dynaspec.bench_prompts import load_bench_prompts, round_robin

    path = tmp_path / "p.jsonl"
    rows = [{"category": c, "prompt": f"{c}{i}"} for c in ("zh", "ja") for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + json.dumps({"turns": ["t0", "t1"]}) + "\n")
    assert [r["prompt"] for r in load_bench_prompts(path, limit=2)] == ["zh0", "zh1", "ja0", "ja1", "t0"]
    # a run stopped part-way has met every category: one prompt of each in turn, each category's order kept
    assert [r["prompt"] for r in round_robin(load_bench_prompts(path))] == [
        "zh0", "ja0", "t0", "zh1", "ja1", "zh2", "ja2"]
    assert round_robin([]) == []
    assert load_bench_prompts(path)[-1] == {"question_id": "6", "category": "all", "prompt": "t0"}
    path.write_text(json.dumps({"category": "x"}) + "\n")
    with pytest.raises(ValueError, match="neither `turns` nor `prompt`"):
        load_bench_prompts(path)


def test_bench_reports_host_reads_of_the_methods_that_count_them(tmp_path):
    import json

    drafter = tmp_path / "drafter"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(drafter)]) == 0
    out = tmp_path / "bench"
    # whole trees every step: the two layouts' reads compared on the same drafted steps
    methods = ("plain,dynaspec,dynaspec[count_host_reads=true,step_policy=off],"
               "dynaspec[count_host_reads=true,shortlist_layout=lanes,step_policy=off]")
    assert main(["bench", "--target", "tiny", "--drafter", str(drafter), "--limit", "1", "--max-new-tokens", "8",
                 "--methods", methods, "--out", str(out)]) == 0
    overall = {s["method"]: s for s in json.loads((out / "results.json").read_text())["summaries"]
               if s["category"] == "overall"}
    assert "host_reads_per_step" not in overall["dynaspec"]["extra"]
    union = overall["dynaspec[count_host_reads=true,step_policy=off]"]["extra"]["host_reads_per_step"]
    lanes = overall["dynaspec[count_host_reads=true,shortlist_layout=lanes,step_policy=off]"]["extra"][
        "host_reads_per_step"]
    assert 0 < lanes < union
    text = (out / "results.md").read_text()
    assert "## Host reads" in text and "| dynaspec[count_host_reads=true,step_policy=off] |" in text


def test_step_policy_flag_parses(capsys):
    parser = build_parser()
    args = parser.parse_args(["generate", "--drafter", "d", "--prompt", "hi", "--step-policy", "off"])
    assert args.step_policy == "off"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--drafter", "d", "--prompt", "hi", "--step-policy", "sometimes"])
    assert "invalid choice" in capsys.readouterr().err


def test_bench_keeps_the_median_of_repeats(monkeypatch):
    from hf_dynaspec import bench

    times = iter([3.0, 1.0, 2.0, 5.0, 4.0, 9.0])
    seq = torch.ones(1, 6, dtype=torch.long)
    monkeypatch.setattr(bench, "encode_formatted", lambda tokenizer, prompt, prompt_format: seq[:, :2])
    monkeypatch.setattr(bench, "run_method", lambda *args: (seq, next(times), None))
    row = {"question_id": "q", "category": "c", "prompt": "p"}
    plain, lookup = bench.bench_prompt(None, None, None, row, ["plain", "prompt-lookup"], 4, repeats=3,
                                       machine="this machine")
    assert (plain.seconds, lookup.seconds) == (2.0, 5.0) and plain.new_tokens == 4 and lookup.matches_plain
    assert plain.machine == lookup.machine == "this machine"


def test_headline_table_compares_a_method_with_its_head_twins():
    from hf_dynaspec.bench import Record, headline_table, summarize
    from hf_dynaspec.generation.loop.stats import SpeculativeStats

    def rec(method, category, seconds, steps, accepted, lookup=0):
        stats = SpeculativeStats(steps=steps, accepted_tokens=accepted, shortlist_total=30, shortlist_positions=10,
                                 recall_hits=3, recall_checks=4, lookup_tokens=lookup)
        return Record(method, category, f"{category}-1", seconds, 20, stats=stats.to_dict() if steps else None)

    records = []
    for category in ("coding", "writing"):
        records += [rec("plain", category, 2.0, 0, 0), rec("dynaspec", category, 1.0, 10, 20, lookup=5),
                    rec("full", category, 1.6, 10, 21), rec("static", category, 1.25, 10, 19)]
    table = headline_table(summarize(records), "dynaspec")
    lines = table.splitlines()
    assert len(lines) == 2 + 3  # header, rule, two categories, overall last
    assert lines[-1].startswith("| **overall** | 10.0 | 2.00x (2.00-2.00) | 1.60x (1.60-1.60) | 1.25x (1.25-1.25) | "
                                "2.00 / 2.10 / 1.90 | 95.2% | 3 (75.0%) | 25% | 0 |")
    assert headline_table(summarize([r for r in records if r.method != "static"]), "dynaspec") == ""


def test_every_flag_is_explained_and_version_is_printed(capsys):
    from hf_dynaspec import __version__
    from hf_dynaspec.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, command in commands.items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert missing == []
    assert "examples:" in parser.format_help() and "quality" in commands
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"hf-dynaspec {__version__}"


def test_target_flags_set_device_and_dtype():
    from hf_dynaspec.cli import build_parser, target_from_args

    args = build_parser().parse_args(["init", "--target", "tiny", "--dtype", "bfloat16", "--device", "cpu",
                                      "--out", "unused"])
    target, _ = target_from_args(args)
    assert target.dtype == torch.bfloat16 and target.device.type == "cpu"


def test_rewritten_results_count_the_prompts_their_records_hold(tmp_path):
    import json
    from dataclasses import asdict

    from hf_dynaspec.bench import Record, rewrite_results

    records = [Record(method, "coding", qid, 1.0, 8) for qid in ("q1", "q2") for method in ("plain", "prompt-lookup")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in records))
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"prompts": 1, "max_new_tokens": 8}}))
    rewrite_results(tmp_path)  # e.g. a run resumed with a larger --limit, summarised before it ended
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert meta == {"prompts": 2, "max_new_tokens": 8, "machines": {"not recorded": 2}}
    assert "- prompts: 2" in (tmp_path / "results.md").read_text()


def test_results_name_each_machine_a_resumed_run_spans(tmp_path):
    from hf_dynaspec.bench import Record, machine_counts, write_results

    records = [Record(method, "coding", qid, 1.0, 8, machine=machine)
               for qid, machine in (("q1", "AMD EPYC"), ("q2", "Intel Xeon"), ("q3", "Intel Xeon"))
               for method in ("plain", "prompt-lookup")]
    assert machine_counts(records) == {"Intel Xeon": 2, "AMD EPYC": 1}  # most prompts first
    write_results(records, tmp_path, {"prompts": 3})
    assert "- machines: Intel Xeon (2 prompts); AMD EPYC (1 prompts)" in (tmp_path / "results.md").read_text()


def test_a_prompt_run_again_with_added_methods_counts_once(tmp_path):
    import json
    from dataclasses import asdict

    from hf_dynaspec.bench import Record, load_records, rewrite_results

    first = [Record(method, "coding", "q1", 1.0, 8) for method in ("plain", "prompt-lookup")]
    again = [Record(method, "coding", "q1", 2.0, 8) for method in ("plain", "prompt-lookup", "early-exit")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in first + again))
    records, done = load_records(tmp_path / "records.jsonl", ["plain", "prompt-lookup", "early-exit"])
    assert done == {"q1"} and sorted(r.method for r in records) == ["early-exit", "plain", "prompt-lookup"]
    assert all(r.seconds == 2.0 for r in records)  # the later run's records replace the earlier ones
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"max_new_tokens": 8}}))
    summaries = rewrite_results(tmp_path)
    assert {s.prompts for s in summaries} == {1}


def test_doc_blocks_are_replaced_appended_or_start_a_new_file(tmp_path):
    from hf_dynaspec.bench import write_doc_block

    doc = tmp_path / "new.md"
    write_doc_block(doc, "figures", "one")
    assert doc.read_text() == "\n<!-- figures:begin -->\none\n<!-- figures:end -->\n"
    write_doc_block(doc, "figures", "two")
    write_doc_block(doc, "other", "three")
    text = doc.read_text()
    assert "one" not in text and text.count("<!-- figures:begin -->\ntwo\n") == 1 and "three" in text


def test_head_target_top_without_head_vocab_is_refused(tmp_path, capsys):
    assert main(["train", "--target", "tiny", "--drafter", str(tmp_path), "--data", str(tmp_path), "--ckpt-dir",
                 str(tmp_path / "ck"), "--steps", "1", "--head-target-top", "4"]) == 1
    assert "pass --head-vocab N too" in capsys.readouterr().err


def test_calibrate_measures_in_full_and_stores(tmp_path, monkeypatch, capsys):
    """`calibrate` times the walk head's layouts and c(n) in full (fresh) and stores them; the caller's
    HF_DYNASPEC_MEASURE is restored afterwards."""
    from hf_dynaspec.generation.planning import calibration, measured

    monkeypatch.setenv("HF_DYNASPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(measured.ENV, "disk")
    monkeypatch.setattr(calibration, "_MEASURED", type(calibration._MEASURED)())
    monkeypatch.setattr(calibration, "_WALK_HEADS", type(calibration._WALK_HEADS)())
    drafter = tmp_path / "drafter"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(drafter)]) == 0
    assert main(["calibrate", "--target", "tiny", "--drafter", str(drafter)]) == 0
    notes = [json.loads(p.read_text())["note"] for p in (tmp_path / "cache" / "measurements").glob("*.json")]
    assert any(note.startswith("walk head timings") for note in notes)  # timed: a cold call would not
    assert any("verify costs" in note and note.endswith("full") for note in notes)
    assert not any("quick" in note for note in notes)
    assert os.environ[measured.ENV] == "disk"

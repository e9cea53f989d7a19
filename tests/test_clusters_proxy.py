"""recipes/gemma3/clusters.py on a tiny target: every setting (plain and equal-size clusters), recall per budget and
per data folder beside a static list of the same size, its tables and plot written."""

from __future__ import annotations

import json

import torch
from helpers import REPO, load_script

from hf_dynaspec.configuration import eagle3_layer_ids
from hf_dynaspec.targets import load_target
from hf_dynaspec.training.corpus import write_answers
from hf_dynaspec.training.features import write_features

clusters_script = load_script(REPO / "recipes/gemma3/clusters.py", "gemma3_clusters")


def test_proxy_reports_each_setting_and_each_folder(tmp_path, monkeypatch):
    torch.manual_seed(0)
    target, tokenizer = load_target("tiny")
    folders = []
    for name, words in (("en", "hello there friend"), ("de", "guten tag freund")):
        records = [{"prompt": f"{words} {i}", "source": name} for i in range(12)]
        write_answers(target, tokenizer, records, tmp_path / f"c-{name}", 10, 4, progress=False)
        write_features(target, tmp_path / f"c-{name}", tmp_path / name, eagle3_layer_ids(2), progress=False)
        folders += ["--data", str(tmp_path / name)]
    out, doc = tmp_path / "out", tmp_path / "doc.md"
    monkeypatch.setattr("sys.argv", ["clusters", *folders, "--out", str(out), "--clusters", "4", "8",
                                     "--budgets", "1", "2", "--epochs", "1", "--target", "tiny", "--threads", "1",
                                     "--balanced", "both", "--group-budget", "2", "--doc", str(doc)])
    clusters_script.main()
    results = json.loads((out / "results.json").read_text())
    assert [(s["num_clusters"], s["balanced"]) for s in results["settings"]] == [(4, False), (4, True), (8, False),
                                                                                 (8, True)]
    for setting in results["settings"]:
        if setting["balanced"]:
            assert setting["largest_cluster"] == -(-258 // setting["num_clusters"])  # equal sizes, 258 tokens
        for row in setting["budgets"]:
            assert set(row["recall_by_group"]) == set(row["static_recall_by_group"]) == {"en", "de"}
            assert 0.0 <= row["recall"] <= 1.0
    text = (out / "results.md").read_text()
    assert "| 8 | yes |" in text and "Recall per group at top-2" in text and "| en | de |" in text
    assert "<!-- clusters:begin -->" in doc.read_text() and (out / "recall_vs_size.png").is_file()

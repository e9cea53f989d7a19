"""recipes/gemma3/export.py without a model: the default shortlist mode is the one the report names, and the card's
results hold the report and every whole run, their titles set under the card's section."""

from __future__ import annotations

import json

import pytest
from helpers import REPO, load_script

export = load_script(REPO / "recipes/gemma3/export.py", "gemma3_export")


def test_default_mode_is_the_reports(tmp_path):
    (tmp_path / "conditions.json").write_text(json.dumps({"fastest_mode": "union"}))
    assert export.default_mode(tmp_path) == {"head_mode": "union"}
    (tmp_path / "conditions.json").write_text(json.dumps({"fastest_mode": "context[static_size=2048]"}))
    assert export.default_mode(tmp_path) == {"head_mode": "context", "static_size": 2048}
    (tmp_path / "conditions.json").write_text(json.dumps({"conditions": [], "fastest_mode": None}))
    with pytest.raises(SystemExit, match="names no fastest mode"):
        export.default_mode(tmp_path)


def test_card_sections_hold_the_report_and_every_run(tmp_path):
    (tmp_path / "conditions.md").write_text("| condition | goal |\n")
    runs = []
    for name in ("lang", "code"):
        run = tmp_path / name
        run.mkdir()
        (run / "results.md").write_text(f"# {name} title\n\n## per category\n\n```\n# kept\n```\n")
        runs.append(run)
    head = tmp_path / "head"
    head.mkdir()
    (head / "results.md").write_text("# head\n\ncosts\n")
    titles = dict(export.sections(tmp_path, runs, head))
    results = titles["Results"]
    assert results.startswith("| condition | goal |")
    assert "The whole run, `lang`:\n\n### per category" in results and "The whole run, `code`:" in results
    assert "lang title" not in results and "```\n# kept\n```" in results  # first title dropped, code untouched
    assert titles["Head cost at 262,144 tokens"] == "costs" and "Gemma Terms of Use" in titles["Gemma terms"]

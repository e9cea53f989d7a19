"""recipes/smollm2/curves.py: the learning-curve tables, overall and per data folder, from a trainer state."""

from __future__ import annotations

import json

from helpers import REPO, load_script

curves = load_script(REPO / "recipes/smollm2/curves.py", "curves")


def point(step: int, top1: float, groups: dict[str, float] | None = None) -> dict:
    out = {"step": step, "positions_seen": step * 100, "heldout_positions": 64, "top1_at_depth": [top1, top1 / 2, top1 / 3]}
    if groups:
        out["by_group"] = {g: {"top1_at_depth": [v, v / 2, v / 3], "heldout_positions": 32} for g, v in groups.items()}
    return out


def test_group_table_lists_every_folder_at_every_point(tmp_path):
    curve = [point(10, 0.2, {"en": 0.25, "zh": 0.1}), point(20, 0.3, {"en": 0.35, "zh": 0.2})]
    text = curves.group_markdown(curve)
    assert "| step | en | zh |" in text and "| 20 | 0.350 | 0.200 |" in text and "| 10 | 0.250 | 0.100 |" in text
    assert "zh 0.200 / 0.100 / 0.067 (32)" in text
    assert curves.group_markdown([point(10, 0.2)]) == ""  # one data folder: no per-folder table


def test_main_writes_the_group_plot(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    curve = [point(10, 0.2, {"en": 0.25, "code": 0.1}), point(20, 0.3, {"en": 0.35, "code": 0.2})]
    state = {"step": 20, "batch_size": 2, "seq_len": 16, "unroll": 3, "positions_seen": 2000, "curve": curve}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    monkeypatch.setattr("sys.argv", ["curves", "--ckpt", str(ckpt), "--out", str(tmp_path / "out"), "--doc",
                                     str(tmp_path / "doc.md")])
    curves.main()
    assert (tmp_path / "out" / "curve-groups.png").is_file()
    assert "| 20 | 0.350 | 0.200 |" in (tmp_path / "out" / "curve.md").read_text()

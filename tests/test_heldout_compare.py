"""recipes/gemma3/heldout_compare.py without a model: its --drafter NAME=PATH parsing refuses what it cannot name,
and its table reads every drafter's overall and per-group top-1 at depth 1 from the records."""

from __future__ import annotations

import pytest
from helpers import REPO, load_script

compare = load_script(REPO / "recipes/gemma3/heldout_compare.py", "gemma3_heldout_compare")


def test_named_paths_keeps_pairs_and_refuses_malformed_or_repeated_names():
    assert compare.named_paths(["old=drafters/x", "new=runs/ckpt=1"]) == {"old": "drafters/x", "new": "runs/ckpt=1"}
    for bad in (["drafters/x"], ["=drafters/x"], ["old="], ["a=x", "a=y"]):
        with pytest.raises(ValueError, match="NAME=PATH"):
            compare.named_paths(bad)


def test_markdown_has_a_row_per_drafter_and_a_column_per_group():
    point = {"top1_at_depth": [0.5, 0.3], "by_group": {"en": {"top1_at_depth": [0.44]}, "zh": {"top1_at_depth": [0.1]}}}
    other = {"top1_at_depth": [0.6], "by_group": {"en": {"top1_at_depth": [0.5]}, "zh": {"top1_at_depth": [0.7]}}}
    text = compare.markdown({"meta": {"machine": "test", "paths": {"old": "a", "new": "b"}},
                             "drafters": {"old": point, "new": other}})
    assert "| drafter | overall | en | zh |" in text
    assert "| old (a) | 0.500 | 0.440 | 0.100 |" in text and "| new (b) | 0.600 | 0.500 | 0.700 |" in text

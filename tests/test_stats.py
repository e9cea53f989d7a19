"""SpeculativeStats: sums that merge, records that round-trip, and the one timer.

    python -m pytest tests/test_stats.py -q
"""

from __future__ import annotations

import time
from unittest import mock

import pytest
import torch

from hf_dynaspec.generation.loop.stats import SECTIONS, SpeculativeStats


def some_stats(scale: int) -> SpeculativeStats:
    stats = SpeculativeStats()
    stats.add_step(accepted=3 * scale, tree_nodes=8 * scale, lookup_tokens=scale)
    stats.add_shortlist(torch.tensor([100 * scale, 50 * scale]))
    stats.add_recall(scale % 2 == 1)
    stats.seconds["verify"] = 0.5 * scale
    return stats


def test_merge_adds_every_sum_and_keeps_means_consistent():
    a, b = some_stats(1), some_stats(2)
    merged = a.merge(b)
    assert (merged.steps, merged.accepted_tokens, merged.tree_nodes, merged.lookup_tokens) == (2, 9, 24, 3)
    assert (merged.shortlist_total, merged.shortlist_positions) == (450, 4)
    assert (merged.recall_hits, merged.recall_checks) == (1, 2)
    assert merged.seconds == {"verify": 1.5}
    assert merged.mean_accepted_length == 4.5 and merged.mean_shortlist_size == 112.5
    assert (a.steps, a.seconds) == (1, {"verify": 0.5})  # inputs untouched
    assert SpeculativeStats.merged([a, b]).to_dict() == merged.to_dict()


def test_records_round_trip_and_unknown_fields_are_refused():
    stats = some_stats(3)
    assert SpeculativeStats.from_dict(stats.to_dict()).to_dict() == stats.to_dict()
    assert "synchronize" not in stats.to_dict()
    with pytest.raises(ValueError, match="unknown_field"):
        SpeculativeStats.from_dict({**stats.to_dict(), "unknown_field": 1})


def test_timer_accumulates_per_section_and_refuses_unknown_names():
    stats = SpeculativeStats()
    for _ in range(2):
        with stats.timer("draft"):
            time.sleep(0.01)
    assert 0.02 <= stats.time("draft") < 1.0 and stats.time("verify") == 0.0
    with pytest.raises(ValueError, match="draf"):
        with stats.timer("draf"):
            pass
    assert set(stats.summary()) >= {f"{name}_time_s" for name in SECTIONS}


def test_timer_synchronises_only_when_asked_and_only_on_cuda():
    with mock.patch.object(torch.cuda, "synchronize") as sync:
        with SpeculativeStats(synchronize=True).timer("verify", torch.device("cpu")):
            pass
        with SpeculativeStats(synchronize=False).timer("verify", torch.device("cuda")):
            pass
        assert sync.call_count == 0
        with SpeculativeStats(synchronize=True).timer("verify", torch.device("cuda")):
            pass
        assert sync.call_count == 2  # before and after the section

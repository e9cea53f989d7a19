"""Equal-size vocabulary clusters (hf_dynaspec/balanced_clusters.py): a partition with sizes V / M, rows kept near
their centroids, deterministic, and a drafter built on them whose "lanes" head wastes no lane."""

from __future__ import annotations

import torch
from helpers import greedy, prompt, speculative, tiny_target

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.balanced_clusters import balanced_assignment, balanced_vocabulary, capacities


def skewed_rows(rows: int = 3000, dim: int = 16, seed: int = 0) -> torch.Tensor:
    """Rows crowded around one direction, as LM-head rows are: plain k-means makes very uneven clusters."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=generator) * torch.rand(rows, 1, generator=generator) + 2.0


def test_clusters_partition_the_vocabulary_in_equal_sizes():
    clusters = balanced_vocabulary(skewed_rows(), 7)
    clusters.validate()
    assert clusters.sizes().tolist() == capacities(3000, 7).tolist() == [429] * 4 + [428] * 3
    assert sorted(clusters.permutation.tolist()) == list(range(3000))


def test_same_seed_same_clusters():
    a, b = balanced_vocabulary(skewed_rows(), 8, seed=3), balanced_vocabulary(skewed_rows(), 8, seed=3)
    assert torch.equal(a.permutation, b.permutation) and torch.equal(a.offsets, b.offsets)


def test_assignment_keeps_rows_in_their_nearest_cluster_when_it_has_room():
    x = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.2], [0.0, 1.0]]), dim=1)
    centroids = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    got = balanced_assignment(x, centroids, torch.tensor([2, 2]))
    assert got.tolist() == [0, 0, 1, 1]  # the two closest to centroid 0 stay, the third moves over
    assert balanced_assignment(x, centroids, torch.tensor([4, 0])).tolist() == [0, 0, 0, 0]


def test_a_balanced_drafter_has_lanes_without_waste_and_stays_exact():
    target = tiny_target(vocab_size=128)
    torch.manual_seed(0)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, balanced_clusters=True).eval()
    assert drafter.clusters.sizes().tolist() == [16] * 8
    assert drafter.bound_head.lane_width == 16
    ids = prompt()
    out = speculative(target, drafter, ids, max_new_tokens=16, shortlist_layout="lanes")
    assert torch.equal(out, greedy(target, ids, max_new_tokens=16))

"""Equal-size vocabulary clusters: spherical k-means whose clusters all hold V / M tokens (one more for the first
V mod M).

Plain k-means over an LM head gives very uneven clusters (the shipped Gemma drafter's 256 range from 58 to
15,677 tokens), so a shortlist of k clusters has no fixed size, and a fixed-shape layout (the "lanes" head:
k slots as wide as the largest cluster) wastes most of its lanes. Here each k-means iteration assigns rows
under a capacity: in rounds, every unplaced row proposes its most similar cluster that still has room, and each
cluster takes the proposals it has room for, most similar first. A row lands in its nearest cluster unless that
one filled up with rows closer to it.

    python -c "import torch; from hf_dynaspec.balanced_clusters import balanced_vocabulary as b; \
print(b(torch.randn(1000, 16), 8).sizes().tolist())"
"""

from __future__ import annotations

import torch
from torch import Tensor

from .clustering import (
    VocabClusters,
    _cluster_sums,
    _normalise_centroids,
    _normalise_rows,
    fit_spherical_kmeans,
)


def capacities(num_rows: int, num_clusters: int) -> Tensor:
    """(M,) cluster sizes that add up to V and differ by at most one."""
    sizes = torch.full((num_clusters,), num_rows // num_clusters, dtype=torch.int64)
    sizes[: num_rows % num_clusters] += 1
    return sizes


def balanced_assignment(x: Tensor, centroids: Tensor, capacity: Tensor, chunk_size: int = 16384) -> Tensor:
    """(V,) cluster of each unit row of x (V, d) under `capacity` (M,): rounds of proposals to the most similar
    cluster with room, each cluster keeping the most similar proposals it has room for."""
    sims = torch.cat([x[i : i + chunk_size] @ centroids.T for i in range(0, x.shape[0], chunk_size)])  # (V, M)
    assignment = torch.full((x.shape[0],), -1, dtype=torch.int64)
    room = capacity.clone()  # (M,)
    while bool((assignment < 0).any()):
        open_rows = (assignment < 0).nonzero().flatten()  # (R,)
        scores = sims[open_rows].masked_fill(room[None] <= 0, float("-inf"))  # (R, M)
        best, choice = scores.max(dim=1)  # (R,) each
        # within each cluster, proposals by decreasing similarity: sort by (cluster, -similarity)
        order = torch.argsort(choice * 4.0 - best, stable=True)  # cosine in [-1, 1]: clusters stay apart
        ranked_choice = choice[order]
        first = torch.searchsorted(ranked_choice, ranked_choice)  # (R,) start of each row's cluster group
        rank = torch.arange(order.numel()) - first  # (R,) place among the proposals to its cluster
        accepted = rank < room[ranked_choice]
        assignment[open_rows[order[accepted]]] = ranked_choice[accepted]
        room -= torch.bincount(ranked_choice[accepted], minlength=room.numel())
    return assignment


def balanced_vocabulary(
    lm_head_weight: Tensor, num_clusters: int, *, seed: int = 0, rounds: int = 5, **kmeans_kwargs
) -> VocabClusters:
    """Spherical k-means (`clustering.fit_spherical_kmeans`), then `rounds` Lloyd iterations whose assignment
    step is `balanced_assignment`: a `VocabClusters` layout with equal-size clusters."""
    fit = fit_spherical_kmeans(lm_head_weight, num_clusters, seed=seed, **kmeans_kwargs)
    x = _normalise_rows(lm_head_weight)  # (V, d)
    capacity = capacities(x.shape[0], num_clusters)
    centroids = fit.centroids
    for _ in range(max(1, rounds)):
        assignment = balanced_assignment(x, centroids, capacity)
        centroids = _normalise_centroids(_cluster_sums(x, assignment, num_clusters), centroids)
    return VocabClusters.from_assignments(assignment, num_clusters)

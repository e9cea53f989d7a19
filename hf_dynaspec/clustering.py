"""Vocabulary clustering for DynaSpec dynamic vocabulary shortlists.

The DynaSpec drafter does not compute logits over the whole vocabulary. Offline, the vocabulary is
split into ``M`` clusters by spherical k-means over the rows of the LM head (cosine similarity).
At run time a router picks a few clusters per position and the drafter computes logits only over
the union of their tokens. The LM-head rows are stored in a *cluster-contiguous* layout
(``weight[permutation]``), so a selected cluster is one contiguous slice of rows and a union of
clusters is a handful of slices (:meth:`VocabClusters.segments`) or one gather
(:meth:`VocabClusters.positions_of`).

This module provides:

* :func:`spherical_kmeans` / :func:`fit_spherical_kmeans`: deterministic (seeded), chunked,
  fp32 spherical k-means that never returns an empty cluster;
* :class:`VocabClusters`: the permutation / offsets layout, with helpers to map selected clusters
  to token ids and layout positions, validation, and safetensors-friendly (de)serialisation;
* :func:`cluster_vocabulary`: both in one call.

Quick CPU check (clusters a random matrix, prints timings and cluster-size statistics)::

    python -m hf_dynaspec.clustering --vocab 5000 --dim 64 --clusters 32
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .ops import merge_adjacent_ranges

__all__ = [
    "KMeansResult",
    "VocabClusters",
    "cluster_vocabulary",
    "fit_spherical_kmeans",
    "spherical_kmeans",
]

_EPS = 1e-12
# k-means++ seeding runs on a random pool of max(4096, 16 M) rows, not on all V rows: seeding is
# sequential (M passes over the pool), and Lloyd iterations over all rows follow anyway.
_MIN_SEED_POOL = 4096
_SEED_POOL_PER_CLUSTER = 16

PERMUTATION_KEY = "clusters.permutation"
OFFSETS_KEY = "clusters.offsets"

ClusterIds = int | Sequence[int] | Tensor


# --------------------------------------------------------------------------------------------
# Spherical k-means
# --------------------------------------------------------------------------------------------


@dataclass
class KMeansResult:
    """Output of :func:`fit_spherical_kmeans`."""

    assignments: Tensor  # (V,) int64, cluster id of every row; every cluster is non-empty
    centroids: Tensor  # (M, d) fp32, unit-norm mean direction of every cluster
    iterations: int  # Lloyd iterations run (assignment + update passes)
    converged: bool  # True when the changed fraction fell below `tol` before `max_iters`
    mean_cosine: float  # mean cosine between each row and its cluster centroid (last pass)
    init_seconds: float  # time spent normalising rows + k-means++ seeding
    iter_seconds: float  # time spent in the Lloyd iterations


def _check_inputs(weight: Tensor, num_clusters: int, max_iters: int, chunk_size: int) -> None:
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (V, d), got shape {tuple(weight.shape)}")
    vocab_size = weight.shape[0]
    if not 1 <= num_clusters <= vocab_size:
        raise ValueError(f"num_clusters must be in [1, V={vocab_size}], got {num_clusters}")
    if max_iters < 1:
        raise ValueError(f"max_iters must be >= 1, got {max_iters}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _normalise_rows(weight: Tensor) -> Tensor:
    """fp32 rows of unit L2 norm: x_i / max(||x_i||, eps). All-zero rows stay zero."""
    x = weight.detach().to(torch.float32, copy=True)  # (V, d), one fp32 copy whatever the dtype
    return x.div_(x.norm(dim=1, keepdim=True).clamp_min(_EPS))  # (V, d), in place


def _kmeans_pp_init(x: Tensor, num_clusters: int, generator: torch.Generator) -> Tensor:
    """Greedy spherical k-means++ seeding: returns (M,) distinct row indices of `x`.

    For unit vectors ||x - c||^2 = 2 (1 - cos(x, c)), so the k-means++ rule "sample the next seed
    with probability proportional to the squared distance to the nearest seed" becomes
    p(i) ~ 1 - max_j cos(x_i, c_j). As in scikit-learn's greedy variant, each step draws
    2 + ln(M) candidates and keeps the one that minimises the potential sum_i (1 - max_j cos).
    Seeds are drawn from a random pool of rows (seeding is sequential: M passes over the pool).
    """
    vocab_size = x.shape[0]
    pool_size = min(vocab_size, max(_MIN_SEED_POOL, _SEED_POOL_PER_CLUSTER * num_clusters))
    pool = torch.randperm(vocab_size, generator=generator)[:pool_size].to(x.device)  # (P,)
    xp = x[pool]  # (P, d)
    num_trials = 2 + int(math.log(num_clusters))
    chosen = torch.zeros(pool_size, dtype=torch.bool, device=x.device)  # (P,)
    seeds = [int(torch.randint(pool_size, (1,), generator=generator))]
    chosen[seeds[0]] = True
    best_cos = xp @ xp[seeds[0]]  # (P,) max cos of every pool row to the seeds so far
    for _ in range(num_clusters - 1):
        pick, best_cos = _greedy_next_seed(xp, best_cos, chosen, num_trials, generator)
        seeds.append(pick)
        chosen[pick] = True
    return pool[torch.tensor(seeds, device=x.device)]  # (M,)


def _greedy_next_seed(
    xp: Tensor, best_cos: Tensor, chosen: Tensor, num_trials: int, generator: torch.Generator
) -> tuple[int, Tensor]:
    """Best of `num_trials` candidates drawn with p ~ (1 - best_cos): (pool index, new best_cos)."""
    weights = (1.0 - best_cos).clamp_min(0.0).masked_fill(chosen, 0.0)  # (P,)
    if not bool(weights.sum() > 0):  # every remaining row duplicates a seed direction
        weights = (~chosen).to(torch.float32)
    num_trials = min(num_trials, int((weights > 0).sum()))
    candidates = torch.multinomial(weights.cpu(), num_trials, generator=generator)  # (L,)
    candidates = candidates.to(xp.device)
    trial_cos = torch.maximum(best_cos[:, None], xp @ xp[candidates].t())  # (P, L)
    potential = (1.0 - trial_cos).clamp_min(0.0).sum(dim=0)  # (L,)
    best = int(potential.argmin())
    return int(candidates[best]), trial_cos[:, best].contiguous()


def _assign(x: Tensor, centroids: Tensor, chunk_size: int) -> tuple[Tensor, Tensor]:
    """Assignment step, chunked over rows: a_i = argmax_c <x_i, mu_c> (ties -> lowest c).

    Returns (assignments (V,) int64, best_cos (V,) fp32). Peak temporary memory is one
    (chunk_size, M) similarity block, never (V, M, d).
    """
    vocab_size = x.shape[0]
    assignments = torch.empty(vocab_size, dtype=torch.int64, device=x.device)  # (V,)
    best_cos = torch.empty(vocab_size, dtype=torch.float32, device=x.device)  # (V,)
    centroids_t = centroids.t().contiguous()  # (d, M)
    for start in range(0, vocab_size, chunk_size):
        end = min(start + chunk_size, vocab_size)
        sims = x[start:end] @ centroids_t  # (B, M) cosines: rows and centroids are unit-norm
        torch.max(sims, dim=1, out=(best_cos[start:end], assignments[start:end]))
    return assignments, best_cos


def _cluster_sums(x: Tensor, assignments: Tensor, num_clusters: int) -> Tensor:
    """s_c = sum_{i: a_i = c} x_i; (M, d) fp32."""
    sums = torch.zeros(num_clusters, x.shape[1], dtype=torch.float32, device=x.device)  # (M, d)
    return sums.index_add_(0, assignments, x)


def _repair_empty_clusters(assignments: Tensor, best_cos: Tensor, num_clusters: int) -> int:
    """Give every empty cluster one row, in place; returns the number of clusters repaired.

    Empty clusters are re-seeded with the rows farthest from their centroid (lowest cosine), taken
    only from clusters that keep at least one member, so the result has no empty cluster whenever
    M <= V (also with duplicate rows, where argmax ties send identical rows to one cluster).
    The centroid update then makes each re-seeded cluster's centroid that row.
    """
    counts = torch.bincount(assignments, minlength=num_clusters).tolist()
    empty = [c for c, n in enumerate(counts) if n == 0]
    if not empty:
        return 0
    candidates = iter(torch.argsort(best_cos, stable=True).tolist())  # farthest rows first
    for cluster in empty:
        row, donor = _next_donor(candidates, assignments, counts)
        counts[donor] -= 1
        counts[cluster] = 1
        assignments[row] = cluster
        best_cos[row] = 1.0  # cosine to its new centroid, the row itself
    return len(empty)


def _next_donor(candidates: Iterable[int], assignments: Tensor, counts: list[int]) -> tuple[int, int]:
    """First candidate row whose cluster has more than one member: (row, its cluster)."""
    for row in candidates:
        donor = int(assignments[row])
        if counts[donor] > 1:
            return row, donor
    raise RuntimeError("no donor row left for an empty cluster (needs num_clusters <= V)")


def _normalise_centroids(sums: Tensor, previous: Tensor) -> Tensor:
    """mu_c = s_c / ||s_c||; a cluster whose members cancel out (||s_c|| ~ 0) keeps mu_c."""
    norms = sums.norm(dim=1, keepdim=True)  # (M, 1)
    centroids = sums / norms.clamp_min(_EPS)  # (M, d)
    return torch.where(norms > _EPS, centroids, previous)  # (M, d)


def fit_spherical_kmeans(
    weight: Tensor,
    num_clusters: int,
    *,
    seed: int = 0,
    max_iters: int = 20,
    tol: float = 1e-4,
    chunk_size: int = 16384,
    show_progress: bool = False,
) -> KMeansResult:
    """Spherical k-means over the rows of `weight`; see :func:`spherical_kmeans`.

    Also returns the centroids (useful e.g. to initialise a router) and timing statistics.
    """
    _check_inputs(weight, num_clusters, max_iters, chunk_size)
    t0 = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    x = _normalise_rows(weight)  # (V, d) fp32 unit rows
    centroids = x[_kmeans_pp_init(x, num_clusters, generator)]  # (M, d)
    t1 = time.perf_counter()
    assignments, converged, mean_cos, iterations = None, False, 0.0, 0
    progress = tqdm(total=max_iters, desc="spherical k-means", disable=not show_progress)
    for _ in range(max_iters):
        iterations += 1
        new_assignments, best_cos = _assign(x, centroids, chunk_size)
        _repair_empty_clusters(new_assignments, best_cos, num_clusters)
        centroids = _normalise_centroids(_cluster_sums(x, new_assignments, num_clusters), centroids)
        changed = x.shape[0] if assignments is None else int((new_assignments != assignments).sum())
        assignments, mean_cos = new_assignments, float(best_cos.mean())
        progress.update(1)
        progress.set_postfix(changed=changed, mean_cos=f"{mean_cos:.4f}")
        if changed / x.shape[0] < tol:
            converged = True
            break
    progress.close()
    return KMeansResult(
        assignments=assignments,
        centroids=centroids,
        iterations=iterations,
        converged=converged,
        mean_cosine=mean_cos,
        init_seconds=t1 - t0,
        iter_seconds=time.perf_counter() - t1,
    )


def spherical_kmeans(
    weight: Tensor,
    num_clusters: int,
    *,
    seed: int = 0,
    max_iters: int = 20,
    tol: float = 1e-4,
    chunk_size: int = 16384,
    show_progress: bool = False,
) -> Tensor:
    """Cluster the rows of `weight` (V, d) by cosine similarity; returns (V,) int64 assignments.

    Rows are L2-normalised and processed in fp32 whatever the input dtype. Seeds are chosen by
    spherical k-means++ with a ``torch.Generator`` seeded by `seed`, so the same input and seed
    give identical output (on CPU; CUDA ``index_add_`` uses atomics and may differ in the last
    bits). Each Lloyd iteration assigns rows to the centroid of maximal cosine
    (in chunks of `chunk_size` rows: no (V, M, d) temporary, only (chunk_size, M)), re-seeds any
    empty cluster with the rows farthest from their centroid, and sets every centroid to the
    normalised sum of its members. Iteration stops when the fraction of rows that changed
    cluster is below `tol`, or after `max_iters` iterations.

    Every cluster id in ``range(num_clusters)`` is used at least once. Raises ``ValueError`` if
    `weight` is not 2-D or `num_clusters` is not in ``[1, V]``.
    """
    return fit_spherical_kmeans(
        weight,
        num_clusters,
        seed=seed,
        max_iters=max_iters,
        tol=tol,
        chunk_size=chunk_size,
        show_progress=show_progress,
    ).assignments


# --------------------------------------------------------------------------------------------
# Cluster-contiguous vocabulary layout
# --------------------------------------------------------------------------------------------


@dataclass
class VocabClusters:
    """A partition of the vocabulary into clusters, in a cluster-contiguous layout.

    ``permutation[offsets[c]:offsets[c + 1]]`` are the token ids of cluster ``c`` (ascending), so
    ``weight[permutation]`` stores every cluster's LM-head rows as one contiguous slice.
    "Positions" below are indices into that permuted layout; "tokens" are vocabulary ids.
    """

    permutation: Tensor  # (V,) int64 token ids sorted by (cluster, token id)
    offsets: Tensor  # (M + 1,) int64 cluster start positions, offsets[0] = 0, offsets[M] = V
    cluster_of_token: Tensor  # (V,) int64 cluster id of every token

    @classmethod
    def from_assignments(cls, assignments: Tensor, num_clusters: int) -> VocabClusters:
        """Build the layout from (V,) cluster ids; raises ValueError if a cluster is empty."""
        assignments = torch.as_tensor(assignments).to(torch.int64).flatten()  # (V,)
        if assignments.numel() and not 0 <= int(assignments.min()) <= int(assignments.max()) < num_clusters:
            raise ValueError(f"assignments must lie in [0, {num_clusters}), got values outside")
        # A stable sort by cluster id keeps ascending token ids inside each cluster.
        permutation = torch.sort(assignments, stable=True).indices  # (V,)
        sizes = torch.bincount(assignments, minlength=num_clusters)  # (M,)
        clusters = cls(permutation, _offsets_from_sizes(sizes), assignments.clone())
        clusters.validate()
        return clusters

    @property
    def num_clusters(self) -> int:
        return self.offsets.numel() - 1

    @property
    def vocab_size(self) -> int:
        return self.permutation.numel()

    def sizes(self) -> Tensor:
        """(M,) int64 number of tokens in every cluster."""
        return self.offsets[1:] - self.offsets[:-1]

    def segments(self, cluster_ids: ClusterIds) -> tuple[list[int], list[int]]:
        """Layout slices ``[starts[k], ends[k])`` covering the given clusters.

        Clusters are deduplicated and sorted, and clusters adjacent in the layout are merged, so
        the slices are sorted, disjoint and non-touching.
        """
        ids = self._cluster_ids(cluster_ids).tolist()
        offsets = self.offsets.tolist()
        merged = merge_adjacent_ranges([offsets[c] for c in ids], [offsets[c + 1] for c in ids])
        return [start for start, _ in merged], [end for _, end in merged]

    def positions_of(self, cluster_ids: ClusterIds) -> Tensor:
        """(K,) int64 sorted layout positions of the given clusters' tokens.

        ``weight[permutation][positions_of(ids)] == weight[tokens(ids)]``: the index a gather
        kernel uses on the permuted LM head.
        """
        ids = self._cluster_ids(cluster_ids)  # (k,)
        starts, lengths = self.offsets[ids], self.sizes()[ids]  # (k,), (k,)
        # position j of the output belongs to cluster k(j); it is starts[k] + (j - first_j(k)).
        first_out = torch.cumsum(lengths, 0) - lengths  # (k,) first output index of each cluster
        shift = torch.repeat_interleave(starts - first_out, lengths)  # (K,)
        return torch.arange(shift.numel(), device=shift.device) + shift  # (K,)

    def tokens(self, cluster_ids: ClusterIds) -> Tensor:
        """(K,) int64 token ids of the union of the given clusters, in layout order."""
        return self.permutation[self.positions_of(cluster_ids)]  # (K,)

    def validate(self) -> None:
        """Raise ValueError unless this is a consistent partition with no empty cluster."""
        _validate_permutation(self.permutation)
        _validate_offsets(self.offsets, self.vocab_size)
        expected = _cluster_of_token(self.permutation, self.offsets)  # (V,)
        if self.cluster_of_token.shape != expected.shape or not torch.equal(
            self.cluster_of_token.to(expected.device, torch.int64), expected
        ):
            raise ValueError("cluster_of_token is inconsistent with permutation/offsets")

    def to_tensors(self) -> dict[str, Tensor]:
        """Tensors for ``safetensors.torch.save_file`` (cluster_of_token is derived on load)."""
        return {
            PERMUTATION_KEY: self.permutation.contiguous(),
            OFFSETS_KEY: self.offsets.contiguous(),
        }

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> VocabClusters:
        """Inverse of :meth:`to_tensors`; validates the result."""
        missing = [k for k in (PERMUTATION_KEY, OFFSETS_KEY) if k not in tensors]
        if missing:
            raise ValueError(f"missing vocabulary-cluster tensors: {missing}")
        permutation = tensors[PERMUTATION_KEY].to(torch.int64)  # (V,)
        offsets = tensors[OFFSETS_KEY].to(torch.int64)  # (M + 1,)
        _validate_permutation(permutation)
        _validate_offsets(offsets, permutation.numel())
        clusters = cls(permutation, offsets, _cluster_of_token(permutation, offsets))
        clusters.validate()
        return clusters

    def to(self, device: torch.device | str) -> VocabClusters:
        return VocabClusters(
            self.permutation.to(device), self.offsets.to(device), self.cluster_of_token.to(device)
        )

    def _cluster_ids(self, cluster_ids: ClusterIds) -> Tensor:
        """Sorted unique (k,) int64 cluster ids on the layout's device; range-checked."""
        ids = torch.as_tensor(cluster_ids, dtype=torch.int64, device=self.offsets.device).flatten()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_clusters):
            raise ValueError(f"cluster ids must lie in [0, {self.num_clusters})")
        return torch.unique(ids)  # sorted


def _offsets_from_sizes(sizes: Tensor) -> Tensor:
    """offsets = [0, s_0, s_0 + s_1, ..., V]; (M + 1,) int64."""
    return torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)]).to(torch.int64)


def _cluster_of_token(permutation: Tensor, offsets: Tensor) -> Tensor:
    """(V,) cluster id of every token: cluster_of_token[permutation[p]] = c for p in cluster c."""
    sizes = offsets[1:] - offsets[:-1]  # (M,)
    cluster_ids = torch.arange(sizes.numel(), device=offsets.device)  # (M,)
    result = torch.empty_like(permutation)  # (V,)
    result[permutation] = torch.repeat_interleave(cluster_ids, sizes)
    return result


def _validate_permutation(permutation: Tensor) -> None:
    if permutation.dim() != 1 or permutation.dtype.is_floating_point:
        raise ValueError(
            f"permutation must be a 1-D integer tensor, got {permutation.dtype} "
            f"of shape {tuple(permutation.shape)}"
        )
    vocab_size = permutation.numel()
    expected = torch.arange(vocab_size, device=permutation.device)  # (V,)
    if not torch.equal(torch.sort(permutation.to(torch.int64)).values, expected):
        raise ValueError(f"permutation is not a permutation of range({vocab_size})")


def _validate_offsets(offsets: Tensor, vocab_size: int) -> None:
    if offsets.dim() != 1 or offsets.numel() < 2:
        raise ValueError(f"offsets must be 1-D with M + 1 >= 2 entries, got shape {tuple(offsets.shape)}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != vocab_size:
        raise ValueError(
            f"offsets must start at 0 and end at V={vocab_size}, got {int(offsets[0])} ... {int(offsets[-1])}"
        )
    sizes = offsets[1:] - offsets[:-1]  # (M,)
    if bool((sizes < 0).any()):
        raise ValueError("offsets must be non-decreasing")
    empty = torch.nonzero(sizes == 0).flatten().tolist()
    if empty:
        raise ValueError(f"{len(empty)} empty cluster(s), e.g. {empty[:8]}")


def cluster_vocabulary(
    lm_head_weight: Tensor, num_clusters: int, *, seed: int = 0, **kwargs
) -> VocabClusters:
    """Spherical k-means over the LM-head rows, returned as a :class:`VocabClusters` layout.

    `kwargs` are forwarded to :func:`spherical_kmeans` (max_iters, tol, chunk_size, show_progress).
    """
    assignments = spherical_kmeans(lm_head_weight, num_clusters, seed=seed, **kwargs)
    return VocabClusters.from_assignments(assignments, num_clusters)


# --------------------------------------------------------------------------------------------
# Command line: cluster a random matrix
# --------------------------------------------------------------------------------------------


def _parse_args(argv: Iterable[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Spherical k-means on a random (V, d) matrix.")
    parser.add_argument("--vocab", type=int, default=5000, help="rows V")
    parser.add_argument("--dim", type=int, default=64, help="columns d")
    parser.add_argument("--clusters", type=int, default=32, help="clusters M")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    parser.add_argument("--progress", action="store_true", help="show a tqdm progress bar")
    return parser.parse_args(None if argv is None else list(argv))


def main(argv: Iterable[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    weight = torch.randn(args.vocab, args.dim, generator=torch.Generator().manual_seed(args.seed))
    t0 = time.perf_counter()
    result = fit_spherical_kmeans(
        weight, args.clusters, seed=args.seed, max_iters=args.max_iters, show_progress=args.progress
    )
    clusters = VocabClusters.from_assignments(result.assignments, args.clusters)
    total = time.perf_counter() - t0
    sizes = clusters.sizes().float()
    print(
        f"V={args.vocab} d={args.dim} M={args.clusters}: {total:.3f} s total "
        f"(init {result.init_seconds:.3f} s, {result.iterations} iterations, "
        f"{result.iter_seconds / result.iterations:.4f} s/iter, converged={result.converged})"
    )
    print(
        f"mean cosine to centroid {result.mean_cosine:.4f}; cluster sizes min {int(sizes.min())} "
        f"median {int(sizes.median())} mean {float(sizes.mean()):.1f} max {int(sizes.max())}"
    )


if __name__ == "__main__":
    main()

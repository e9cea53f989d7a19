"""Tests for hf_dynaspec.clustering: spherical k-means and the VocabClusters layout."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_dynaspec.clustering import (
    OFFSETS_KEY,
    PERMUTATION_KEY,
    VocabClusters,
    cluster_vocabulary,
    fit_spherical_kmeans,
    main,
    spherical_kmeans,
)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _assert_partition(assignments: torch.Tensor, num_clusters: int, vocab_size: int) -> None:
    """Every token in exactly one cluster, every cluster non-empty."""
    assert assignments.shape == (vocab_size,)
    assert assignments.dtype == torch.int64
    assert int(assignments.min()) >= 0 and int(assignments.max()) < num_clusters
    assert bool((torch.bincount(assignments, minlength=num_clusters) > 0).all())


def _planted(num_dirs: int = 8, per_dir: int = 60, dim: int = 32, noise: float = 0.15, seed: int = 0):
    """Rows = one of `num_dirs` orthonormal directions * random scale + Gaussian noise."""
    dirs = torch.linalg.qr(_randn(dim, num_dirs, seed=seed)).Q.T  # (K, d) orthonormal rows
    labels = torch.arange(num_dirs).repeat_interleave(per_dir)  # (V,)
    scale = 0.5 + torch.rand(labels.numel(), 1, generator=torch.Generator().manual_seed(seed + 1))
    rows = dirs[labels] * scale + noise * _randn(labels.numel(), dim, seed=seed + 2) / dim**0.5
    perm = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(seed + 3))
    return rows[perm], labels[perm]


# ------------------------------------------------------------------------------ spherical_kmeans


def test_deterministic_for_a_seed():
    weight = _randn(600, 24)
    first = spherical_kmeans(weight, 12, seed=7)
    assert torch.equal(first, spherical_kmeans(weight, 12, seed=7))
    others = [spherical_kmeans(weight, 12, seed=s) for s in (1, 2, 3)]
    assert any(not torch.equal(first, other) for other in others)
    for a in [first, *others]:
        _assert_partition(a, 12, 600)


@pytest.mark.parametrize("vocab_size,dim,num_clusters", [(500, 16, 10), (257, 8, 64), (100, 4, 99)])
def test_every_token_in_exactly_one_nonempty_cluster(vocab_size, dim, num_clusters):
    weight = _randn(vocab_size, dim, seed=vocab_size)
    assignments = spherical_kmeans(weight, num_clusters, chunk_size=128)
    _assert_partition(assignments, num_clusters, vocab_size)
    clusters = VocabClusters.from_assignments(assignments, num_clusters)
    assert torch.equal(torch.sort(clusters.permutation).values, torch.arange(vocab_size))
    assert int(clusters.sizes().sum()) == vocab_size


def test_no_empty_cluster_with_duplicate_rows():
    distinct = _randn(3, 16)
    weight = distinct[torch.arange(300) % 3]  # only 3 distinct directions, 300 rows
    weight[::50] = 0.0  # and a few all-zero rows (e.g. unused token slots)
    for num_clusters in (40, 299, 300):
        _assert_partition(spherical_kmeans(weight, num_clusters), num_clusters, 300)


def test_num_clusters_equal_to_vocab_size():
    weight = _randn(64, 8)
    assignments = spherical_kmeans(weight, 64)
    assert torch.equal(torch.sort(assignments).values, torch.arange(64))
    assert bool((VocabClusters.from_assignments(assignments, 64).sizes() == 1).all())


def test_single_cluster():
    result = fit_spherical_kmeans(_randn(50, 8), 1)
    assert torch.equal(result.assignments, torch.zeros(50, dtype=torch.int64))
    assert result.converged and result.centroids.shape == (1, 8)


@pytest.mark.parametrize("num_clusters", [0, -1, 51])
def test_invalid_num_clusters(num_clusters):
    with pytest.raises(ValueError, match="num_clusters"):
        spherical_kmeans(_randn(50, 8), num_clusters)


@pytest.mark.parametrize("shape", [(50,), (2, 5, 8)])
def test_non_2d_weight(shape):
    with pytest.raises(ValueError, match="2-D"):
        spherical_kmeans(torch.zeros(shape), 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_structure_is_recovered(seed):
    weight, labels = _planted(seed=seed)
    result = fit_spherical_kmeans(weight, 8, seed=seed)
    # Purity: every found cluster is a single planted direction and vice versa.
    pairs = torch.unique(torch.stack([result.assignments, labels]), dim=1)  # (2, #pairs)
    assert pairs.shape[1] == 8
    assert result.converged and result.mean_cosine > 0.95


def test_scale_and_dtype_invariance():
    weight, _ = _planted()
    expected = spherical_kmeans(weight, 8)
    row_scale = 2.0 ** torch.randint(-3, 4, (weight.shape[0], 1)).float()  # exact in fp32
    assert torch.equal(spherical_kmeans(weight * row_scale, 8), expected)
    low = weight.to(torch.bfloat16)
    assert torch.equal(spherical_kmeans(low, 8), spherical_kmeans(low.float(), 8))


def test_centroids_are_unit_means_of_members():
    weight = _randn(400, 12)
    result = fit_spherical_kmeans(weight, 6)
    unit = torch.nn.functional.normalize(weight, dim=1)
    for c in range(6):
        mean = torch.nn.functional.normalize(unit[result.assignments == c].sum(0), dim=0)
        torch.testing.assert_close(result.centroids[c], mean, atol=1e-5, rtol=0)


def test_show_progress_runs(capsys):
    spherical_kmeans(_randn(100, 8), 4, max_iters=3, show_progress=True)
    assert "spherical k-means" in capsys.readouterr().err


def test_command_line(capsys):
    main(["--vocab", "300", "--dim", "16", "--clusters", "8", "--max-iters", "5"])
    out = capsys.readouterr().out
    assert "V=300 d=16 M=8" in out and "cluster sizes min" in out


# --------------------------------------------------------------------------------- VocabClusters


@pytest.fixture
def small_clusters() -> VocabClusters:
    # cluster 0: tokens 1, 4 | cluster 1: 2, 6 | cluster 2: 0, 3 | cluster 3: 5
    return VocabClusters.from_assignments(torch.tensor([2, 0, 1, 2, 0, 3, 1]), 4)


def test_layout(small_clusters):
    assert small_clusters.permutation.tolist() == [1, 4, 2, 6, 0, 3, 5]
    assert small_clusters.offsets.tolist() == [0, 2, 4, 6, 7]
    assert small_clusters.sizes().tolist() == [2, 2, 2, 1]
    assert small_clusters.cluster_of_token.tolist() == [2, 0, 1, 2, 0, 3, 1]
    assert (small_clusters.num_clusters, small_clusters.vocab_size) == (4, 7)


def test_segments_tokens_positions(small_clusters):
    for ids in ([0, 1, 3], [3, 1, 0, 1], torch.tensor([3, 0, 1])):
        assert small_clusters.segments(ids) == ([0, 6], [4, 7])  # clusters 0 and 1 merged
        assert small_clusters.positions_of(ids).tolist() == [0, 1, 2, 3, 6]
        assert small_clusters.tokens(ids).tolist() == [1, 4, 2, 6, 5]
    assert small_clusters.segments(2) == ([4], [6])
    assert small_clusters.segments([0, 1, 2, 3]) == ([0], [7])
    assert small_clusters.tokens([]).numel() == 0
    with pytest.raises(ValueError, match="cluster ids"):
        small_clusters.tokens([4])


def test_gather_on_permuted_weight_matches_tokens():
    weight = _randn(1000, 16)
    clusters = cluster_vocabulary(weight, 20, seed=3)
    permuted = weight[clusters.permutation]  # cluster-contiguous layout
    for ids in ([0], [3, 7, 8, 19], list(range(0, 20, 3))):
        tokens = clusters.tokens(ids)
        positions = clusters.positions_of(ids)
        assert torch.equal(permuted[positions], weight[tokens])
        starts, ends = clusters.segments(ids)
        sliced = torch.cat([permuted[s:e] for s, e in zip(starts, ends, strict=True)])
        assert torch.equal(sliced, weight[tokens])
        assert set(tokens.tolist()) == {t for t in range(1000) if int(clusters.cluster_of_token[t]) in ids}


def test_to_tensors_round_trip(tmp_path):
    clusters = cluster_vocabulary(_randn(300, 8), 10)
    tensors = clusters.to_tensors()
    assert set(tensors) == {PERMUTATION_KEY, OFFSETS_KEY}
    save_file(tensors, tmp_path / "clusters.safetensors")
    loaded = VocabClusters.from_tensors(load_file(tmp_path / "clusters.safetensors"))
    for name in ("permutation", "offsets", "cluster_of_token"):
        assert torch.equal(getattr(loaded, name), getattr(clusters, name))
    with pytest.raises(ValueError, match="missing"):
        VocabClusters.from_tensors({PERMUTATION_KEY: tensors[PERMUTATION_KEY]})


def _broken(small_clusters: VocabClusters, **changes) -> VocabClusters:
    fields = {
        "permutation": small_clusters.permutation.clone(),
        "offsets": small_clusters.offsets.clone(),
        "cluster_of_token": small_clusters.cluster_of_token.clone(),
    }
    fields.update({k: torch.tensor(v) for k, v in changes.items()})
    return VocabClusters(**fields)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"permutation": [1, 4, 2, 6, 0, 3, 3]}, "not a permutation"),
        ({"permutation": [1, 4, 2, 6, 0, 3, 7]}, "not a permutation"),
        ({"offsets": [1, 2, 4, 6, 7]}, "start at 0"),
        ({"offsets": [0, 2, 4, 6, 6]}, "end at V"),
        ({"offsets": [0, 4, 2, 6, 7]}, "non-decreasing"),
        ({"offsets": [0, 2, 2, 6, 7]}, "empty cluster"),
        ({"cluster_of_token": [2, 0, 1, 2, 0, 3, 0]}, "cluster_of_token"),
    ],
)
def test_validate_errors(small_clusters, changes, message):
    small_clusters.validate()
    with pytest.raises(ValueError, match=message):
        _broken(small_clusters, **changes).validate()


def test_from_assignments_rejects_bad_input():
    with pytest.raises(ValueError, match="empty cluster"):
        VocabClusters.from_assignments(torch.tensor([0, 0, 2]), 3)
    with pytest.raises(ValueError, match="assignments must lie"):
        VocabClusters.from_assignments(torch.tensor([0, 1, 3]), 3)

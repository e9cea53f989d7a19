"""The union limit (`max_union_tokens`): a batch's draft step scores at most that many tokens, each position
keeping its best clusters first (`router.within_union_limit`, used by the vLLM plugin at batch > 1).

    python -m pytest tests/test_union_limit.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_drafter, tiny_target

from hf_dynaspec.router import select_clusters, within_union_limit


def reference_limit(top: list[list[int]], keep: list[list[bool]], sizes: list[int], max_tokens: int):
    """The rule in plain Python: rank by rank, position by position, a new cluster enters while the union fits;
    each position's best enters regardless; a chosen cluster stays wherever it entered."""
    union, total = set(), 0
    for rank in range(len(top[0])):
        for row in range(len(top)):
            cluster = top[row][rank]
            if not keep[row][rank] or cluster in union:
                continue
            if rank == 0 or total + sizes[cluster] <= max_tokens:
                union.add(cluster)
                total += sizes[cluster]
            else:
                total = max_tokens + 1  # past the limit nothing more enters (the running sum only grows)
    return [[keep[r][i] and top[r][i] in union for i in range(len(top[0]))] for r in range(len(top))]


def test_a_worked_example():
    sizes = torch.tensor([10, 10, 10, 10, 10, 10])
    top = torch.tensor([[0, 1, 2], [3, 0, 4], [0, 5, 1]])  # (T=3, K=3) best first
    keep = torch.ones_like(top, dtype=torch.bool)
    # rank 0 brings 0 and 3 (20 tokens); rank 1: 1 fits (30), 0 is already in, 5 would make 40 > 35
    assert within_union_limit(top, keep, sizes, 35).tolist() == [[True, True, False], [True, True, False],
                                                                 [True, False, True]]
    # each position's best cluster stays even when they alone pass the limit
    assert within_union_limit(top, keep, sizes, 5).tolist() == [[True, False, False], [True, True, False],
                                                                [True, False, False]]


@pytest.mark.parametrize("rows,ranks,clusters", [(1, 1, 1), (3, 2, 7), (8, 5, 16), (5, 16, 16)])
def test_matches_the_rule_on_random_batches(rows, ranks, clusters):
    generator = torch.Generator().manual_seed(rows * 100 + ranks)
    for _ in range(20):
        sizes = torch.randint(1, 9, (clusters,), generator=generator)
        top = torch.stack([torch.randperm(clusters, generator=generator)[:ranks] for _ in range(rows)])
        keep = torch.rand(rows, ranks, generator=generator) < 0.8
        keep[:, 0] = True
        limit = int(torch.randint(1, int(sizes.sum()) + 2, (1,), generator=generator))
        expected = reference_limit(top.tolist(), keep.tolist(), sizes.tolist(), limit)
        assert within_union_limit(top, keep, sizes, limit).tolist() == expected


def test_select_clusters_limits_the_union_and_keeps_budgets():
    generator = torch.Generator().manual_seed(0)
    router_logits = torch.randn(8, 32, generator=generator)
    sizes = torch.full((32,), 4)
    free = select_clusters(router_logits, [4, 4, 3, 3, 2, 2, 1, 1])
    limited = select_clusters(router_logits, [4, 4, 3, 3, 2, 2, 1, 1], (sizes, 40))
    assert (limited & ~free).sum() == 0  # never a cluster the position did not choose
    assert limited.any(dim=0).sum() * 4 <= 40 < free.any(dim=0).sum() * 4
    best = router_logits.argmax(dim=-1)
    assert limited[torch.arange(8), best].all()
    assert torch.equal(select_clusters(router_logits, 4, (sizes, 10**6)), select_clusters(router_logits, 4))


@pytest.fixture(scope="module")
def drafter():
    return tiny_drafter(tiny_target(eos_token_id=2), num_clusters=8)


def test_head_scores_at_most_the_limit_and_each_row_a_subset_of_its_own_shortlist(drafter):
    head = drafter.bound_head
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(6, drafter.config.hidden_size, generator=generator)
    router_logits = torch.randn(6, 8, generator=generator)
    vocab = drafter.config.vocab_size
    free = head.logits(features, "dynamic", router_logits, 3).to_vocab(vocab)  # (T, V)
    largest = int(head.cluster_sizes.max())
    limited_out = head.logits(features, "dynamic", router_logits, 3, max_union_tokens=largest)
    limited = limited_out.to_vocab(vocab)
    extra = len(head.extra_id_list)  # the always-included ids are columns of their own
    assert limited_out.token_ids.numel() - extra < int(head.cluster_sizes.sum())  # fewer rows scored
    assert (torch.isfinite(limited) & ~torch.isfinite(free)).sum() == 0
    live = torch.isfinite(limited)
    torch.testing.assert_close(limited[live], free[live])  # the same logits where both score
    assert torch.isfinite(limited).sum(dim=-1).min() > 0


@pytest.mark.parametrize("mode,layout,limit,match", [
    ("static", "union", 16, "head_mode 'dynamic' or 'union'"),
    ("dynamic", "lanes", 16, "layout='union'"),
    ("dynamic", "union", 0, "positive token count"),
])
def test_a_limit_where_no_union_is_scored_is_refused(drafter, mode, layout, limit, match):
    head = drafter.bound_head
    features, router_logits = torch.randn(2, drafter.config.hidden_size), torch.randn(2, 8)
    with pytest.raises(ValueError, match=match):
        head.logits(features, mode, router_logits, 2, layout=layout, max_union_tokens=limit)

"""`ShortlistHead.use_cluster_gemm`: an engine's own matmul (the vLLM plugin's oneDNN one) scores the union's
clusters in place of `ops.segmented_lm_head`, with the same shortlists and logits.

    python -m pytest tests/test_cluster_gemm.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_drafter, tiny_target

from hf_dynaspec.router import select_clusters


@pytest.fixture
def drafter():
    return tiny_drafter(tiny_target(eos_token_id=2), num_clusters=8)


def per_cluster_gemm(head, calls):
    """A per-cluster matmul like the plugin's (one product per cluster), recording what it is asked for."""

    def gemm(features, clusters):
        calls.append(list(clusters))
        rows = [head.weight_by_cluster[head.offsets[c]:head.offsets[c + 1]] for c in clusters]
        return torch.cat([features @ w.T for w in rows], dim=1)

    return gemm


@pytest.mark.parametrize("k", [1, 3, [3, 1, 2, 2, 1]])
def test_the_engines_gemm_gives_the_same_shortlists_and_logits(drafter, k):
    head, vocab = drafter.bound_head, drafter.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(5, drafter.config.hidden_size, generator=generator)
    router_logits = torch.randn(5, 8, generator=generator)
    ours = head.logits(features, "dynamic", router_logits, k).to_vocab(vocab)
    calls = []
    head.use_cluster_gemm(per_cluster_gemm(head, calls))
    theirs = head.logits(features, "dynamic", router_logits, k).to_vocab(vocab)
    assert calls == [select_clusters(router_logits, k).any(dim=0).nonzero().flatten().tolist()]  # the union, once
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])


def test_a_gpu_head_refuses_it(drafter):
    head = drafter.bound_head
    head.weight_by_cluster, before = None, head.weight_by_cluster  # as on CUDA: the gathered kernel scores there
    try:
        with pytest.raises(ValueError, match="on a GPU"):
            head.use_cluster_gemm(lambda features, clusters: features)
    finally:
        head.weight_by_cluster = before

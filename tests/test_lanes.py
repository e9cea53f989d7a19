"""The "lanes" shortlist layout: each position's own clusters in fixed lanes. Same shortlists and logits as the
"union" layout, no host read, no graph break when compiled (greedy speculative output with it:
tests/test_device_growth.py).

    python -m pytest tests/test_lanes.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_drafter, tiny_target

from hf_dynaspec.generation.loop.syncs import HostSyncCounter
from hf_dynaspec.head import LogitTransform


@pytest.fixture(scope="module")
def drafter():
    return tiny_drafter(tiny_target(eos_token_id=2), num_clusters=8)


def features_and_router(drafter, rows: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, drafter.config.hidden_size, generator=generator)
    return features, torch.randn(rows, drafter.config.num_clusters, generator=generator)


def context_of(head, ids: list[int]):
    return head.context_columns(ids, "union")


@pytest.mark.parametrize("mode", ["dynamic", "union"])
@pytest.mark.parametrize("k", [1, 3, [3, 1, 2, 2, 1]])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_lanes_hold_the_same_shortlists_and_logits_as_the_union(drafter, mode, k, softcap):
    head = drafter.bound_head
    before, head.transform = head.transform, LogitTransform(softcap=softcap)
    try:
        features, router = features_and_router(drafter)
        context = context_of(head, [3, 50, 77, 121, 2]) if mode == "union" else None
        union = head.logits(features, mode, router, k, context, layout="union")
        lanes = head.logits(features, mode, router, k, context, layout="lanes")
    finally:
        head.transform = before
    vocab_union, vocab_lanes = union.to_vocab(128), lanes.to_vocab(128)
    assert torch.equal(torch.isfinite(vocab_union), torch.isfinite(vocab_lanes))
    live = torch.isfinite(vocab_union)
    torch.testing.assert_close(vocab_lanes[live], vocab_union[live], rtol=1e-5, atol=1e-5)
    assert torch.equal(lanes.shortlist_sizes, union.shortlist_sizes)  # each token in one live column
    assert lanes.token_ids.shape == lanes.logits.shape  # per-position ids


def test_lanes_read_nothing_on_the_host(drafter):
    features, router = features_and_router(drafter)
    with HostSyncCounter() as lanes:
        drafter.bound_head.logits(features, "dynamic", router, [3, 1, 2, 2, 1], layout="lanes")
    with HostSyncCounter() as union:
        drafter.bound_head.logits(features, "dynamic", router, [3, 1, 2, 2, 1], layout="union")
    assert lanes.total == 0, dict(lanes.counts)
    assert union.total >= 1  # the union's size is read: the counter sees it


def test_lanes_compile_whole(drafter):
    """`fullgraph=True` fails on any graph break; the eager backend checks that without generating code."""
    torch._dynamo.reset()
    head = drafter.bound_head

    def step(features, router):
        out = head.logits(features, "dynamic", router, [2, 2, 1, 1, 1], layout="lanes")
        return out.logits, out.token_ids

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    features, router = features_and_router(drafter)
    logits, ids = compiled(features, router)
    want_logits, want_ids = step(features, router)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logits, want_logits)


def test_a_tensor_budget_is_refused_in_lanes(drafter):
    features, router = features_and_router(drafter)
    with pytest.raises(ValueError, match="host list"):
        drafter.bound_head.logits(features, "dynamic", router, torch.tensor([1, 2, 1, 1, 1]), layout="lanes")
    with pytest.raises(ValueError, match="layout"):
        drafter.bound_head.logits(features, "dynamic", router, 1, layout="rows")

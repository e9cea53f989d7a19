"""The DynaSpec router: a 2-layer MLP that scores vocabulary clusters for a draft position.

Its input is what the drafter's decoder layer reads (EAGLE-3: the 2d attention input [norm(embedding);
hidden_norm(feature)]; EAGLE-1: `x = fc([embed(token); hidden_state])`), which exists before that layer runs,
so on CUDA the router runs on a side stream overlapped with the layer.
The shortlist of a position is the union of its top-k clusters (k from the depth schedule).

    python -c "import torch; from hf_dynaspec.router import ClusterRouter; print(ClusterRouter(64, 32, 16)(torch.randn(3, 64)).shape)"
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


class ClusterRouter(nn.Module):
    """score = W2 · relu(W1 · x + b1) + b2, one logit per cluster."""

    def __init__(self, hidden_size: int, router_hidden_size: int, num_clusters: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_size, router_hidden_size)
        self.act = nn.ReLU()
        self.down = nn.Linear(router_hidden_size, num_clusters)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(features)))  # (..., M)


def select_clusters(
    router_logits: torch.Tensor, k: int | list[int] | torch.Tensor, union_limit: UnionLimit | None = None
) -> torch.Tensor:
    """Boolean selection of each position's top-k clusters.

    router_logits: (T, M); k: an int, or per-position budgets (T,) as a list (read on the host: no device
    synchronisation) or a tensor; union_limit: (cluster sizes (M,), most tokens) caps the union of all positions'
    clusters (`within_union_limit`) -> (T, M) bool with at most min(k_t, M) True in row t.
    """
    num_clusters = router_logits.shape[-1]
    per_row = isinstance(k, list) or torch.is_tensor(k)
    if isinstance(k, list):
        k_max = max(k)
        k = torch.tensor(k, device=router_logits.device)
    else:
        k_max = int(k.max()) if per_row else int(k)
    k_max = min(k_max, num_clusters)
    top = router_logits.topk(k_max, dim=-1).indices  # (T, k_max), best first
    keep = torch.ones_like(top, dtype=torch.bool)
    if per_row:
        keep = torch.arange(k_max, device=top.device)[None] < k.to(top.device)[:, None]  # (T, k_max)
    if union_limit is not None:
        keep = within_union_limit(top, keep, *union_limit)
    selected = torch.zeros_like(router_logits, dtype=torch.bool)
    return selected.scatter_(-1, top, keep)  # (T, M)


UnionLimit = tuple[torch.Tensor, int]  # (cluster sizes (M,), the most tokens the union of a call's clusters holds)


def check_max_union_tokens(max_union_tokens: int | None) -> None:
    """A union limit is a positive token count, or None for no limit."""
    if max_union_tokens is not None and max_union_tokens < 1:
        raise ValueError(f"max_union_tokens must be a positive token count (or None: no limit), got {max_union_tokens}.")


def within_union_limit(top: torch.Tensor, keep: torch.Tensor, cluster_sizes: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Which chosen clusters stay when the union of all T positions' clusters may hold at most `max_tokens` tokens
    (a batch of unrelated requests would otherwise score the sum of their shortlists; a static list costs the same
    at any batch size).

    top: (T, K) each position's clusters, best first; keep: (T, K) which of them are chosen -> (T, K) bool.
    Clusters enter rank by rank (every position's best, then every position's second best, ...; positions in
    order within a rank), each costing its size when it first enters: the union grows while it fits. Every
    position keeps its best cluster even past the limit, and any chosen cluster that entered, whoever brought it.
    """
    rows, ranks = top.shape
    num_clusters = cluster_sizes.numel()
    order = torch.where(keep, top, num_clusters).T.reshape(-1)  # (K*T,) rank-major; unchosen: a sentinel cluster
    index = torch.arange(order.numel(), device=top.device)
    first = torch.full((num_clusters + 1,), order.numel(), device=top.device)
    first = first.scatter_reduce(0, order, index, reduce="amin")  # (M + 1,) where each cluster first enters
    entering = (first[order] == index) & (order < num_clusters)  # (K*T,)
    sizes = torch.cat([cluster_sizes.to(top.device), cluster_sizes.new_zeros(1).to(top.device)])
    fits = torch.cumsum(torch.where(entering, sizes[order], 0), dim=0) <= max_tokens  # (K*T,)
    admitted = entering & (fits | (index < rows))  # the best cluster of each position always enters
    in_union = torch.zeros(num_clusters + 1, dtype=torch.bool, device=top.device)
    in_union[order[admitted]] = True
    return keep & in_union[top]  # (T, K)


Timer = Callable[[str], AbstractContextManager]  # e.g. SpeculativeStats.timer: name -> context manager


def run_router_beside(
    router: nn.Module, features: torch.Tensor, layer_fn, *layer_args, timer: Timer | None = None, **layer_kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `router(features)` and `layer_fn(*layer_args, **layer_kwargs)`; on CUDA the router runs on a side
    stream so its cost hides behind the decoder layer. Returns (router_logits, layer_output). `timer("router")`
    times the router where it runs on its own (CPU); on CUDA it overlaps the layer and is not timed."""
    if not features.is_cuda:
        with timer("router") if timer is not None else nullcontext():
            router_logits = router(features)
        return router_logits, layer_fn(*layer_args, **layer_kwargs)
    main = torch.cuda.current_stream(features.device)
    side = _side_stream(features.device)
    side.wait_stream(main)  # features are ready on the main stream
    with torch.cuda.stream(side):
        router_logits = router(features)
    layer_out = layer_fn(*layer_args, **layer_kwargs)
    main.wait_stream(side)  # the join: inside a graph capture, fork and join are recorded with the step
    if not torch.cuda.is_current_stream_capturing():  # a graph's memory lives as long as the graph
        router_logits.record_stream(main)
    return router_logits, layer_out


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[device]

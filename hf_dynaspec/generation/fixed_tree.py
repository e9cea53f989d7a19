"""EAGLE-2 tree growth in fixed-shape tensor ops: the host learns the tree once, when it is grown.

The host grower (`tree.py`) reads each expansion's proposals to decide the next (one host read per draft
depth: a GPU synchronisation each). Here the pool of drafted nodes lives on the drafter's device with a
capacity known in advance, 1 + k + (D - 1) k^2 nodes for top-k expansion over D depths:

    layer 1:  the root's k children, score = log q (their path log-probability)
    layer d:  the k best nodes of layer d - 1 (the frontier; a node below the floor stays in it with score
              -inf, so every expansion has k rows) each propose k children, score = parent's score + log q
    select:   the `num_draft_nodes` best scores overall (shallower first on ties), closed under ancestors

A node is live when its score is finite and at least log(min_draft_prob). Scores are float64 so sums match the
host grower's. The lookup branch (tokens known on the host) is grafted as one more root path in spare slots
(`graft_fixed`), sharing selected nodes where the path exists, as `tree.graft_chain` does. Every step is a
fixed-shape tensor operation: no host read until `read_tree` turns the selected nodes into a `DraftTree` in one
transfer. Same trees as `tree._grow_eagle2` + `tree.graft_chain` (tests/test_fixed_tree.py).

    python -m pytest tests/test_fixed_tree.py -q
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .tree import DraftTree, Proposals


@dataclass
class FixedPool:
    """Drafted nodes of one tree on the device, node 0 the root: tokens (P,), parents (P,) (-1 at the root),
    depths (P,), scores (P,) float64 (-inf: not live), slots (P,) the drafter-cache slot of an expanded node
    (-1: not expanded); `size` (host int) nodes filled."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    slots: torch.Tensor
    size: int = 1

    @classmethod
    def empty(cls, root_token: torch.Tensor, capacity: int) -> FixedPool:
        """A pool of `capacity` nodes holding the root (a 0-dim device tensor) alone."""
        tokens = torch.zeros(capacity, dtype=torch.long, device=root_token.device)
        tokens[0] = root_token
        scores = torch.full((capacity,), float("-inf"), dtype=torch.float64, device=root_token.device)
        scores[0] = 0.0
        return cls(tokens, torch.full_like(tokens, -1), torch.zeros_like(tokens), scores, torch.full_like(tokens, -1))

    def add_layer(self, parents: torch.Tensor, tokens: torch.Tensor, log_q: torch.Tensor, floor: float) -> torch.Tensor:
        """Append the children (F, k) of `parents` (F,): their node ids (F * k,)."""
        count = tokens.numel()
        ids = torch.arange(self.size, self.size + count, device=tokens.device)  # (F * k,)
        parent = parents[:, None].expand_as(tokens).flatten()  # (F * k,)
        score = self.scores[parent] + log_q.flatten().to(torch.float64)  # -inf stays -inf
        self.tokens[ids] = tokens.flatten()
        self.parents[ids] = parent
        self.depths[ids] = self.depths[parent] + 1
        self.scores[ids] = torch.where(score >= floor, score, float("-inf"))  # below the floor: not live
        self.size += count
        return ids


Expand = Callable[[FixedPool, torch.Tensor, int], Proposals]  # (pool, frontier (F,), depth) -> (F, k) each


def capacity(top_k: int, depth: int) -> int:
    """Nodes of a fully grown tree: the root, its k children, k^2 more per further depth."""
    return 1 + top_k + max(0, depth - 1) * top_k * top_k


def grow_eagle2_fixed(
    root_token: torch.Tensor, root_children: Proposals, expand: Expand, top_k: int, depth: int,
    num_nodes: int, min_draft_prob: float, spare: int = 0,
) -> tuple[FixedPool, torch.Tensor]:
    """(pool, selected (P,) bool): EAGLE-2 growth to `depth` with `top_k` children per expanded node, the best
    `num_nodes` kept (root included in the selection, closed under ancestors); `spare` slots left for a lookup
    graft (`graft_fixed`). No host read."""
    floor = math.log(min_draft_prob) if min_draft_prob > 0 else float("-inf")
    pool = FixedPool.empty(root_token, capacity(top_k, depth) + spare)
    layer = pool.add_layer(torch.zeros(1, dtype=torch.long, device=root_token.device), *root_children, floor)
    for d in range(1, depth):
        frontier = layer[pool.scores[layer].topk(min(top_k, layer.numel())).indices]  # (F,) best first
        layer = pool.add_layer(frontier, *expand(pool, frontier, d), floor)
    return pool, select_nodes(pool, num_nodes, depth)


def select_nodes(pool: FixedPool, num_nodes: int, depth: int) -> torch.Tensor:
    """(capacity,) bool: the root and the `num_nodes` best live nodes (ties: the shallower first), closed under
    ancestors (`depth` hops reach every ancestor)."""
    scores = pool.scores[1 : pool.size]  # (P - 1,)
    # a stable sort on depth, then on score: equal scores keep the shallower node first
    by_depth = torch.argsort(pool.depths[1 : pool.size], stable=True)
    order = by_depth[torch.argsort(-scores[by_depth], stable=True)]  # (P - 1,) best first
    keep = torch.zeros(pool.tokens.numel(), dtype=torch.bool, device=scores.device)  # (capacity,): spare slots too
    best = order[: min(num_nodes, order.numel())] + 1
    keep[best] = torch.isfinite(pool.scores[best])
    parent = pool.parents  # -1 at the root and in unused slots
    for _ in range(depth):  # parents of kept nodes are kept (a tie may rank a child before its parent)
        up = (keep & (parent >= 0)).to(torch.int32)
        keep |= torch.zeros_like(up).scatter_reduce(0, parent.clamp(min=0), up, reduce="amax").bool()
    keep[0] = True
    return keep


def graft_fixed(pool: FixedPool, selected: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    """Graft `chain` (L,) (tokens after the root, e.g. the lookup branch) as a root path: at each step the selected
    child of the current node with that token if there is one, else the next spare slot becomes a new selected
    node with its parent's score (q(path) unchanged, as `tree.graft_chain`). Updates `pool` and `selected` in
    place; returns grafted (P,) bool, the new nodes. Fixed shapes, no host read (L is the host's list length)."""
    grafted = torch.zeros_like(selected)
    node = torch.zeros((), dtype=torch.long, device=selected.device)  # the root
    for token in chain:
        match = selected & (pool.parents == node) & (pool.tokens == token)  # (P,) at most one: siblings differ
        found = match.any()
        new = pool.size
        pool.tokens[new], pool.parents[new], pool.depths[new] = token, node, pool.depths[node] + 1
        pool.scores[new] = pool.scores[node]
        selected[new] = grafted[new] = ~found
        node = torch.where(found, match.to(torch.long).argmax(), new)
        pool.size += 1
    return grafted


def read_tree(
    pool: FixedPool, selected: torch.Tensor, root_token: int, grafted: torch.Tensor | None = None
) -> tuple[DraftTree, list[int]]:
    """The selected nodes as a host `DraftTree` (renumbered, parents first; grafted nodes marked) and its node
    ids: one transfer."""
    grafted = torch.zeros_like(selected) if grafted is None else grafted
    columns = torch.stack([pool.tokens[: pool.size].to(torch.float64), pool.parents[: pool.size].to(torch.float64),
                           pool.scores[: pool.size], selected[: pool.size].to(torch.float64),
                           grafted[: pool.size].to(torch.float64)])
    tokens, parents, scores, keep, graft = columns.tolist()  # the one host read (ids exact in float64)
    tree = DraftTree(root_token=root_token)
    index = {0: 0}
    for node in (n for n in range(1, len(keep)) if keep[n]):  # nodes are appended in order: parents come first
        index[node] = tree.add(int(tokens[node]), index[int(parents[node])], scores[node])
        if graft[node]:
            tree.grafted.add(index[node])
    return tree, list(range(len(tree.tokens)))

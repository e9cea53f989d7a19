"""Dynamic draft trees: grow a token tree from the drafter's proposals under a node budget.

Two policies share one node pool (`DraftTree`) and one drafter primitive, `expand(nodes) -> (tokens, logp)`
(each node's top-k children with their draft log-probabilities):
- "eagle2": per depth, every frontier node proposes top-k children scored by the cumulative log-probability
  log q(path) = sum log q(token | prefix); only the k best of the new layer are expanded next. At the end all
  proposals are re-ranked globally and the best `num_draft_nodes` kept (EAGLE-2).
- "dyspec": a max-heap of candidate paths scored by q(path), an estimate of the chance the target accepts the
  whole path; the best candidates are moved into the tree and expanded, `draft_top_k` per drafter call, until
  the budget is spent (DySpec's greedy expansion, batched to one drafter call per round).
A chain is eagle2 with k = 1. A lookup chain (copied from earlier text, see `lookup.py`) can be grafted on
as one more root path (`graft_chain`). With `min_draft_prob` p > 0, drafts with q(path) < p never enter the pool (so
are never verified or expanded): q only falls along a path, so no descendant of a dropped node could pass.
`VerifyTree` is the compact result: root (the last committed token) at 0,
parents before children, with the ancestor matrix that becomes the tree attention mask.

    python -m pytest tests/test_tree.py -q
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .config import DraftSettings

Expand = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]  # nodes -> (F, k) tokens, (F, k) logp


@dataclass
class DraftTree:
    """Pool of drafted nodes. Node 0 is the root (the last committed token, not a draft)."""

    root_token: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    grafted: set[int] = field(default_factory=set)  # nodes added by `graft_chain` (lookup drafts)

    def __post_init__(self) -> None:
        self.add(self.root_token, -1, 0.0)

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.scores.append(float(score))
        return len(self.tokens) - 1

    def add_children(
        self, nodes: list[int], tokens: torch.Tensor, logp: torch.Tensor, min_score: float = float("-inf")
    ) -> list[int]:
        """Add each node's proposals (F, k); skip impossible ones (-inf: outside the shortlist) and those whose
        path log-probability falls below `min_score` (the `min_draft_prob` floor)."""
        added = []
        for row, parent in enumerate(nodes):
            for token, lp in zip(tokens[row].tolist(), logp[row].tolist()):
                score = self.scores[parent] + lp
                if lp != float("-inf") and score >= min_score:
                    added.append(self.add(token, parent, score))
        return added

    def ancestors(self, node: int) -> list[int]:
        """Strict ancestors of `node`, root excluded, nearest first."""
        out = []
        node = self.parents[node]
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out


@dataclass
class VerifyTree:
    """Compact tree for verification. Index 0 is the root; parents precede children.

    tokens (n,), parents (n,) with parents[0] = -1, depths (n,), ancestor (n, n) bool with
    ancestor[i, j] = j is i or an ancestor of i; children[i]: child indices in decreasing draft score;
    log_q (n,): each node's path log-probability under the drafter (0 at the root); grafted (n,) bool: the
    node came from the lookup chain, not from the drafter.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ancestor: torch.Tensor
    children: list[list[int]]
    log_q: torch.Tensor
    grafted: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    def path_to(self, node: int) -> list[int]:
        """Root-to-node indices, root included."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]


def grow_tree(
    tree: DraftTree, expand: Expand, settings: DraftSettings, max_depth: int, lookup: Sequence[int] = ()
) -> VerifyTree:
    """Grow `tree` (whose root is node 0) with the configured policy, graft the `lookup` chain (tokens proposed
    after the root by `lookup.find_continuation`, cut to `max_depth`) and return the compact tree."""
    depth = min(settings.draft_depth, max_depth)
    if depth < 1:
        selected = [0]
    elif settings.tree_policy == "dyspec":
        selected = _grow_dyspec(tree, expand, settings, depth)
    else:
        selected = _grow_eagle2(tree, expand, settings, depth)
    return compact(tree, graft_chain(tree, selected, list(lookup)[: max(0, max_depth)]))


def graft_chain(tree: DraftTree, selected: list[int], tokens: list[int]) -> list[int]:
    """Add the root path `tokens` to the selected nodes, reusing a selected node wherever the path already
    exists (so siblings stay distinct). New nodes carry their parent's score: q(path) is unchanged, as for a
    draft proposed with certainty, so they rank first among their siblings and never fall below a floor
    their parent passed."""
    chosen = set(selected)
    out = list(selected)
    node = 0
    for token in tokens:
        match = [c for c in chosen if tree.parents[c] == node and tree.tokens[c] == token]
        if match:
            node = match[0]
            continue
        node = tree.add(token, node, tree.scores[node])
        tree.grafted.add(node)
        chosen.add(node)
        out.append(node)
    return out


def min_log_q(settings: DraftSettings) -> float:
    """log of the path-probability floor (-inf when off)."""
    return math.log(settings.min_draft_prob) if settings.min_draft_prob > 0 else float("-inf")


def _grow_eagle2(tree: DraftTree, expand: Expand, settings: DraftSettings, depth: int) -> list[int]:
    k, floor = settings.draft_top_k, min_log_q(settings)
    frontier = [0]
    for _ in range(depth):
        tokens, logp = expand(frontier)  # (F, k) each
        layer = tree.add_children(frontier, tokens, logp, floor)
        # keep the k best of the new layer (by cumulative log-probability) for the next expansion
        frontier = sorted(layer, key=lambda n: -tree.scores[n])[:k]
        if not frontier:
            break
    # global re-rank; ties go to the shallower node so that a parent always precedes its children
    ranked = sorted(range(1, len(tree.tokens)), key=lambda n: (-tree.scores[n], tree.depths[n]))
    return [0, *_close_under_ancestors(tree, ranked[: settings.num_draft_nodes])]


def _grow_dyspec(tree: DraftTree, expand: Expand, settings: DraftSettings, depth: int) -> list[int]:
    budget, width, floor = settings.num_draft_nodes, settings.draft_top_k, min_log_q(settings)
    selected = [0]
    heap: list[tuple[float, int]] = []  # (-log q(path), node): a max-heap on q(path)
    frontier = [0]
    while True:
        if frontier:
            tokens, logp = expand(frontier)
            for node in tree.add_children(frontier, tokens, logp, floor):
                heapq.heappush(heap, (-tree.scores[node], node))
        room = budget - (len(selected) - 1)
        if room <= 0 or not heap:
            return selected
        batch = [heapq.heappop(heap)[1] for _ in range(min(width, room, len(heap)))]
        selected.extend(batch)
        if len(selected) - 1 < budget:  # expanding is useless once the budget is spent
            frontier = [n for n in batch if tree.depths[n] < depth]
        else:
            frontier = []


def _close_under_ancestors(tree: DraftTree, nodes: list[int]) -> list[int]:
    """Defensive: a kept node's ancestors are kept too (true by construction unless log q == 0 ties)."""
    keep = set(nodes)
    for node in nodes:
        keep.update(tree.ancestors(node))
    return sorted(keep, key=lambda n: (tree.depths[n], -tree.scores[n]))


def compact(tree: DraftTree, selected: list[int]) -> VerifyTree:
    """Renumber `selected` (root first, parents before children) and build the ancestor matrix."""
    order = sorted(selected, key=lambda n: (tree.depths[n], -tree.scores[n]))
    index = {node: i for i, node in enumerate(order)}
    parents = [index[tree.parents[n]] if n else -1 for n in order]
    n = len(order)
    ancestor = torch.zeros(n, n, dtype=torch.bool)
    children: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(parents):
        ancestor[i, i] = True
        if p >= 0:
            ancestor[i] |= ancestor[p]
            children[p].append(i)  # order is by score within a depth, so children come best first
    return VerifyTree(
        tokens=torch.tensor([tree.tokens[m] for m in order], dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor([tree.depths[m] for m in order], dtype=torch.long),
        ancestor=ancestor,
        children=children,
        log_q=torch.tensor([tree.scores[m] for m in order], dtype=torch.float64),
        grafted=torch.tensor([m in tree.grafted for m in order], dtype=torch.bool),
    )

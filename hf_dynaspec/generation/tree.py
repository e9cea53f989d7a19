"""Dynamic draft trees: grow a token tree from the drafter's proposals under a node budget.

Two policies share one node pool (`DraftTree`) and one drafter primitive, `expand(nodes) -> (tokens, logp)`
(each node's top-k children with their draft log-probabilities); the root's children are given, as the drafter
proposed them when it last read the target (`DynaSpecCandidateGenerator.extend`):
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
parents before children, with the ancestor matrix that becomes the tree attention mask. Every tree operation
lives here: growing, grafting, the depth rule (`depth_limits`), closing a node set under ancestors, and one
renumbering routine behind both `compact` (pool -> tree) and `subtree` (tree -> smaller tree).

    python -m pytest tests/test_tree.py -q
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import torch

from ..generation_config import DraftSettings

Expand = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]  # nodes -> (F, k) tokens, (F, k) logp
Proposals = tuple[torch.Tensor, torch.Tensor]  # (F, k) tokens, (F, k) log q
Growth = Generator[list[int], Proposals, "VerifyTree"]  # yields frontiers, is sent their proposals, returns the tree
ExpandRows = Callable[[dict[int, list[int]]], dict[int, Proposals]]  # {row: nodes} -> {row: proposals}


@dataclass
class DraftTree:
    """Pool of drafted nodes. Node 0 is the root (the last committed token, not a draft)."""

    root_token: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    log_q: list[float] = field(default_factory=list)  # path log-probability under the drafter (0 at the root)
    grafted: set[int] = field(default_factory=set)  # nodes added by `graft_chain` (lookup drafts)

    def __post_init__(self) -> None:
        self.add(self.root_token, -1, 0.0)

    def add(self, token: int, parent: int, log_q: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.log_q.append(float(log_q))
        return len(self.tokens) - 1

    def add_children(
        self, nodes: list[int], tokens: torch.Tensor, logp: torch.Tensor, min_score: float = float("-inf")
    ) -> list[int]:
        """Add each node's proposals (F, k); skip impossible ones (-inf: outside the shortlist) and those whose
        path log-probability falls below `min_score` (the `min_draft_prob` floor). The proposals are read on
        the host in one transfer (token ids are exact in float64)."""
        token_rows, logp_rows = torch.stack([tokens.to(torch.float64), logp.to(torch.float64)]).tolist()
        added = []
        for parent, token_row, logp_row in zip(nodes, token_rows, logp_rows):
            for token, lp in zip(token_row, logp_row):
                log_q = self.log_q[parent] + lp
                if lp != float("-inf") and log_q >= min_score:
                    added.append(self.add(token, parent, log_q))
        return added

    def ancestors(self, node: int) -> list[int]:
        """Strict ancestors of `node`, root excluded, nearest first."""
        return strict_ancestors(self.parents, node)


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
    # the same columns on the host (drafting and the walk read these, never the tensors)
    token_list: list[int] = field(default_factory=list)
    parent_list: list[int] = field(default_factory=list)
    depth_list: list[int] = field(default_factory=list)
    log_q_list: list[float] = field(default_factory=list)
    grafted_list: list[bool] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return len(self.token_list)

    def path_to(self, node: int) -> list[int]:
        """Root-to-node indices, root included."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parent_list[node]
        return path[::-1]


def depth_limits(settings: DraftSettings, max_depth: int | None) -> tuple[int, int]:
    """The one depth rule: (deepest draft, longest lookup branch) when no path may hold more than `max_depth`
    drafts (the decoding loop passes tokens left to generate - 1, room for the bonus token; None: no limit)."""
    if max_depth is None:
        return settings.draft_depth, settings.lookup_num_tokens
    max_depth = max(0, max_depth)
    return min(settings.draft_depth, max_depth), min(settings.lookup_num_tokens, max_depth)


def grow_tree(
    tree: DraftTree,
    root_children: Proposals,
    expand: Expand,
    settings: DraftSettings,
    max_depth: int | None = None,
    lookup: Sequence[int] = (),
    depth_limit: int | None = None,
) -> VerifyTree:
    """Grow `tree` (whose root is node 0, with proposed children `root_children` (1, k) each) with the configured
    policy, graft the `lookup` chain (tokens proposed after the root by `lookup.find_continuation`) and return
    the compact tree; both within `depth_limits(settings, max_depth)`, and no drafter node deeper than
    `depth_limit` (None: no further limit; the step policy's choice)."""
    growth = growing(tree, root_children, settings, max_depth, lookup, depth_limit)
    return grow_together([growth], lambda frontiers: {row: expand(nodes) for row, nodes in frontiers.items()})[0]


def growing(
    tree: DraftTree,
    root_children: Proposals,
    settings: DraftSettings,
    max_depth: int | None = None,
    lookup: Sequence[int] = (),
    depth_limit: int | None = None,
) -> Growth:
    """`grow_tree` as a growth: it yields each frontier to expand (pool nodes), is sent their proposals (F, k)
    each, and returns the compact tree. Several growths advance together in `grow_together`."""
    depth, lookup_length = depth_limits(settings, max_depth)
    depth = depth if depth_limit is None else min(depth, depth_limit)
    if depth < 1:
        selected = [0]
    elif settings.tree_policy == "dyspec":
        selected = yield from _grow_dyspec(tree, root_children, settings, depth)
    else:
        selected = yield from _grow_eagle2(tree, root_children, settings, depth)
    return compact(tree, graft_chain(tree, selected, list(lookup)[:lookup_length]))


def grow_together(growths: Sequence[Growth], expand_rows: ExpandRows) -> list[VerifyTree]:
    """Advance several trees in lockstep: each round, the frontier of every tree still growing is expanded by
    one `expand_rows({row: nodes}) -> {row: proposals}` call (one drafter forward for all the rows)."""
    trees: list[VerifyTree | None] = [None] * len(growths)
    frontiers: dict[int, list[int]] = {}

    def advance(row: int, proposals: Proposals | None) -> None:
        try:
            frontiers[row] = next(growths[row]) if proposals is None else growths[row].send(proposals)
        except StopIteration as done:
            trees[row] = done.value

    for row in range(len(growths)):
        advance(row, None)
    while frontiers:
        asked, frontiers = frontiers, {}
        proposals = expand_rows(asked)
        for row in asked:
            advance(row, proposals[row])
    return trees


def graft_chain(tree: DraftTree, selected: list[int], tokens: list[int]) -> list[int]:
    """Add the root path `tokens` to the selected nodes, reusing a selected node wherever the path already
    exists (so siblings stay distinct). New nodes carry their parent's log q: q(path) is unchanged, as for a
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
        node = tree.add(token, node, tree.log_q[node])
        tree.grafted.add(node)
        chosen.add(node)
        out.append(node)
    return out


def min_log_q(settings: DraftSettings) -> float:
    """log of the path-probability floor (-inf when off)."""
    return math.log(settings.min_draft_prob) if settings.min_draft_prob > 0 else float("-inf")


def _grow_eagle2(
    tree: DraftTree, root_children: Proposals, settings: DraftSettings, depth: int
) -> Generator[list[int], Proposals, list[int]]:
    k, floor = settings.draft_top_k, min_log_q(settings)
    layer = tree.add_children([0], *root_children, floor)
    for _ in range(depth - 1):
        # keep the k best of the new layer (by cumulative log-probability) for the next expansion
        frontier = sorted(layer, key=lambda n: -tree.log_q[n])[:k]
        if not frontier:
            break
        layer = tree.add_children(frontier, *(yield frontier), floor)  # proposals: (F, k) each
    # global re-rank; ties go to the shallower node so that a parent always precedes its children
    ranked = sorted(range(1, len(tree.tokens)), key=lambda n: (-tree.log_q[n], tree.depths[n]))
    return [0, *close_under_ancestors(tree.parents, ranked[: settings.num_draft_nodes])]


def _grow_dyspec(
    tree: DraftTree, root_children: Proposals, settings: DraftSettings, depth: int
) -> Generator[list[int], Proposals, list[int]]:
    budget, width, floor = settings.num_draft_nodes, settings.draft_top_k, min_log_q(settings)
    selected = [0]
    heap: list[tuple[float, int]] = []  # (-log q(path), node): a max-heap on q(path)
    new = tree.add_children([0], *root_children, floor)
    while True:
        for node in new:
            heapq.heappush(heap, (-tree.log_q[node], node))
        room = budget - (len(selected) - 1)
        if room <= 0 or not heap:
            return selected
        batch = [heapq.heappop(heap)[1] for _ in range(min(width, room, len(heap)))]
        selected.extend(batch)
        # expanding is useless once the budget is spent
        frontier = [n for n in batch if tree.depths[n] < depth] if len(selected) - 1 < budget else []
        new = tree.add_children(frontier, *(yield frontier), floor) if frontier else []


def strict_ancestors(parents: Sequence[int], node: int) -> list[int]:
    """Ancestors of `node` in a parent list (root 0 has parent -1), root excluded, nearest first."""
    out = []
    node = parents[node]
    while node > 0:
        out.append(node)
        node = parents[node]
    return out


def close_under_ancestors(parents: Sequence[int], nodes: Sequence[int]) -> list[int]:
    """`nodes` and every ancestor of them, root excluded, ascending. Defensive where used: both rankings (by
    log q, by acceptance estimate) already keep a node's parent before it, except on exact ties."""
    keep = set(nodes)
    for node in nodes:
        keep.update(strict_ancestors(parents, node))
    keep.discard(0)
    return sorted(keep)


def compact(tree: DraftTree, selected: list[int]) -> VerifyTree:
    """The selected pool nodes (root included, closed under ancestors) as a `VerifyTree`: by depth, best log q
    first within a depth, so parents precede children and children come best first."""
    order = sorted(selected, key=lambda n: (tree.depths[n], -tree.log_q[n]))
    grafted = [n in tree.grafted for n in range(len(tree.tokens))]
    return _renumber(order, tree.tokens, tree.parents, tree.depths, tree.log_q, grafted)


def subtree(tree: VerifyTree, keep: Sequence[int]) -> VerifyTree:
    """The nodes `keep` of a verify tree (root included, closed under ancestors) in their order."""
    columns = (tree.token_list, tree.parent_list, tree.depth_list, tree.log_q_list, tree.grafted_list)
    return _renumber(sorted(keep), *columns)


def _renumber(
    order: list[int],
    tokens: Sequence[int],
    parents: Sequence[int],
    depths: Sequence[int],
    log_q: Sequence[float],
    grafted: Sequence[bool],
) -> VerifyTree:
    """The one renumbering routine: the nodes `order` (old indices, parents first) of a tree given as columns,
    as a `VerifyTree` numbered 0.. in that order, with its children lists and ancestor matrix."""
    index = {node: i for i, node in enumerate(order)}
    new_parents = [index[parents[m]] if parents[m] >= 0 else -1 for m in order]
    n = len(order)
    ancestor = torch.zeros(n, n, dtype=torch.bool)
    children: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(new_parents):
        ancestor[i, i] = True
        if p >= 0:
            ancestor[i] |= ancestor[p]
            children[p].append(i)  # in `order`: children keep their relative order
    host = dict(
        token_list=[int(tokens[m]) for m in order],
        parent_list=new_parents,
        depth_list=[int(depths[m]) for m in order],
        log_q_list=[float(log_q[m]) for m in order],
        grafted_list=[bool(grafted[m]) for m in order],
    )
    return VerifyTree(
        tokens=torch.tensor(host["token_list"], dtype=torch.long),
        parents=torch.tensor(new_parents, dtype=torch.long),
        depths=torch.tensor(host["depth_list"], dtype=torch.long),
        ancestor=ancestor,
        children=children,
        log_q=torch.tensor(host["log_q_list"], dtype=torch.float64),
        grafted=torch.tensor(host["grafted_list"], dtype=torch.bool),
        **host,
    )

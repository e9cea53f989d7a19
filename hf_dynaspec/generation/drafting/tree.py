"""Dynamic draft trees: grow a token tree from the drafter's proposals under a node budget.

One representation, on the host and on the device alike: `TreePool`, the drafted nodes of one tree as tensor
columns (tokens, parents, depths, path log-probabilities, drafter-cache slots: as EAGLE and vLLM keep trees), with
a capacity known before growing, on the drafter's device for growth there and on the CPU for growth on the host
(`new_pool`). Growth on the host also keeps the columns as host lists (`HostColumns`: each expansion's proposals
are read once), which the policies and the host expanders read to decide; growth on the device (EAGLE-2 and
chains, `tree_growth="device"`) reads nothing until the grown tree is compacted (one read). Both are driven through one drafter primitive, an expansion: a frontier of pool nodes
in, each node's top-k children with their draft log-probabilities (F, k) out. The root's children are given, as
the drafter proposed them when it last read the target (`DynaSpecCandidateGenerator.extend`). Policies:
- "eagle2": per depth, the k best nodes of the newest layer (by cumulative log-probability
  log q(path) = sum log q(token | prefix)) each propose top-k children; at the end the best `num_draft_nodes`
  of all proposals are kept, closed under ancestors (EAGLE-2). One growth for host and device: on the host the
  frontier is the layer's live nodes, best first (fewer than k when fewer live: a cheaper expansion); on the
  device it is the layer's top k by score, a dead node included (fixed shapes, no read).
- "dyspec": a max-heap of candidate paths scored by q(path), an estimate of the chance the target accepts the
  whole path; the best candidates are moved into the tree and expanded, `draft_top_k` per drafter call, until
  the budget is spent (DySpec's greedy expansion, batched to one drafter call per round). Host only.
A chain is eagle2 with k = 1. A node is live when its log q(path) is finite and at least log(min_draft_prob)
(a dead node is never selected or expanded: q only falls along a path, so no descendant of it could pass). A
lookup chain (copied from earlier text, see `lookup.py`) is grafted as one more root path (`graft`).
`VerifyTree` is the compact result: root (the last committed token) at 0, parents before children, with the
ancestor matrix that becomes the tree attention mask. Every tree operation lives here: growing, grafting, the
depth rule (`depth_limits`), selection, closing a node set under ancestors, and one renumbering routine behind
both `compact` (pool -> tree) and `subtree` (tree -> smaller tree).

    python -m pytest tests/test_tree.py tests/test_device_growth.py -q
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import torch

from ...generation_config import DraftSettings

Proposals = tuple[torch.Tensor, torch.Tensor]  # (F, k) tokens, (F, k) log q
Frontier = list[int] | torch.Tensor  # pool nodes to expand: a host list (host growth) or (F,) on the device
Expand = Callable[[list[int]], Proposals]  # host growth: nodes -> (F, k) tokens, (F, k) log q
Growth = Generator[Frontier, Proposals, "VerifyTree"]  # yields frontiers, is sent their proposals, returns the tree
ExpandRows = Callable[[dict[int, list[int]]], dict[int, Proposals]]  # {row: nodes} -> {row: proposals}


@dataclass
class HostColumns:
    """A pool's grown nodes on the host (growth on the host reads these, never the tensors): tokens, parents,
    depths and scores (log q(path), -inf: dead), indexed by pool node."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]

    def extend(self, parents: Sequence[int], tokens: torch.Tensor, log_q: torch.Tensor, floor: float) -> list[int]:
        """Append each parent's proposals (F, k), read in one transfer (token ids are exact in float64), as
        `TreePool.add_layer` appends them to the tensors: their live node ids."""
        token_rows, logq_rows = torch.stack([tokens.to(torch.float64), log_q.to(torch.float64)]).tolist()
        live = []
        for parent, token_row, logq_row in zip(parents, token_rows, logq_rows):
            for token, lp in zip(token_row, logq_row):
                score = self.scores[parent] + lp
                node = len(self.tokens)
                self.tokens.append(int(token))
                self.parents.append(parent)
                self.depths.append(self.depths[parent] + 1)
                self.scores.append(score if score >= floor else float("-inf"))
                if lp != float("-inf") and score >= floor:
                    live.append(node)
        return live


@dataclass
class TreePool:
    """Drafted nodes of one tree, node 0 the root (the last committed token, not a draft): tokens (P,), parents
    (P,) (-1 at the root and in unused slots), depths (P,), scores (P,) float64 (log q(path); -inf: dead or
    unused), slots (P,) the drafter-cache slot of an expanded node (the device expander's; -1: not expanded);
    `size` (a host int) nodes filled; `host`: the grown nodes' columns on the host (growth on the host), None for
    growth on the device. Capacity P is fixed when the pool is made (`pool_capacity`). With host columns, the
    grown nodes reach the tensors in one copy per column when a tensor operation needs them (`synced`)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    slots: torch.Tensor
    size: int = 1
    host: HostColumns | None = None
    written: int = 1  # host-column nodes already in the tensors

    @classmethod
    def empty(cls, root_token: int | torch.Tensor, capacity: int, on_host: bool = True) -> TreePool:
        """A pool of `capacity` nodes holding the root alone: `root_token` a host int (a pool on the CPU; with
        `on_host`, the host columns kept) or a 0-dim tensor on the device the pool lives on (growth on the device:
        never read)."""
        device = root_token.device if isinstance(root_token, torch.Tensor) else None
        tokens = torch.zeros(capacity, dtype=torch.long, device=device)
        tokens[0] = root_token
        scores = torch.full((capacity,), float("-inf"), dtype=torch.float64, device=device)
        scores[0] = 0.0
        host = HostColumns([int(root_token)], [-1], [0], [0.0]) if on_host else None
        return cls(tokens, torch.full_like(tokens, -1), torch.zeros_like(tokens), scores, torch.full_like(tokens, -1),
                   host=host)

    @property
    def capacity(self) -> int:
        return self.tokens.numel()

    def add_layer(self, parents: Frontier, tokens: torch.Tensor, log_q: torch.Tensor, floor: float) -> Frontier:
        """Append the children (F, k) of `parents` (F,), score = parent's score + log q, dead (-inf) below
        `floor`: their node ids, the live ones as a host list when the pool keeps host columns (the tensors are
        written later, `synced`), else all of them (F * k,) on the device (no read)."""
        count = tokens.numel()
        if self.size + count > self.capacity:
            raise ValueError(f"A tree pool of {self.capacity} nodes cannot take {count} more after {self.size}.")
        self.size += count
        if self.host is not None:
            return self.host.extend(parents, tokens, log_q, floor)
        ids = torch.arange(self.size - count, self.size, device=self.tokens.device)  # (F * k,)
        parent = parents[:, None].expand_as(tokens).flatten()  # (F * k,)
        score = self.scores[parent] + log_q.flatten().to(torch.float64)  # -inf stays -inf
        self.tokens[ids] = tokens.flatten()
        self.parents[ids] = parent
        self.depths[ids] = self.depths[parent] + 1
        self.scores[ids] = torch.where(score >= floor, score, float("-inf"))
        return ids

    def add(self, token: int, parent: int, log_q: float) -> int:
        """One live node with path log-probability `log_q` on a pool with host columns (trees built by hand:
        tests): its id."""
        if self.size >= self.capacity:
            raise ValueError(f"A tree pool of {self.capacity} nodes is full.")
        host = self.host
        host.tokens.append(int(token))
        host.parents.append(parent)
        host.depths.append(host.depths[parent] + 1)
        host.scores.append(float(log_q))
        self.size += 1
        return self.size - 1

    def synced(self) -> TreePool:
        """This pool with its tensors holding every grown node: host columns not written yet are copied, one
        copy per column (no read)."""
        host, start = self.host, self.written
        if host is not None and start < len(host.tokens):
            end, device = len(host.tokens), self.tokens.device
            self.tokens[start:end] = torch.tensor(host.tokens[start:end], device=device)
            self.parents[start:end] = torch.tensor(host.parents[start:end], device=device)
            self.depths[start:end] = torch.tensor(host.depths[start:end], device=device)
            self.scores[start:end] = torch.tensor(host.scores[start:end], dtype=torch.float64, device=device)
            self.written = end
        return self

    def ancestors(self, node: int) -> list[int]:
        """Strict ancestors of `node`, root excluded, nearest first (host columns)."""
        return strict_ancestors(self.host.parents, node)

    def mask(self, nodes: Sequence[int]) -> torch.Tensor:
        """(P,) bool: `nodes` selected."""
        keep = torch.zeros(self.capacity, dtype=torch.bool, device=self.tokens.device)
        keep[torch.tensor(list(nodes), dtype=torch.long, device=keep.device)] = True
        return keep


def growth_capacity(settings: DraftSettings) -> int:
    """Nodes a fully grown tree may add to its pool, the root included: eagle2, the root's k children and k^2 per
    further depth; dyspec, the root's k children and k per expanded node (at most `num_draft_nodes`)."""
    k, depth = settings.draft_top_k, settings.draft_depth
    if settings.tree_policy == "dyspec":
        return 1 + k + settings.num_draft_nodes * k
    return 1 + k + max(0, depth - 1) * k * k


def pool_capacity(settings: DraftSettings) -> int:
    """A pool's capacity: the growth's nodes and room to graft the longest lookup branch."""
    return growth_capacity(settings) + settings.lookup_num_tokens


def new_pool(root_token: int, settings: DraftSettings) -> TreePool:
    """An empty pool for one tree grown on the host with `settings`. Its tensors live on the CPU whatever the
    drafter's device: growth on the host decides from the host columns, and the tensors serve only the selection,
    the graft and `compact`, which then copy and read nothing across devices."""
    return TreePool.empty(root_token, pool_capacity(settings))


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
    pool: TreePool,
    root_children: Proposals,
    expand: Expand,
    settings: DraftSettings,
    max_depth: int | None = None,
    lookup: Sequence[int] = (),
    depth_limit: int | None = None,
) -> VerifyTree:
    """Grow the host `pool` (its root alone, with proposed children `root_children` (1, k) each) with the
    configured policy, graft the `lookup` chain (tokens proposed after the root by `lookup.find_continuation`) and
    return the compact tree; both within `depth_limits(settings, max_depth)`, and no drafter node deeper than
    `depth_limit` (None: no further limit; the step policy's choice)."""
    growth = growing(pool, root_children, settings, max_depth, lookup, depth_limit)
    return drive(growth, lambda frontier, depth: expand(frontier))


def growing(
    pool: TreePool,
    root_children: Proposals,
    settings: DraftSettings,
    max_depth: int | None = None,
    lookup: Sequence[int] = (),
    depth_limit: int | None = None,
) -> Growth:
    """`grow_tree` as a growth: it yields each frontier to expand (pool nodes: a host list, or a device tensor
    when `pool` keeps no host columns), is sent their proposals (F, k) each, and returns the compact tree (one
    read). Several growths advance together in `grow_together`; one is driven by `drive`."""
    depth, lookup_length = depth_limits(settings, max_depth)
    depth = depth if depth_limit is None else min(depth, depth_limit)
    if depth < 1:
        keep = root_only(pool)
    elif settings.tree_policy == "dyspec":
        if pool.host is None:
            raise ValueError("'dyspec' trees grow on the host: use tree_growth='host' or tree_policy='eagle2'.")
        keep = pool.mask((yield from _grow_dyspec(pool, root_children, settings, depth)))
    else:
        keep = yield from _grow_eagle2(pool, root_children, settings, depth)
    grafted = graft(pool, keep, list(lookup)[:lookup_length])
    return compact(pool, keep, grafted)


def drive(growth: Growth, expand: Callable[[Frontier, int], Proposals]) -> VerifyTree:
    """Run one growth to its tree: `expand(frontier, depth)` gives the proposals of each frontier (`depth`: the
    round, 1-based; an EAGLE-2 frontier's nodes all sit at that depth)."""
    proposals: Proposals | None = None
    depth = 0
    while True:
        try:
            frontier = next(growth) if proposals is None else growth.send(proposals)
        except StopIteration as done:
            return done.value
        depth += 1
        proposals = expand(frontier, depth)


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


def min_log_q(settings: DraftSettings) -> float:
    """log of the path-probability floor (-inf when off)."""
    return math.log(settings.min_draft_prob) if settings.min_draft_prob > 0 else float("-inf")


def root_only(pool: TreePool) -> torch.Tensor:
    """(P,) bool: the root alone."""
    keep = torch.zeros(pool.capacity, dtype=torch.bool, device=pool.tokens.device)
    keep[0] = True
    return keep


def best_of_layer(pool: TreePool, layer: Frontier, k: int) -> Frontier:
    """The next EAGLE-2 frontier: the k best nodes of `layer` by log q(path). Host: its live nodes, best first
    (ties: the older node); device: its top k (a dead node among them when fewer are live; its children die)."""
    if pool.host is not None:
        return sorted(layer, key=lambda n: -pool.host.scores[n])[:k]
    return layer[pool.scores[layer].topk(min(k, layer.numel())).indices]  # (F,) best first


def _grow_eagle2(
    pool: TreePool, root_children: Proposals, settings: DraftSettings, depth: int
) -> Generator[Frontier, Proposals, torch.Tensor]:
    k, floor = settings.draft_top_k, min_log_q(settings)
    root = [0] if pool.host is not None else torch.zeros(1, dtype=torch.long, device=pool.tokens.device)
    layer = pool.add_layer(root, *root_children, floor)
    for _ in range(depth - 1):
        frontier = best_of_layer(pool, layer, k)
        if pool.host is not None and not frontier:
            break
        layer = pool.add_layer(frontier, *(yield frontier), floor)  # proposals: (F, k) each
    return select_nodes(pool, settings.num_draft_nodes)


def select_nodes(pool: TreePool, num_nodes: int) -> torch.Tensor:
    """(P,) bool: the root and the `num_nodes` best live nodes by log q(path), ties to the shallower, then the older
    node. Closed under ancestors without a closure pass: a child's log q(path) is its parent's plus a log q <= 0,
    never above it (float addition of a non-positive number cannot round up), and a parent is shallower, so it
    ranks first. Tensor ops only."""
    pool.synced()
    scores = pool.scores[1 : pool.size]  # (P - 1,)
    # a stable sort on depth, then on score: equal scores keep the shallower node first
    by_depth = torch.argsort(pool.depths[1 : pool.size], stable=True)
    order = by_depth[torch.argsort(-scores[by_depth], stable=True)]  # (P - 1,) best first
    keep = torch.zeros(pool.capacity, dtype=torch.bool, device=scores.device)  # (P,): spare slots too
    best = order[: min(num_nodes, order.numel())] + 1
    keep[best] = torch.isfinite(pool.scores[best])
    keep[0] = True
    return keep


def _grow_dyspec(
    pool: TreePool, root_children: Proposals, settings: DraftSettings, depth: int
) -> Generator[list[int], Proposals, list[int]]:
    budget, width, floor = settings.num_draft_nodes, settings.draft_top_k, min_log_q(settings)
    host = pool.host
    selected = [0]
    heap: list[tuple[float, int]] = []  # (-log q(path), node): a max-heap on q(path)
    new = pool.add_layer([0], *root_children, floor)
    while True:
        for node in new:
            heapq.heappush(heap, (-host.scores[node], node))
        room = budget - (len(selected) - 1)
        if room <= 0 or not heap:
            return selected
        batch = [heapq.heappop(heap)[1] for _ in range(min(width, room, len(heap)))]
        selected.extend(batch)
        # expanding is useless once the budget is spent
        frontier = [n for n in batch if host.depths[n] < depth] if len(selected) - 1 < budget else []
        new = pool.add_layer(frontier, *(yield frontier), floor) if frontier else []


def graft(pool: TreePool, keep: torch.Tensor, chain: Sequence[int]) -> torch.Tensor:
    """Graft `chain` (tokens after the root, e.g. the lookup branch; a host list) as a root path: at each step the
    kept child of the current node with that token if there is one (siblings stay distinct), else the next free
    slot becomes a new kept node with its parent's score (q(path) unchanged, as for a draft proposed with
    certainty: it ranks first among its siblings and never falls below a floor its parent passed). Every chain
    token takes a slot (a matched one stays unkept). Updates `pool` and `keep` (P,) in place; returns grafted
    (P,) bool, the new nodes. Tensor ops, no read (the host columns stay those of the grown nodes)."""
    grafted = torch.zeros_like(keep)
    length, start = len(chain), pool.synced().size
    if length == 0:
        return grafted
    if start + length > pool.capacity:
        raise ValueError(f"A tree pool of {pool.capacity} nodes cannot graft {length} after {start}.")
    device = keep.device
    tokens = torch.tensor(list(chain), dtype=torch.long, device=device)  # (L,) copied, not read
    node = torch.zeros((), dtype=torch.long, device=device)  # the root
    parents, found = [], []
    for i in range(length):  # once a token is new, so are the rest: a new node has no kept child
        match = keep & (pool.parents == node) & (pool.tokens == tokens[i])  # (P,) at most one: siblings differ
        parents.append(node)
        found.append(match.any())
        node = torch.where(found[-1], match.to(torch.long).argmax(), start + i)
    slots = torch.arange(start, start + length, device=device)  # (L,)
    parent, new = torch.stack(parents), ~torch.stack(found)  # (L,) each
    real = (parent < start).sum()  # the chain's first new node has the last real parent; later ones copy its score
    scores = pool.scores[parent].gather(0, torch.minimum(torch.arange(length, device=device), real - 1))
    pool.tokens[slots], pool.parents[slots] = tokens, parent
    pool.depths[slots] = torch.arange(1, length + 1, device=device)  # a root path
    pool.scores[slots] = scores
    keep[slots] = new
    grafted[slots] = new
    pool.size += length
    return grafted


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


def compact(pool: TreePool, keep: torch.Tensor, grafted: torch.Tensor | None = None) -> VerifyTree:
    """The kept pool nodes `keep` (P,) bool (root included, closed under ancestors; `grafted` (P,) bool: lookup
    nodes) as a `VerifyTree`, read in one transfer: by depth, best log q first within a depth (ties: the older
    node), so parents precede children and children come best first."""
    size = pool.synced().size
    grafted = torch.zeros_like(keep) if grafted is None else grafted
    columns = torch.stack([pool.tokens[:size].to(torch.float64), pool.parents[:size].to(torch.float64),
                           pool.depths[:size].to(torch.float64), pool.scores[:size],
                           keep[:size].to(torch.float64), grafted[:size].to(torch.float64)])
    tokens, parents, depths, scores, kept, graft_flags = columns.tolist()  # the one read (ids exact in float64)
    order = sorted((n for n in range(size) if kept[n]), key=lambda n: (depths[n], -scores[n]))
    return _renumber(order, tokens, [int(p) for p in parents], depths, scores, [bool(g) for g in graft_flags])


def lookup_tree(root_token: int, lookup: Sequence[int]) -> VerifyTree:
    """The root and the lookup branch as one chain of grafted nodes, no drafter node (what `graft` makes of it on
    a root alone), built on the host directly: a step verifying the lookup branch alone, or the root alone."""
    length = len(lookup)
    return _renumber(list(range(length + 1)), [root_token, *lookup], list(range(-1, length)), list(range(length + 1)),
                     [0.0] * (length + 1), [False] + [True] * length)


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

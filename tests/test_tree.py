"""Draft trees (`hf_dynaspec.generation.drafting.tree`): growing with both policies from given root proposals, the
depth rule, grafting a lookup chain, closing under ancestors, and the one renumbering routine behind
`compact` and `subtree`; plus random trees checked for well-formedness.

    python -m pytest tests/test_tree.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import draft_settings, random_trees
from hypothesis import given, settings

from hf_dynaspec.generation.drafting.tree import (
    TreePool,
    VerifyTree,
    close_under_ancestors,
    compact,
    depth_limits,
    graft,
    grow_tree,
    lookup_tree,
    new_pool,
    subtree,
)
from hf_dynaspec.generation_config import DraftSettings

LOG = math.log


def small_tree() -> VerifyTree:
    """root -> a (q 0.6) -> c (q 0.4 given a); root -> b (q 0.3); lookup chain root -> b -> d.
    Verification order (by depth, then q(path)): [root, a, b, d, c]."""
    pool = TreePool.empty(0, 8)
    a = pool.add(10, 0, LOG(0.6))
    b = pool.add(11, 0, LOG(0.3))
    c = pool.add(12, a, pool.host.scores[a] + LOG(0.4))
    keep = pool.mask([0, a, b, c])
    return compact(pool, keep, graft(pool, keep, [11, 13]))  # shares b, grafts d under it


def test_compact_orders_by_depth_then_probability():
    tree = small_tree()
    assert tree.tokens.tolist() == [0, 10, 11, 13, 12]
    assert tree.parents.tolist() == [-1, 0, 0, 2, 1]
    assert tree.children == [[1, 2], [4], [3], [], []]  # best first
    assert tree.grafted.tolist() == [False, False, False, True, False]
    assert tree.log_q[3].item() == pytest.approx(LOG(0.3))  # a grafted node carries its parent's q(path)


def test_subtree_renumbers_parents_children_and_mask():
    sub = subtree(small_tree(), [0, 2, 3])  # root, b, d
    assert sub.tokens.tolist() == [0, 11, 13]
    assert sub.parents.tolist() == [-1, 0, 1]
    assert sub.children == [[1], [2], []]
    assert sub.ancestor.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert sub.grafted.tolist() == [False, False, True]


def test_close_under_ancestors_adds_missing_ancestors_only():
    parents = [-1, 0, 1, 2, 0]  # chain 1 -> 2 -> 3, and 4
    assert close_under_ancestors(parents, [3]) == [1, 2, 3]
    assert close_under_ancestors(parents, [4, 1]) == [1, 4]
    assert close_under_ancestors(parents, []) == []


@pytest.mark.parametrize(("max_depth", "expected"), [(None, (5, 8)), (10, (5, 8)), (3, (3, 3)), (0, (0, 0)), (-2, (0, 0))])
def test_one_depth_rule_for_drafts_and_lookup(max_depth, expected):
    settings_ = draft_settings("eagle2", 8, 5, 2)
    settings_ = DraftSettings(**{**settings_.__dict__, "lookup_num_tokens": 8})
    assert depth_limits(settings_, max_depth) == expected


def counting_expand(calls: list[list[int]]):
    """Each node proposes tokens 100 + node and 200 + node with q 0.6 and 0.3; records the nodes expanded."""

    def expand(nodes):
        calls.append(list(nodes))
        tokens = torch.tensor([[100 + n, 200 + n] for n in nodes])
        return tokens, torch.tensor([[LOG(0.6), LOG(0.3)]] * len(nodes))

    return expand


@pytest.mark.parametrize("policy", ["eagle2", "dyspec"])
def test_root_children_come_from_the_caller_and_the_root_is_never_expanded(policy):
    calls: list[list[int]] = []
    root_children = (torch.tensor([[7, 8]]), torch.tensor([[LOG(0.9), LOG(0.05)]]))
    settings_ = draft_settings(policy, 4, 3, 2)
    tree = grow_tree(new_pool(1, settings_), root_children, counting_expand(calls), settings_)
    assert all(0 not in nodes for nodes in calls)
    assert tree.tokens[tree.children[0]].tolist()[0] == 7  # the given best child first
    assert tree.num_nodes <= 5 and int(tree.depths.max()) <= 3


def test_depth_zero_keeps_the_root_alone():
    calls: list[list[int]] = []
    root_children = (torch.tensor([[7]]), torch.tensor([[0.0]]))
    settings_ = draft_settings("eagle2", 4, 3, 1)
    tree = grow_tree(new_pool(1, settings_), root_children, counting_expand(calls), settings_, max_depth=0, lookup=[5, 6])
    assert tree.tokens.tolist() == [1] and calls == []


def test_graft_reuses_a_drafted_path():
    pool = TreePool.empty(0, 4)
    a = pool.add(10, 0, LOG(0.5))
    keep = pool.mask([0, a])
    grafted = graft(pool, keep, [10, 11])
    # every chain token takes a slot (fixed shapes); 10 matched a, so its slot stays unkept
    assert keep.tolist() == [True, True, False, True] and grafted.tolist() == [False, False, False, True]
    assert int(pool.parents[3]) == a and float(pool.scores[3]) == LOG(0.5)  # q(path) of its parent


def test_lookup_tree_is_the_graft_of_a_chain_on_the_root_alone():
    pool = TreePool.empty(4, 4)
    keep = pool.mask([0])
    grafted = compact(pool, keep, graft(pool, keep, [7, 8, 7]))
    chain = lookup_tree(4, [7, 8, 7])
    for column in ("token_list", "parent_list", "depth_list", "log_q_list", "grafted_list"):
        assert getattr(chain, column) == getattr(grafted, column)
    assert torch.equal(chain.ancestor, grafted.ancestor)


def test_a_full_pool_refuses_more_nodes():
    pool = TreePool.empty(0, 3)
    pool.add_layer([0], torch.tensor([[5, 6]]), torch.tensor([[LOG(0.5), LOG(0.4)]]), float("-inf"))
    with pytest.raises(ValueError, match="cannot take"):
        pool.add_layer([1], torch.tensor([[7]]), torch.tensor([[0.0]]), float("-inf"))
    with pytest.raises(ValueError, match="cannot graft"):
        graft(pool, pool.mask([0]), [9])


@settings(max_examples=300, deadline=None)
@given(drawn=random_trees())
def test_grown_tree_is_well_formed(drawn: tuple[VerifyTree, DraftSettings, int]) -> None:
    """Parents precede children, depths follow parents, the ancestor matrix is exactly the parent closure,
    children lists match parents, and the budget and depth limits hold."""
    tree, settings_, max_depth = drawn
    n = tree.num_nodes
    assert int(tree.parents[0]) == -1 and int(tree.depths[0]) == 0
    drafted = tree.depths[~tree.grafted]
    assert n - int(tree.grafted.sum()) <= settings_.num_draft_nodes + 1
    assert int(drafted.max()) <= min(settings_.draft_depth, max_depth)
    assert int(tree.depths.max()) <= max_depth
    for i in range(1, n):
        parent = int(tree.parents[i])
        assert 0 <= parent < i
        assert int(tree.depths[i]) == int(tree.depths[parent]) + 1
    for i in range(n):
        expected = torch.zeros(n, dtype=torch.bool)
        expected[tree.path_to(i)] = True
        assert torch.equal(tree.ancestor[i], expected)
        assert tree.children[i] == [c for c in range(n) if int(tree.parents[c]) == i]
        siblings = tree.tokens[tree.children[i]].tolist()
        assert len(set(siblings)) == len(siblings)  # lookup drafts merge into equal drafted siblings
    if settings_.tree_policy == "chain":
        assert all(len(c) <= 1 + bool(tree.grafted[c].any()) for c in tree.children)
    if settings_.min_draft_prob > 0:  # no verified draft is less likely than the floor
        assert bool((tree.log_q[1:] >= math.log(settings_.min_draft_prob)).all())



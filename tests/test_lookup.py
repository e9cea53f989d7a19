"""Lookup branches: continuations copied from earlier text, grafted onto the draft tree, keep output exact."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt

from hf_dynaspec import DynaSpecConfig, DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.lookup import find_continuation
from hf_dynaspec.generation.drafting.tree import grow_tree, new_pool
from hf_dynaspec.generation_config import DEFAULT_SETTINGS, DraftSettings, resolve_draft_settings


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens)


@pytest.mark.parametrize(
    ("sequence", "max_ngram", "min_ngram", "num_tokens", "expected"),
    [
        ((5, 6, 7, 8, 5, 6), 3, 1, 2, [7, 8]),  # suffix (5, 6) seen at 0: what followed it
        ((5, 6, 7, 8, 5, 6), 3, 1, 9, [7, 8, 5, 6]),  # runs to the end of the sequence
        ((1, 2, 9, 3, 2, 7, 3, 2), 3, 1, 1, [7]),  # (3, 2) twice before the end: the latest wins
        ((1, 2, 9, 4, 2, 7, 1, 2), 3, 1, 1, [9]),  # the longest n-gram wins over a later 1-gram match
        ((1, 2, 3, 4), 3, 1, 2, []),  # no suffix n-gram occurred before
        ((4, 4, 4), 2, 1, 3, [4]),  # (4, 4) at 0 is followed by the last 4; the repetition continues
        ((5, 6, 7, 8, 5, 6), 3, 3, 2, []),  # only a 2-gram recurs, 3-grams asked for
        ((5, 6, 7, 5, 6), 3, 1, 0, []),  # off
        ((5,), 3, 1, 2, []),
    ],
)
def test_find_continuation(sequence, max_ngram, min_ngram, num_tokens, expected):
    assert find_continuation(ids(*sequence), max_ngram, min_ngram, num_tokens) == expected


def chain_settings(depth: int) -> DraftSettings:
    return DraftSettings(**{**DEFAULT_SETTINGS, "tree_policy": "chain", "num_draft_nodes": depth, "draft_depth": depth,
                            "draft_top_k": 1, "head_mode": "full", "shortlist_k0": 1, "shortlist_k1": 1})


def fixed_expand(token: int):
    """Every node proposes `token` with log q = -1."""
    return lambda nodes: (torch.full((len(nodes), 1), token), torch.full((len(nodes), 1), -1.0))


def grow_chain(depth: int, max_depth: int, lookup: list[int]):
    expand = fixed_expand(7)
    settings = chain_settings(depth)
    return grow_tree(new_pool(0, settings), expand([0]), expand, settings, max_depth, lookup)


def test_graft_shares_the_drafted_prefix_and_branches_where_it_differs():
    tree = grow_chain(3, 10, lookup=[7, 7, 9, 4])
    # drafts: 7 -> 7 -> 7; lookup: 7 -> 7 -> 9 -> 4 shares two nodes, then branches
    assert tree.tokens.tolist() == [0, 7, 7, 9, 7, 4]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 3]
    assert tree.grafted.tolist() == [False, False, False, True, False, True]
    assert tree.children[2] == [3, 4]  # the lookup child ranks first: it keeps its parent's q(path)
    assert tree.log_q[3] == tree.log_q[2]


def test_graft_respects_the_length_left():
    tree = grow_chain(3, 2, lookup=[1, 2, 3, 4])
    assert int(tree.depths.max()) == 2 and tree.grafted.sum() == 2


@pytest.mark.parametrize("policy", ["eagle2", "dyspec", "chain"])
@pytest.mark.parametrize(("num_tokens", "min_ngram"), [(1, 1), (4, 1), (6, 2)])
def test_lookup_keeps_greedy_exact_and_is_used(target, drafter, policy, num_tokens, min_ngram):
    ids_ = prompt(9, seed=5)
    config = DynaSpecGenerationConfig(
        tree_policy=policy, num_draft_nodes=4, draft_depth=2, draft_top_k=2, lookup_num_tokens=num_tokens,
        lookup_min_ngram=min_ngram, max_new_tokens=40, do_sample=False, return_dict_in_generate=True,
        step_policy="off",  # every step verifies the tree with its lookup branch (the policy's picks are timed)
    )
    out = target.generate(ids_, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids_, do_sample=False, max_new_tokens=40))
    # a random tiny target soon repeats itself, so copied continuations get accepted
    assert out.speculative_stats.lookup_tokens > 0


def test_lookup_settings_are_validated():
    with pytest.raises(ValueError, match="lookup_num_tokens"):
        DynaSpecGenerationConfig(lookup_num_tokens=-1)
    config = DynaSpecGenerationConfig(lookup_num_tokens=2, lookup_max_ngram=2, lookup_min_ngram=3)
    with pytest.raises(ValueError, match="lookup_min_ngram"):
        resolve_draft_settings(config, None, DynaSpecConfig(vocab_size=64, num_clusters=8))

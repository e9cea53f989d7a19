"""EAGLE-2 growth on the device (generation/drafting/tree.py on a pool without host columns: fixed-shape tensor ops): the same
trees as on the host, no host read until the tree is read once, and greedy speculative output equal to greedy.

    python -m pytest tests/test_device_growth.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import draft_settings, greedy, prompt, speculative, tiny_drafter, tiny_target

from hf_dynaspec.generation.drafting.candidates import DynaSpecCandidateGenerator
from hf_dynaspec.generation.drafting.tree import TreePool, drive, growing, select_nodes
from hf_dynaspec.generation.loop.syncs import HostSyncCounter
from hf_dynaspec.generation.verification.cache import crop_cache
from hf_dynaspec.generation_config import resolve_draft_settings, split_implementation


def generator_after_prompt(target, drafter, ids=None, **settings):
    """A candidate generator that has read a prompt (as after the prefill)."""
    config = drafter.generation_config.__class__(**split_implementation(settings))
    resolved = resolve_draft_settings(config, drafter.generation_config, drafter.config, "cpu")
    generator = DynaSpecCandidateGenerator(drafter.bind(target), resolved)
    ids = prompt(10) if ids is None else ids
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    generator.extend(drafter.target_features(out.hidden_states)[0], torch.cat([ids[0, 1:], ids[0, -1:]]))
    return generator, torch.cat([ids, ids[:, -1:]], dim=-1)


def tree_columns(tree):
    return tree.token_list, tree.parent_list, tree.depth_list, [round(q, 9) for q in tree.log_q_list]


@pytest.mark.parametrize("settings", [
    dict(num_draft_nodes=12, draft_depth=4, draft_top_k=3),
    dict(num_draft_nodes=40, draft_depth=5, draft_top_k=4, min_draft_prob=0.02),
    dict(num_draft_nodes=5, draft_depth=6, draft_top_k=2),
    dict(tree_policy="chain", num_draft_nodes=4, draft_depth=4),
    dict(num_draft_nodes=8, draft_depth=3, draft_top_k=3, head_mode="full"),
])
def test_device_growth_grows_the_host_trees(settings):
    target = tiny_target(eos_token_id=2)
    drafter = tiny_drafter(target)
    trees = {}
    for growth in ("host", "device"):
        generator, ids = generator_after_prompt(target, drafter, lookup_num_tokens=0, tree_growth=growth, **settings)
        trees[growth] = generator.draft(ids)
    assert tree_columns(trees["device"]) == tree_columns(trees["host"])
    assert torch.equal(trees["device"].ancestor, trees["host"].ancestor)


@pytest.mark.parametrize("settings", [
    dict(num_draft_nodes=12, draft_depth=4, draft_top_k=3, lookup_num_tokens=5),
    dict(num_draft_nodes=3, draft_depth=2, draft_top_k=2, lookup_num_tokens=6),  # the branch deeper than the tree
    dict(tree_policy="chain", num_draft_nodes=4, draft_depth=4, lookup_num_tokens=3),
])
def test_device_graft_grafts_the_host_lookup_branch(settings):
    """A prompt that repeats itself, so the lookup branch has tokens to graft (some on drafted nodes)."""
    target = tiny_target(eos_token_id=2)
    drafter = tiny_drafter(target)
    ids = torch.tensor([[9, 40, 41, 42, 43, 44, 9, 40, 41, 42]])
    trees = {}
    for growth in ("host", "device"):
        generator, committed = generator_after_prompt(target, drafter, ids, tree_growth=growth, **settings)
        committed[0, -1] = 40  # the root: "9 40" recurs, so the branch is 41 42 43 44 9 ...
        trees[growth] = generator.draft(committed)
    assert any(trees["host"].grafted_list)
    assert tree_columns(trees["device"]) == tree_columns(trees["host"])
    assert trees["device"].grafted_list == trees["host"].grafted_list


def test_device_growth_reads_the_tree_once():
    target = tiny_target(eos_token_id=2)
    drafter = tiny_drafter(target)
    ids = torch.tensor([[9, 40, 41, 42, 43, 44, 9, 40, 41, 42]])
    generator, ids = generator_after_prompt(target, drafter, ids, lookup_num_tokens=4, tree_growth="device",
                                            shortlist_layout="lanes", num_draft_nodes=20, draft_depth=5, draft_top_k=4)
    ids[0, -1] = 40
    committed = ids[0].tolist()
    with HostSyncCounter() as counter:
        generator._draft_fixed(ids[0, -1], committed, None)
    assert counter.counts["tolist"] == 1 and counter.total == 1, dict(counter.counts)


def test_selection_keeps_ancestors_and_the_best_scores():
    pool = TreePool.empty(torch.tensor(7), 7, on_host=False)
    root_children = (torch.tensor([[10, 11]]), torch.log(torch.tensor([[0.6, 0.4]])))
    layer = pool.add_layer(torch.zeros(1, dtype=torch.long), *root_children, float("-inf"))
    pool.add_layer(layer, torch.tensor([[20, 21], [22, 23]]), torch.log(torch.tensor([[0.9, 0.1], [1.0, 0.0]])),
                   float("-inf"))
    keep = select_nodes(pool, 3)
    chosen = {int(t) for t in pool.tokens[keep]}
    assert chosen == {7, 10, 20, 11}  # 10 (0.6), 20 (0.54), 11 (0.4) then 22 (0.4: the tie goes to the shallower)


@pytest.mark.parametrize("on_host", [True, False])
def test_the_floor_kills_a_node_on_host_and_device_alike(on_host):
    settings = draft_settings("eagle2", 4, 2, 2, min_prob=0.3)
    pool = TreePool.empty(7 if on_host else torch.tensor(7), 7, on_host=on_host)
    root_children = (torch.tensor([[10, 11]]), torch.log(torch.tensor([[0.6, 0.4]])))
    proposals = (torch.tensor([[20, 21], [22, 23]]), torch.log(torch.tensor([[0.9, 0.1], [1.0, 0.0]])))
    tree = drive(growing(pool, root_children, settings),
                 lambda frontier, depth: (proposals[0][: len(frontier)], proposals[1][: len(frontier)]))
    assert set(tree.token_list) == {7, 10, 20, 11, 22}  # 21 (0.06) is under the floor, 23 impossible


@pytest.mark.parametrize("growth, layout", [("host", "lanes"), ("device", "union"), ("device", "lanes")])
@pytest.mark.parametrize("mode", ["dynamic", "union", "full"])
@pytest.mark.parametrize("policy", ["eagle2", "dyspec", "chain"])
def test_greedy_speculative_on_every_drafting_path_equals_greedy(growth, layout, mode, policy):
    """Device growth and lanes, alone and together ("dyspec" trees always grow on the host)."""
    target = tiny_target(eos_token_id=None)
    drafter = tiny_drafter(target)
    ids = prompt()
    out = speculative(target, drafter, ids, max_new_tokens=24, tree_policy=policy, head_mode=mode,
                      tree_growth=growth, shortlist_layout=layout, num_draft_nodes=10, draft_depth=4)
    assert torch.equal(out, greedy(target, ids, max_new_tokens=24))


@pytest.mark.parametrize("mode", ["dynamic", "union", "full"])
def test_one_draft_step_reads_nothing_and_compiles_whole(mode):
    """The drafter call for one depth (layer, router, head, top-k children) and the tree arithmetic around it:
    no host read, and `fullgraph=True` (any graph break fails; the eager backend checks it without codegen)."""
    target = tiny_target(eos_token_id=2)
    drafter = tiny_drafter(target)
    generator, ids = generator_after_prompt(target, drafter, lookup_num_tokens=0, tree_growth="device",
                                            shortlist_layout="lanes", head_mode=mode, num_draft_nodes=20,
                                            draft_depth=4, draft_top_k=3)
    pool = TreePool.empty(ids[0, -1], 1 + 3 + 3 * 9, on_host=False)
    layer = pool.add_layer(torch.zeros(1, dtype=torch.long), *generator.root.children, float("-inf"))
    expand = generator.fixed_expander()
    with HostSyncCounter() as counter:
        tokens, log_q = expand(pool, layer, 1)
    assert counter.total == 0, dict(counter.counts)
    crop_cache(generator.cache, generator.committed)  # as `draft` does after each tree
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(generator.fixed_expander())(pool, layer, 1)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    step = torch.compile(generator.draft_step, fullgraph=True, backend="eager")
    parents = generator.root.feature[None].expand(layer.numel(), -1)
    positions = torch.full((layer.numel(),), generator.committed, dtype=torch.long)
    mask = generator._fixed_mask(pool, layer, 1, 0)
    budget = drafter.config.shortlist_k1  # clusters per node at draft position 1
    crop_cache(generator.cache, generator.committed)
    eager = generator.draft_step(pool.tokens[layer], parents, positions, mask, budget)
    crop_cache(generator.cache, generator.committed)
    compiled = step(pool.tokens[layer], parents, positions, mask, budget)
    assert torch.equal(compiled[2][0], eager[2][0])
    torch.testing.assert_close(compiled[2][1], eager[2][1])

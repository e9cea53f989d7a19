"""Verification-cost-aware tree trimming (`hf_dynaspec.generation.cost`): the cost model, the acceptance
estimates, the choice of m*, and greedy exactness with trimming on."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.calibration import measure_verify_costs
from hf_dynaspec.generation.cost import AcceptanceTracker, VerifyCosts, acceptance_estimates, trim_to_cost
from hf_dynaspec.generation.tree import DraftTree, compact, graft_chain


def small_tree():
    """root -> a (q 0.6) -> c (q 0.4 given a); root -> b (q 0.3); lookup chain root -> b -> d.

    Verification order (by depth, then q(path)): [root, a, b, d, c]."""
    pool = DraftTree(root_token=0)
    a = pool.add(10, 0, float(torch.log(torch.tensor(0.6))))
    b = pool.add(11, 0, float(torch.log(torch.tensor(0.3))))
    c = pool.add(12, a, pool.log_q[a] + float(torch.log(torch.tensor(0.4))))
    selected = graft_chain(pool, [0, a, b, c], [11, 13])  # shares b, grafts d under it
    return compact(pool, selected)


def test_verify_costs_extrapolate_by_the_last_step_and_refuse_nonsense():
    costs = VerifyCosts((1.0, 1.1, 1.4))
    assert [costs(n) for n in (1, 2, 3, 4, 6)] == pytest.approx([1.0, 1.1, 1.4, 1.7, 2.3])
    assert VerifyCosts((1.0,))(9) == 1.0
    with pytest.raises(ValueError, match="positive"):
        VerifyCosts((1.0, -2.0))
    with pytest.raises(ValueError, match="positive"):
        VerifyCosts((True, 1.5))
    with pytest.raises(ValueError, match="verify_costs"):
        DynaSpecGenerationConfig(verify_costs=[1.0, 0.0])
    with pytest.raises(ValueError, match="verify_costs"):
        DynaSpecGenerationConfig(verify_costs="sometimes")


def test_acceptance_estimates_multiply_along_paths():
    tree = small_tree()
    assert tree.tokens.tolist() == [0, 10, 11, 13, 12]
    assert tree.grafted.tolist() == [False, False, False, True, False]
    a = acceptance_estimates(tree, AcceptanceTracker())  # kappa = 1, rho = 1/2
    assert a == pytest.approx([1.0, 0.6, 0.3, 0.15, 0.24])
    tracker = AcceptanceTracker(drafted_expected=1.0, drafted_accepted=2.0, lookup_tested=4.0, lookup_accepted=1.0)
    # kappa = 2 caps 2 x 0.6 at 1; rho = 1/4
    assert acceptance_estimates(tree, tracker) == pytest.approx([1.0, 1.0, 0.6, 0.15, 0.8])


def test_tracker_counts_the_children_of_the_accepted_path():
    tree = small_tree()
    tracker = AcceptanceTracker()
    tracker.update(tree, [0, 2])  # b accepted; tested: a, b (root's children) and d (b's child, lookup)
    assert tracker.drafted_expected == pytest.approx(1.0 + 0.6 + 0.3)
    assert tracker.drafted_accepted == 2.0
    assert (tracker.lookup_tested, tracker.lookup_accepted) == (3.0, 1.0)


@pytest.mark.parametrize(
    ("costs", "kept"),
    [
        ((1.0, 1.0, 1.0, 1.0, 1.0), [0, 10, 11, 13, 12]),  # flat cost (GPU): verify everything
        ((1.0, 1.05, 2.0, 2.0, 2.0), [0, 10]),  # only one draft is nearly free: (1 + 0.6) / 1.05 wins
        ((1.0, 3.0), [0]),  # every draft costs more than it can return: root only
    ],
)
def test_trim_keeps_the_best_rate(costs, kept):
    trimmed = trim_to_cost(small_tree(), VerifyCosts(costs), AcceptanceTracker())
    assert trimmed.tokens.tolist() == kept


def test_measured_costs_start_at_one_and_never_fall(target):
    costs = measure_verify_costs(target, max_tokens=4)
    assert len(costs.costs) == 4 and costs(1) == 1.0
    assert all(later >= earlier for earlier, later in zip(costs.costs, costs.costs[1:]))
    assert measure_verify_costs(target, max_tokens=4) is costs  # memoised per target and setting


@pytest.mark.parametrize("verify_costs", ["auto", [1.0, 1.02, 1.3, 1.6], [1.0, 5.0]])
@pytest.mark.parametrize("policy", ["eagle2", "dyspec"])
def test_trimmed_trees_keep_greedy_exact(target, drafter, policy, verify_costs, one_thread):
    ids = prompt(9, seed=5)
    config = DynaSpecGenerationConfig(
        tree_policy=policy, num_draft_nodes=6, draft_depth=3, draft_top_k=2, lookup_num_tokens=4,
        verify_costs=verify_costs, max_new_tokens=40, do_sample=False, return_dict_in_generate=True,
    )
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=40))
    nodes = out.speculative_stats.tree_nodes
    if verify_costs == [1.0, 5.0]:  # no draft can pay for 5 steps: every tree is the root alone
        assert nodes == 0
    if verify_costs == [1.0, 1.02, 1.3, 1.6]:  # a first lookup draft (a = rho = 1/2 at first) pays for 1.02
        assert nodes >= 1

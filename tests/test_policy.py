"""The step policy (`hf_dynaspec.generation.planning.policy`): the cost model, per-depth calibration, trimming, the
choice between plain, lookup and drafted steps, its reports, and greedy exactness whatever it chooses."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import greedy, prompt, speculative

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.tree import TreePool, compact, graft, lookup_tree, subtree
from hf_dynaspec.generation.loop import decoding
from hf_dynaspec.generation.planning import learned
from hf_dynaspec.generation.planning.calibration import measure_verify_costs
from hf_dynaspec.generation.planning.policy import (
    LOOKUP_PRIOR_WEIGHT,
    MAX_PROBE_GAP,
    MIN_SEEN,
    STALE_AFTER,
    Calibration,
    Option,
    Plan,
    StepPolicy,
    Timings,
    VerifyCosts,
    acceptance_estimates,
    accepted_variance,
    choose_options,
    probing_rows,
    shrunk_rate,
    trim,
    trim_trees,
)
from hf_dynaspec.generation.planning.step_arms import StepArms


def small_tree():
    """root -> a (q 0.6) -> c (q 0.4 given a); root -> b (q 0.3); lookup chain root -> b -> d.

    Verification order (by depth, then q(path)): [root, a, b, d, c]."""
    pool = TreePool.empty(0, 8)
    a = pool.add(10, 0, math.log(0.6))
    b = pool.add(11, 0, math.log(0.3))
    c = pool.add(12, a, pool.host.scores[a] + math.log(0.4))
    keep = pool.mask([0, a, b, c])
    return compact(pool, keep, graft(pool, keep, [11, 13]))  # shares b, grafts d under it


def path_distribution(tree, a):
    """P(the accepted path ends at node i) = a_i - sum of its children's a (one path is accepted)."""
    return [a[i] - sum(a[c] for c in tree.children[i]) for i in range(tree.num_nodes)]


@pytest.mark.parametrize("rates", [(1.0, 0.5), (0.4, 0.9), (1.2, 0.1)])
def test_accepted_variance_is_that_of_the_path_distribution(rates):
    """Var(L) from the closed form equals the variance of the accepted length over the distribution of where the
    accepted path ends (the lookup chain included)."""
    calibration = Calibration(drafted_expected={1: 1.0, 2: 1.0}, drafted_accepted={1: rates[0], 2: rates[0]},
                              lookup_tested={1: 2.0, 2: 2.0}, lookup_accepted={1: 2 * rates[1], 2: 2 * rates[1]})
    tree = small_tree()
    a = acceptance_estimates(tree, calibration)
    ends = path_distribution(tree, a)
    assert min(ends) >= 0  # siblings' estimates within their parent's: a distribution to compare with
    mean = sum(p * (1 + tree.depth_list[i]) for i, p in enumerate(ends))
    second = sum(p * (1 + tree.depth_list[i]) ** 2 for i, p in enumerate(ends))
    assert mean == pytest.approx(sum(a))
    assert accepted_variance(tree, a) == pytest.approx(second - mean * mean)


def test_accepted_variance_of_a_chain_and_of_siblings():
    chain = lookup_tree(0, [5, 6])  # a = 1, 0.5, 0.25
    assert accepted_variance(chain, [1.0, 0.5, 0.25]) == pytest.approx(0.25 + 4 * 0.25 - 0.75 ** 2)
    pool = TreePool.empty(0, 3)
    pool.add(5, 0, math.log(0.3))
    pool.add(6, 0, math.log(0.6))
    siblings = compact(pool, pool.mask(range(3)))
    assert accepted_variance(siblings, [1.0, 0.6, 0.3]) == pytest.approx(0.9 * 0.1)  # one of them, or none


def test_verify_costs_extrapolate_by_the_last_step_and_refuse_nonsense():
    costs = VerifyCosts((1.0, 1.1, 1.4))
    assert [costs(n) for n in (1, 2, 3, 4, 6)] == pytest.approx([1.0, 1.1, 1.4, 1.7, 2.3])
    assert VerifyCosts((1.0,))(9) == 1.0
    for bad in ((1.0, -2.0), (True, 1.5), ()):
        with pytest.raises(ValueError, match="positive"):
            VerifyCosts(bad)


def test_acceptance_estimates_multiply_along_paths_with_per_depth_calibration():
    tree = small_tree()
    assert tree.tokens.tolist() == [0, 10, 11, 13, 12]
    assert tree.grafted.tolist() == [False, False, False, True, False]
    a = acceptance_estimates(tree, Calibration())  # kappa = 1, rho = 1/2 at every depth
    assert a == pytest.approx([1.0, 0.6, 0.3, 0.15, 0.24])
    # depth 1: kappa = (1 + 3) / (1 + 1) = 2 caps 2 x 0.6 at 1; depth 2 shrinks toward depth 1:
    # kappa = (1 x 2 + 0) / (1 + 1) = 1, rho = (1/2 x 1/2 + 0) / (1/2 + 2) = 1/10 (the lookup prior worth 1/2)
    calibration = Calibration(drafted_expected={1: 1.0, 2: 1.0}, drafted_accepted={1: 3.0},
                              lookup_tested={2: 2.0}, lookup_weight=0.5)
    assert acceptance_estimates(tree, calibration) == pytest.approx([1.0, 1.0, 0.6, 0.06, 0.4])


def test_a_depth_seldom_reached_starts_from_the_depth_above():
    hits, tested = {1: 95.0, 2: 47.0}, {1: 100.0, 2: 50.0}  # nothing seen at depth 3
    r1 = shrunk_rate(hits, tested, 1, prior=0.5, weight=2.0)
    r2 = shrunk_rate(hits, tested, 2, prior=0.5, weight=2.0)
    assert r1 == pytest.approx(96 / 102) and r2 == pytest.approx((2 * r1 + 47) / 52)
    assert shrunk_rate(hits, tested, 3, prior=0.5, weight=2.0) == pytest.approx(r2)  # not pulled back to 1/2


def test_calibration_counts_the_children_of_the_accepted_path_per_depth():
    calibration = Calibration()
    calibration.update(small_tree(), [0, 2])  # b accepted; tested: a, b (depth 1) and d (b's child, lookup)
    assert calibration.drafted_expected == pytest.approx({1: 0.9})
    assert calibration.drafted_accepted == {1: 1.0}
    assert (calibration.lookup_tested, calibration.lookup_accepted) == ({2: 1.0}, {2: 0.0})
    assert calibration.kappa(1) == pytest.approx(2.0 / 1.9)
    assert calibration.kappa(2) == pytest.approx(2.0 / 1.9)  # no drafter node tested at depth 2: depth 1's


def test_calibration_weights_recent_steps_and_ignores_a_root_alone():
    """A sequence whose drafts were all accepted, then all rejected: the rate follows the recent steps (decay
    0.85), where pooled counts (decay 1) would sit halfway; a step verifying the root alone changes nothing."""
    recent, pooled = Calibration(), Calibration(decay=1.0)
    tree = small_tree()
    for path in [[0, 2]] * 20 + [[0]] * 20:  # b accepted, then nothing
        recent.update(tree, path)
        pooled.update(tree, path)
    assert recent.kappa(1) < 0.2 and 0.4 < pooled.kappa(1) < 0.6  # the prior (kappa = 1, worth one) remains
    before = (dict(recent.drafted_expected), dict(recent.drafted_accepted))
    recent.update(lookup_tree(3, []), [0])
    assert (recent.drafted_expected, recent.drafted_accepted) == before
    assert recent.carried().decay == recent.decay


def test_a_carried_calibration_keeps_its_rates_with_a_bounded_weight():
    calibration = Calibration(drafted_expected={1: 200.0, 2: 3.0}, drafted_accepted={1: 150.0, 2: 3.0},
                              lookup_tested={1: 500.0}, lookup_accepted={1: 400.0}, draft_weight=3.0, lookup_weight=0.25)
    carried = calibration.carried(weight=16.0)
    assert (carried.draft_weight, carried.lookup_weight, carried.decay) == (3.0, 0.25, calibration.decay)
    assert carried.drafted_expected == pytest.approx({1: 16.0, 2: 3.0})  # small counts are kept as they are
    assert carried.drafted_accepted == pytest.approx({1: 12.0, 2: 3.0})
    assert carried.lookup_accepted[1] / carried.lookup_tested[1] == pytest.approx(0.8)
    assert carried.lookup_tested[1] == pytest.approx(16.0)


@pytest.mark.parametrize(
    ("costs", "kept", "expected"),
    [
        ((1.0, 1.0, 1.0, 1.0, 1.0), [0, 10, 11, 13, 12], 1 + 0.6 + 0.3 + 0.15 + 0.24),  # flat (GPU): all
        ((1.0, 1.05, 2.0, 2.0, 2.0), [0, 10], 1.6),  # only one draft is nearly free: (1 + 0.6) / 1.05 wins
        ((1.0, 3.0), [0], 1.0),  # every draft costs more than it can return: root only
    ],
)
def test_trim_keeps_the_best_rate_and_predicts_its_accepted_length(costs, kept, expected):
    trimmed, predicted = trim(small_tree(), VerifyCosts(costs), Calibration())
    assert trimmed.tokens.tolist() == kept
    assert predicted == pytest.approx(expected)


def drafted_once(policy: StepPolicy, depth: int = 3) -> None:
    """Record one drafted step (a chain of `depth` drafts, the first accepted) so the policy has costs."""
    pool = TreePool.empty(0, depth + 1)
    node = 0
    for d in range(depth):
        node = pool.add(20 + d, node, pool.host.scores[node] + math.log(0.5))
    tree = compact(pool, pool.mask(range(depth + 1)))
    plan = Plan("draft", depth, root_mass=0.5)
    policy.record(plan, tree, [0, 1], {"verify": 0.01, "catch_up": 0.001, "draft": 0.001 * (depth - 1)})


def test_the_first_step_probes_at_full_depth_then_costs_decide():
    policy = StepPolicy(VerifyCosts((1.0, 1.05, 1.1, 1.15)), max_depth=3)
    first = policy.plan(None, [], room=10)
    assert (first.kind, first.depth, first.probe) == ("draft", 3, True)
    drafted_once(policy)
    assert policy.plan([0.9, 0.05], [], room=10).kind == "draft"  # a confident root pays for cheap drafts
    assert policy.plan([0.9], [], room=0).kind == "plain"  # no room left for a draft


def test_dear_verification_gives_plain_steps_and_a_probe_every_few():
    policy = StepPolicy(VerifyCosts((1.0, 5.0)), max_depth=3, probe_every=3)
    drafted_once(policy)
    kinds = []
    for _ in range(4):
        plan = policy.plan([0.9], [7, 8], room=10)
        kinds.append(plan.kind)
        tree = lookup_tree(0, plan.lookup) if plan.kind != "draft" else small_tree()
        policy.record(plan, tree, [0], {"verify": 0.01})
    assert kinds == ["plain", "plain", "plain", "draft"]  # the fourth refreshes the estimates


def probe_kinds(policy: StepPolicy, steps: int, trimmed: bool) -> list[str]:
    """The kinds of `steps` planned and recorded steps; a drafted one verifies small_tree, or (`trimmed`) its root
    alone, accepting nothing."""
    kinds = []
    for _ in range(steps):
        plan = policy.plan([0.9], [], room=10)
        kinds.append("probe" if plan.probe else plan.kind)
        tree = small_tree() if plan.kind == "draft" and not trimmed else lookup_tree(0, ())
        policy.record(plan, tree, [0], {"verify": 0.01 * policy.costs(tree.num_nodes)})  # as costly as measured
    return kinds


def test_probes_trimmed_to_their_root_come_ever_further_apart_until_one_verifies_drafts():
    policy = StepPolicy(VerifyCosts((1.0, 5.0)), max_depth=3, probe_every=2)
    drafted_once(policy)
    kinds = probe_kinds(policy, 16, trimmed=True)
    assert [i for i, kind in enumerate(kinds) if kind == "probe"] == [2, 7]  # gaps of 2, then 4 steps
    assert set(kinds) == {"plain", "probe"} and policy.gap() == 8
    probe_kinds(policy, 200, trimmed=True)
    assert policy.gap() == MAX_PROBE_GAP  # the gap stops growing
    kinds = []
    while "probe" not in kinds and len(kinds) < 2 * MAX_PROBE_GAP:  # the next probe verifies its drafts, in vain
        kinds += probe_kinds(policy, 1, trimmed=False)
    assert kinds[-1] == "probe" and policy.gap() == 2
    policy.probe_gap = 16
    chosen = Plan("draft", 3, root_mass=0.5)  # a draft chosen on its merits, not forced
    policy.record(chosen, lookup_tree(0, ()), [0], {"verify": 0.01})
    assert policy.gap() == 16  # trimmed to the root: it neither probed nor verified a draft
    policy.record(chosen, small_tree(), [0], {"verify": 0.05})
    assert policy.gap() == 2


def test_a_trusted_lookup_branch_is_verified_alone_when_the_drafter_is_unsure():
    policy = StepPolicy(VerifyCosts((1.0, 1.02, 1.04, 1.06)), max_depth=3)
    drafted_once(policy)
    policy.calibration = Calibration(lookup_tested={1: 20.0, 2: 20.0}, lookup_accepted={1: 19.0, 2: 19.0},
                                     drafted_expected={1: 20.0}, drafted_accepted={1: 1.0})
    plan = policy.plan([0.1], [7, 8], room=10)
    assert plan == Plan("lookup", lookup=(7, 8))
    w = LOOKUP_PRIOR_WEIGHT
    rho_1 = (w / 2 + 19) / (w + 20)
    rho_2 = (w * rho_1 + 19) / (w + 20)  # shrunk toward depth 1
    assert policy.expected(lookup_tree(0, plan.lookup)) == pytest.approx(1 + rho_1 + rho_1 * rho_2)


def with_costs(monkeypatch, costs):
    """Make generate() plan with a given cost table instead of measuring one."""
    monkeypatch.setattr(decoding, "step_costs", lambda settings, target, walk_head, batch=1: VerifyCosts(costs))


@pytest.mark.parametrize("costs", [(1.0, 1.02, 1.3, 1.6), (1.0, 5.0), (1.0,) * 4])
@pytest.mark.parametrize("tree_policy", ["eagle2", "dyspec"])
def test_greedy_stays_exact_whatever_the_policy_chooses(target, drafter, tree_policy, costs, monkeypatch,
                                                        one_thread):
    with_costs(monkeypatch, costs)
    monkeypatch.setattr(StepArms, "next_arm", lambda self: "policy")  # the policy alone (its A/B: test_step_arms)
    ids = prompt(9, seed=5)
    out = speculative(target, drafter, ids, tree_policy=tree_policy, num_draft_nodes=6, draft_depth=3,
                      draft_top_k=2, lookup_num_tokens=4, max_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=40))
    stats = out.speculative_stats
    if costs == (1.0, 5.0):  # no draft pays for 5 steps: plain steps but for the probes, trees trimmed to roots
        assert stats.plain_steps >= stats.steps // 2 and stats.tree_nodes == 0
    if costs == (1.0,) * 4:  # verification is free (drafting is not): trees are verified whole
        assert stats.tree_nodes > stats.steps - stats.plain_steps and stats.predicted_steps > 0
        assert stats.predicted_accepted_length >= 1.0
    assert stats.summary()["setup_time_s"] > 0


def test_the_next_call_starts_from_what_the_last_one_learned(target, drafter, monkeypatch, one_thread):
    with_costs(monkeypatch, (1.0, 1.02, 1.04, 1.06, 1.08))
    started, at_start, keys = [], [], []

    def start(*args):
        started.append(learned.start_policy(*args))
        at_start.append(copy.deepcopy(started[-1]))
        return started[-1]

    monkeypatch.setattr(decoding, "start_policy", start)
    monkeypatch.setattr(decoding, "keep_policy", lambda *args: keys.append(args[2]) or learned.keep_policy(*args))
    learned.forget_policies(drafter)
    for seed in (5, 6):
        ids = prompt(9, seed=seed)
        out = speculative(target, drafter, ids, num_draft_nodes=6, draft_depth=3, max_new_tokens=24)
        assert torch.equal(out, greedy(target, ids, max_new_tokens=24))
    assert at_start[0].calibration == Calibration() and not at_start[0].timings.levels  # the priors
    assert keys[0] == keys[1]  # the same settings: the same key
    ended = started[0]  # as the first call left it
    assert sum(ended.calibration.drafted_expected.values()) > 0
    assert at_start[1].calibration == ended.calibration.carried()
    assert at_start[1].timings == ended.timings and at_start[1].undrafted == 0
    learned.forget_policies(drafter)


def test_the_policy_off_verifies_the_whole_tree(target, drafter, one_thread):
    ids = prompt(9, seed=5)
    out = speculative(target, drafter, ids, step_policy="off", num_draft_nodes=6, draft_depth=3, draft_top_k=2,
                      max_new_tokens=20, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=20))
    stats = out.speculative_stats
    assert stats.plain_steps == 0 and stats.predicted_steps == 0 and stats.tree_nodes > 0


@pytest.mark.parametrize(("name", "value"), [("verify_costs", "auto"), ("verify_costs", [1.0, 1.2]),
                                             ("draft_gate", True)])
def test_replaced_settings_are_refused_by_name(target, drafter, name, value):
    with pytest.raises(ValueError, match=f"{name}=.*step policy"):
        DynaSpecGenerationConfig(**{name: value}).validate()
    with pytest.raises(ValueError, match=f"{name}=.*step_policy='off'"):
        target.generate(prompt(5), assistant_model=drafter, max_new_tokens=3, **{name: value})
    inert = {"verify_costs": "off", "draft_gate": False}[name]  # what older generation_config.json files hold
    DynaSpecGenerationConfig(**{name: inert}).validate()


def test_measured_costs_start_at_one_and_never_fall(target):
    costs = measure_verify_costs(target, max_tokens=9)
    assert len(costs.costs) == 9 and costs(1) == 1.0
    assert all(later >= earlier for earlier, later in zip(costs.costs, costs.costs[1:]))
    assert measure_verify_costs(target, max_tokens=9) is costs  # memoised per target and setting


def test_costs_are_measured_at_the_batch_size_bucket(target):
    from hf_dynaspec.generation.planning.policy import batch_bucket

    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 32)] == [1, 2, 4, 4, 8, 8, 16, 32]
    single = measure_verify_costs(target, max_tokens=5)
    batched = measure_verify_costs(target, max_tokens=5, batch=4)
    assert len(batched.costs) == 5 and batched(1) == 1.0 and batched is not single
    assert measure_verify_costs(target, max_tokens=5, batch=4) is batched  # memoised per batch size


def test_a_batch_chooses_one_block_for_every_row():
    """The batch's rate is sum E / (c(N) + sum w): a draft that pays for one row alone does not pay when its
    drafting delays many rows that would not draft, and a block one row pays for is free up to its size for the
    others."""
    costs = VerifyCosts((1.0, 1.05, 1.1, 1.15))
    plain = Option(Plan("plain"), 1.0, 1)
    draft = Option(Plan("draft", 3), 2.0, 4, work=0.05)  # alone: 2 / (1.15 + 0.05) = 1.67 > 1
    assert [o.plan.kind for o in choose_options([[plain, draft]], costs)] == ["draft"]
    many = choose_options([[plain, draft]] + [[plain]] * 9, costs)  # 11 / 1.2 < 10 / 1
    assert [o.plan.kind for o in many] == ["plain"] * 10
    lookup = Option(Plan("lookup", lookup=(7, 8)), 1.5, 3)
    rows = [[plain, draft], [plain, lookup], [plain, lookup]]  # 5 / 1.2 beats 4 / 1.1 and 3 / 1
    assert [o.plan.kind for o in choose_options(rows, costs)] == ["draft", "lookup", "lookup"]
    assert choose_options([[plain, lookup]], VerifyCosts((1.0, 1.3, 1.6))) == [plain]  # 1.5 / 1.6 < 1


@pytest.mark.parametrize("overhead", [0.0, 0.4])
@pytest.mark.parametrize("shared", [(0.0, 0.0), (0.15, 0.0), (0.05, 0.4), (0.6, 0.6)])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (0.3, 2.0), (2.0, 0.01)])
def test_choose_options_finds_the_best_rate_of_every_combination(weights, shared, overhead):
    """Dinkelbach's iteration per block size and deepest draft against brute force over every combination of
    options, with the drafting's shared parts (a round's, paid D - 1 times; the catch-up's, once if any row
    drafts) as the rows draft in lockstep, and the step's overhead, paid once whatever the rows do."""
    import itertools

    level, catch_up = shared
    costs = VerifyCosts((1.0, 1.2, 1.3, 1.5, 1.9, 2.4))
    menus = [[Option(Plan("plain"), 1.0, 1), Option(Plan("lookup", lookup=(5,)), 1.2 + 0.1 * b, 2)] + [
        Option(Plan("draft", d), 1.0 + weights[0] * (b + 1) * d / 4, 1 + d, work=weights[1] * d / 10)
        for d in range(1, 6)] for b in range(3)]

    def rate(picks):
        deepest = max(o.plan.depth for o in picks)
        drafting = max(0, deepest - 1) * level + (catch_up if deepest >= 1 else 0.0)
        return sum(o.expected for o in picks) / (costs(max(o.nodes for o in picks)) + overhead + drafting
                                                 + sum(o.work for o in picks))

    best = max(rate(picks) for picks in itertools.product(*menus))
    assert rate(choose_options(menus, costs, level, catch_up, overhead)) == pytest.approx(best)


def test_a_step_overhead_makes_plain_steps_dearer_and_trees_larger():
    """Every step pays the overhead o: a draft that loses to a plain step at o = 0 (1.9 / 2.0 < 1) wins once
    o = 0.3 counts (1.9 / 2.3 > 1 / 1.3), and a trim at o keeps nodes it would cut at 0."""
    costs = VerifyCosts((1.0, 1.4, 1.7, 2.0))
    plain, draft = Option(Plan("plain"), 1.0, 1), Option(Plan("draft", 3), 1.9, 4)
    assert choose_options([[plain, draft]], costs) == [plain]
    assert choose_options([[plain, draft]], costs, overhead=0.3) == [draft]
    dear = VerifyCosts((1.0, 1.5, 1.8, 2.1, 2.4))
    assert trim(small_tree(), dear, Calibration())[0].tokens.tolist() == [0, 10]  # 1.6 / 1.5 beats the rest
    assert trim(small_tree(), dear, Calibration(), overhead=0.5)[0].tokens.tolist() == [0, 10, 11]


def test_the_step_overhead_is_timed_in_plain_steps_once_a_forward_is():
    timings = Timings()
    timings.observe_overhead(0.5)  # the first step, before any forward is timed: its setup is not counted
    assert timings.overhead_cost() == 0.0
    timings.plain.add(0.04)
    timings.observe_overhead(0.01)
    timings.observe_overhead(-0.001)  # clock noise cannot make a step cheaper than its forward
    assert timings.overhead_cost() == pytest.approx(0.8 * 0.01 / 0.04)


def test_rounds_cost_a_shared_part_and_a_part_per_row_fitted_to_what_was_timed():
    timings = Timings()
    timings.plain.add(0.1)
    timings.observe_level(1, 0.004)
    assert timings.level_costs() == pytest.approx((0.04, 0.0))  # one row count seen: all of it shared
    timings.observe_level(8, 0.011)
    assert timings.level_costs() == pytest.approx((0.03, 0.01))  # the line through (1, 0.04) and (8, 0.11)
    timings.together = False  # rows drafting one after another: nothing shared, one row's round each
    assert timings.level_costs() == pytest.approx((0.0, 0.04))
    assert Timings().catch_up_costs() == (0.0, 0.0)  # nothing measured yet


def test_the_depth_profile_learns_what_drafting_gives_the_row_not_what_the_batch_kept():
    """In a batch, the joint trim may cut a lone drafting row's tree to its root (every row pays for the block);
    the profile keeps what the row's own trim at this batch size keeps, so drafting still looks worth it."""
    costs = VerifyCosts((1.0, 1.02, 1.5, 1.6, 1.7))
    policy = StepPolicy(costs, max_depth=2)
    drafted = small_tree()
    root_only = subtree(drafted, [0])
    policy.record(Plan("draft", 2, root_mass=0.9), root_only, [0], {"draft": 0.01}, rows=8, drafted=drafted)
    kept, _ = trim(drafted, costs, Calibration())
    gain, nodes = policy.profile.predict(2, 0.9)
    assert nodes == len(kept.token_list) - 1 > 0 and gain > 0
    cut = StepPolicy(costs, max_depth=2)
    cut.record(Plan("draft", 2, root_mass=0.9), root_only, [0], {"draft": 0.01}, rows=8)
    assert cut.profile.predict(2, 0.9) == (0.0, 0.0)  # the batch's cut, learned as it was: nothing to gain


def test_trees_of_a_batch_are_trimmed_to_one_block():
    """A block one row's tree pays for is free for the others up to its size: each keeps its best nodes there;
    a lookup chain is cut to a prefix like any tree."""
    costs = VerifyCosts((1.0, 1.02, 1.5, 1.6, 1.7))
    alone = trim(small_tree(), costs, Calibration())
    assert alone[0].tokens.tolist() == [0, 10]  # one draft is nearly free, a second is dear
    sure = Calibration(lookup_tested={d: 50.0 for d in (1, 2, 3)}, lookup_accepted={d: 50.0 for d in (1, 2, 3)})
    (row, expected), (chain, _) = trim_trees([small_tree(), lookup_tree(0, [7, 8, 9])], costs,
                                             [Calibration(), sure])
    assert chain.tokens.tolist() == [0, 7, 8, 9]  # a sure chain pays for a block of 4 ...
    assert row.tokens.tolist() == [0, 10, 11, 12]  # ... where the other row keeps its three best drafts
    assert expected == pytest.approx(1 + 0.6 + 0.3 + 0.6 * 0.4)
    (_, _), (unsure, _) = trim_trees([small_tree(), lookup_tree(0, [7, 8, 9])], costs, [Calibration()] * 2)
    assert unsure.tokens.tolist() == [0, 7]  # rho = 1/2 at every depth: the chain is cut


@pytest.mark.parametrize("together", [False, True])
def test_rows_probe_only_after_quiet_steps_one_at_a_time_unless_drafting_together(together):
    measured = StepPolicy(VerifyCosts((1.0, 5.0)), max_depth=3, probe_every=3)
    drafted_once(measured)
    measured.timings.together = together
    rows = [copy.deepcopy(measured) for _ in range(3)]
    for row, undrafted in zip(rows, (3, 5, 1)):
        row.undrafted = undrafted
    assert probing_rows(rows, [10, 10, 10], quiet_steps=2) == []  # the batch drafted recently
    # every row due probes when the rows draft in lockstep; else the most overdue row alone
    assert probing_rows(rows, [10, 10, 10], quiet_steps=3) == ([0, 1] if together else [1])
    assert probing_rows(rows, [10, 0, 10], quiet_steps=3) == [0]  # no room left to draft in row 1
    unmeasured = StepPolicy(VerifyCosts((1.0, 5.0)), max_depth=3)
    assert probing_rows([rows[0], unmeasured], [10, 10], quiet_steps=0) == [1]  # its drafting cost is unknown


def test_an_observed_cost_not_seen_for_long_gives_way_to_the_measured_one():
    """A size observed dear (a burst of load) is not verified again while it looks dear: after `STALE_AFTER`
    verifications of other sizes its observed cost is forgotten, and the next observations of it start afresh."""
    measured = VerifyCosts((1.0, 1.1, 1.2, 1.3))
    timings = Timings()
    for _ in range(4):
        timings.observe(1, 1, 0.1)  # the first of a shape is not counted
    for _ in range(4):
        timings.observe(1, 3, 0.5)  # c(3) observed at 5: the machine was busy
    assert timings.costs(measured, 1)(3) == pytest.approx(5.0)
    for _ in range(STALE_AFTER):
        timings.observe(1, 1, 0.1)
    assert timings.costs(measured, 1)(3) == pytest.approx(5.0)  # seen STALE_AFTER verifications ago: kept
    timings.observe(1, 1, 0.1)
    assert timings.costs(measured, 1) == measured  # forgotten: the measurement again
    for _ in range(MIN_SEEN):
        timings.observe(1, 3, 0.13)
    assert timings.costs(measured, 1)(3) == pytest.approx(1.3)  # the new observations alone, not mixed with 5


def test_verifications_correct_the_measured_costs_at_their_batch_bucket():
    """A cold first-call measurement is rough: c(n) as the call's own verifications took it replaces it, and the
    measured shape carries that level to the sizes not seen."""
    measured = VerifyCosts((1.0, 1.1, 1.2, 1.3, 1.4))
    timings = Timings()
    for _ in range(3):
        timings.observe(8, 3, 0.5)  # not used: one token's seconds at 8 rows are not known yet
    assert timings.costs(measured, 8) == measured
    timings.observe(8, 1, 0.9)  # a shape's first verification pays its kernels' setup: not counted
    for _ in range(3):
        timings.observe(8, 1, 0.1)
    for _ in range(3):
        timings.observe(8, 3, 0.18)
    corrected = timings.costs(measured, 7)  # 7 rows: the same bucket as 8
    assert corrected(3) == pytest.approx(1.8) and corrected(2) == pytest.approx(1.1)
    assert corrected(5) == pytest.approx(1.4 * 1.8 / 1.2)  # the measured shape at the observed level
    assert timings.costs(measured, 2) == measured  # another bucket: nothing seen there

"""The policy's steps against the whole tree's (`step_arms.StepArms`): each arm gets its turns, the better one
by realised tokens per second takes the steps, the other is re-checked at a bounded rate; and in generate() a
call whose policy is made to decline every draft still verifies whole trees, learns from them, and stays exact."""

import torch
from helpers import prompt

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.loop import decoding
from hf_dynaspec.generation.planning import policy
from hf_dynaspec.generation.planning.step_arms import EXPLORE_EVERY, MIN_STEPS, RECHECK_EVERY, StepArms


def run(arms: StepArms, rate: dict[str, float], steps: int) -> list[str]:
    """`steps` steps whose arms emit `rate[arm]` tokens per second (one second each)."""
    used = []
    for _ in range(steps):
        arm = arms.next_arm()
        arms.record(arm, rate[arm], 1.0)
        used.append(arm)
    return used


def test_the_faster_arm_takes_the_steps_and_the_other_is_rechecked():
    arms = StepArms()
    used = run(arms, {"policy": 10.0, "tree": 14.0}, 400)
    explored = EXPLORE_EVERY * MIN_STEPS
    assert used[:explored].count("tree") == MIN_STEPS  # its turns while unknown
    assert arms.best() == "tree"
    late = used[explored + EXPLORE_EVERY:]
    assert 0 < late.count("policy") <= len(late) // RECHECK_EVERY + 1  # re-checked, at a bounded rate


def test_the_policy_keeps_the_steps_where_it_is_faster():
    arms = StepArms()
    used = run(arms, {"policy": 14.0, "tree": 10.0}, 200)
    assert arms.best() == "policy"
    assert used[100:].count("tree") <= 100 // RECHECK_EVERY + 1


def test_a_change_of_rates_moves_the_choice():
    arms = StepArms()
    run(arms, {"policy": 14.0, "tree": 10.0}, 100)
    run(arms, {"policy": 8.0, "tree": 12.0}, 300)
    assert arms.best() == "tree"


def test_a_policy_that_declines_every_draft_still_learns_from_whole_trees(target, drafter, monkeypatch):
    monkeypatch.setattr(policy.StepPolicy, "options",
                        lambda self, *args, **kwargs: [policy.Option(policy.Plan("plain"), 1.0, 1)])
    monkeypatch.setattr(decoding, "probing_rows", lambda *args: [])  # no forced probe either
    ids = prompt(7, seed=2)
    config = DynaSpecGenerationConfig(max_new_tokens=40, do_sample=False, return_dict_in_generate=True)
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=40))
    stats = out.speculative_stats
    assert stats.tree_nodes > stats.steps  # whole trees were verified: the tree arm's turns, nothing else drafts
    assert stats.plain_steps < stats.steps

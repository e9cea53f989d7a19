"""verify_head="auto" learns the LM head's layout from the call's own verifications (`head_learner.HeadLearner`):
with costs injected, it converges to the cheapest layout within a bounded number of steps, pays a bounded share of
steps for re-checking, follows a change of costs, starts the next process from what it stored, and a generate()
call whose layout is made slow moves off it with output identical to greedy."""

import time

import pytest
import torch
from helpers import prompt

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.planning import calibration, measured
from hf_dynaspec.generation.planning.policy import VerifyCosts, relaid_costs
from hf_dynaspec.generation.verification.head_learner import (
    EXPLORE_SAMPLES,
    KEEP,
    RECHECK_EVERY,
    HeadLearner,
    learner_key,
)
from hf_dynaspec.generation.verification.walk_head import RowsHead

LAYOUTS = ("rows", "columns", "prefilter")


def learner_of(target, key=None, layouts=LAYOUTS) -> HeadLearner:
    return HeadLearner.of(layouts, lambda layout: calibration.layout_head(target, layout), 3, key)


def run_steps(learner: HeadLearner, cost: dict[str, float], steps: int, rows: int = 3) -> list[str]:
    """`steps` verifications at `rows` walk rows whose head applications cost `cost[layout]` seconds (injected:
    told to the learner as `WalkHead.timed` would); returns the layout of each step."""
    used = []
    for _ in range(steps):
        head, _ = learner.pick(rows)
        head.observe(head.layout, rows, cost[head.layout])
        learner.close()
        used.append(head.layout)
    return used


def test_it_converges_to_the_cheapest_layout_within_bounded_steps(target):
    learner = learner_of(target)
    cost = {"rows": 0.030, "columns": 0.020, "prefilter": 0.010}
    used = run_steps(learner, cost, 200)
    explore = len(LAYOUTS) * (1 + EXPLORE_SAMPLES)  # a warm-up then the samples, per layout
    assert learner.choice(3) == "prefilter"
    assert all(layout == "prefilter" for layout in used[explore : explore + RECHECK_EVERY // 2])
    others = sum(layout != "prefilter" for layout in used[explore:])
    assert 0 < others <= (len(LAYOUTS) - 1) * (200 // RECHECK_EVERY + 1)  # re-checks: bounded, not none


def test_each_row_count_learns_its_own_layout(target):
    learner = learner_of(target, layouts=("rows", "columns"))
    run_steps(learner, {"rows": 0.001, "columns": 0.002}, 20, rows=1)
    run_steps(learner, {"rows": 0.009, "columns": 0.004}, 20, rows=3)
    assert learner.choice(1) == "rows" and learner.choice(3) == "columns"


def test_it_follows_a_change_of_costs(target):
    learner = learner_of(target, layouts=("rows", "columns"))
    run_steps(learner, {"rows": 0.002, "columns": 0.004}, 40)
    assert learner.choice(3) == "rows"
    used = run_steps(learner, {"rows": 0.008, "columns": 0.004}, KEEP + RECHECK_EVERY)
    assert learner.choice(3) == "columns"
    assert used[-1] == "columns"


def test_what_it_learned_starts_the_next_process(target, tmp_path, monkeypatch):
    monkeypatch.setenv(measured.ENV, "disk")
    monkeypatch.setenv(measured.DIR_ENV, str(tmp_path))
    key = learner_key(target, LAYOUTS, 3)
    first = learner_of(target, key)
    run_steps(first, {"rows": 0.03, "columns": 0.02, "prefilter": 0.01}, 12)
    first.save()
    again = learner_of(target, key)
    assert again.knows(3) and again.choice(3) == "prefilter"
    head, exploring = again.pick(3)
    assert head.layout == "prefilter" and not exploring  # its best from the first step


def test_a_layout_that_cannot_be_made_is_dropped(target):
    learner = HeadLearner.of(("rows", "prefilter"), lambda layout: None if layout == "prefilter"
                             else calibration.layout_head(target, layout), 3, None)
    used = run_steps(learner, {"rows": 0.01, "prefilter": 0.001}, 6)
    assert set(used) == {"rows"} and learner.layouts == ("rows",)


def test_costs_are_relaid_for_another_layout():
    # c(n) * unit - old(w) + new(w), w = min(n, 2), over the same at n = 1: (10 - 5 + 1), (15 - 6 + 2), (20 - 6 + 2)
    costs = relaid_costs(VerifyCosts((1.0, 1.5, 2.0)), 10.0, [5.0, 6.0], [1.0, 2.0])
    assert costs.costs == pytest.approx((1.0, 11 / 6, 16 / 6))


def test_generate_moves_off_a_layout_made_slow_and_stays_exact(target, drafter, monkeypatch):
    """A cold call (nothing timed up front) starts in the model's own layout; made slow, the learner finds another
    one on the call's own steps, and the output is plain greedy's."""
    calibration.forget_learners()
    monkeypatch.setattr(measured, "thorough", lambda: False)  # as a first call in the default disk mode
    original = RowsHead.apply

    def slow(self, hidden):
        time.sleep(0.02)
        return original(self, hidden)

    monkeypatch.setattr(RowsHead, "apply", slow)
    ids = prompt(7, seed=3)
    config = DynaSpecGenerationConfig(max_new_tokens=64, do_sample=False, return_dict_in_generate=True)
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=64))
    (learner,) = calibration._LEARNERS[target].values()
    assert learner.layouts[0] == "rows"  # where the cold call started
    explored = sorted({bucket for _, bucket in learner.samples if learner.knows(bucket)})
    assert explored and all(learner.choice(bucket) != "rows" for bucket in explored)  # every layout timed there
    calibration.forget_learners()

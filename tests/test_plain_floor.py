"""benchmarks/plain_floor.py: inside `only_plain_steps` every step of a generate() call is plain (the floor it
measures) and the output is plain greedy's; after the block the policy, probes and arms are as they were."""

import torch
from helpers import load_benchmark_script, prompt

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.loop import decoding
from hf_dynaspec.generation.planning import policy, step_arms


def test_every_step_is_plain_inside_the_block_and_nothing_is_left_patched(target, drafter):
    floor = load_benchmark_script("plain_floor")
    before = (policy.StepPolicy.options, decoding.probing_rows, step_arms.StepArms.next_arm)
    ids = prompt(7, seed=1)
    with floor.only_plain_steps():
        seconds, sequences = floor.package_step_seconds(target, drafter, ids, 20)
    assert torch.equal(sequences, target.generate(ids, do_sample=False, max_new_tokens=20)) and seconds > 0
    config = DynaSpecGenerationConfig(max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
    with floor.only_plain_steps():
        stats = target.generate(ids, generation_config=config, assistant_model=drafter).speculative_stats
    assert stats.plain_steps == stats.steps and stats.tree_nodes == 0
    assert (policy.StepPolicy.options, decoding.probing_rows, step_arms.StepArms.next_arm) == before

"""`prepare_for_cpu`: same values, same ties, column-major Linear weights; decoding stays exact.

    .venv/bin/python -m pytest tests/test_cpu_layout.py -q
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import prompt, tiny_drafter, tiny_target

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.cpu import is_prepared_for_cpu, prepare_for_cpu

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("tied", [True, False])
def test_same_values_same_ties_new_strides(tied):
    target = tiny_target(tie_word_embeddings=tied)
    before = copy.deepcopy(target)
    ids = prompt(9)
    prepare_for_cpu(target)
    assert is_prepared_for_cpu(target) and not is_prepared_for_cpu(before)
    head = target.lm_head.weight
    assert head.stride() == (1, head.shape[0]) and torch.equal(head, before.lm_head.weight)
    assert (head is target.model.embed_tokens.weight) == tied
    for (name, new), old in zip(target.named_parameters(), before.parameters()):
        assert torch.equal(new, old), name
    with torch.no_grad():
        torch.testing.assert_close(target(ids).logits, before(ids).logits, rtol=1e-5, atol=1e-5)
    assert prepare_for_cpu(target).lm_head.weight is head  # idempotent


def test_other_dtypes_are_left_alone():
    target = tiny_target().to(torch.bfloat16)
    prepare_for_cpu(target)
    assert not is_prepared_for_cpu(target)


@pytest.mark.parametrize("policy", ["eagle2", "chain"])
def test_speculative_greedy_stays_exact_after_preparing(policy):
    target = tiny_target()
    drafter = tiny_drafter(target)  # bound before: the drafter must follow the re-laid head
    prepare_for_cpu(target)
    prepare_for_cpu(drafter)
    ids = prompt(7)
    config = DynaSpecGenerationConfig(tree_policy=policy, num_draft_nodes=8, draft_depth=4, max_new_tokens=20,
                                      do_sample=False)
    got = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(got, target.generate(ids, do_sample=False, max_new_tokens=20))
    assert drafter.bound_head.weight.data_ptr() == target.lm_head.weight.data_ptr()

"""Sampling is lossless: the 2nd and 3rd generated tokens follow the target's exact distribution.

Tokens 2 and 3 come out of tree verification (the 1st comes from the prefill), so their marginals test the
multi-draft rejection sampler. On a vocabulary of 8 the exact marginals are computed by enumeration:
P(x2) = sum_x1 p(x1) p(x2 | x1), P(x3) = sum_{x1, x2} p(x1) p(x2 | x1) p(x3 | x1 x2), with the same logits
processors (temperature, top-p) applied to every p. Check: Pearson chi-square against those marginals below
the 0.999 quantile of chi2 with K - 1 = 7 degrees of freedom (24.32), for N = 1200 samples with a fixed seed.
A verifier that accepts drafts greedily or ignores the residual shifts mass onto the drafted tokens and
fails this by a wide margin (checked by hand while writing the test).
"""

from __future__ import annotations

import pytest
import torch
from helpers import CHI2_999_DF7, VOCAB, chi_square, exact_marginals, tiny_drafter, tiny_target
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from hf_dynaspec import DynaSpecGenerationConfig

SAMPLES = 1200


@pytest.mark.parametrize(
    ("temperature", "top_p", "lookup", "prompt", "step_policy"),
    [(1.0, 1.0, 0, [1, 5, 3], "off"), (0.7, 0.9, 0, [1, 5, 3], "off"), (1.0, 1.0, 2, [6, 2, 7, 4, 1], "off"),
     (1.0, 1.0, 2, [6, 2, 7, 4, 1], "auto")],
    ids=["plain", "temperature-top-p", "lookup-branch", "step-policy"],  # this target's first pick is mostly 6 or 7
)
def test_sampling_matches_target_distribution(temperature, top_p, lookup, prompt, step_policy):
    """With step_policy="off" every step verifies the whole tree, so the sampler's draft paths are exercised
    (asserted); with "auto" the policy picks each step's tree from timings (plain, lookup or drafted), which
    varies between machines, so only the marginals are asserted: they must hold whichever trees it picks."""
    target = tiny_target(vocab_size=VOCAB, seed=21)
    # the lookup case's sample count was sized for the acceptance of this (EAGLE-1) random drafter
    drafter = tiny_drafter(target, num_clusters=4, drafter_architecture="eagle1" if lookup else "eagle3")
    processors = LogitsProcessorList()
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    p2, p3 = exact_marginals(target, prompt, processors)

    config = DynaSpecGenerationConfig(
        tree_policy="eagle2", draft_depth=2, draft_top_k=3, num_draft_nodes=6, head_mode="full",
        do_sample=True, temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=3,
        return_dict_in_generate=True, lookup_num_tokens=lookup, step_policy=step_policy,
        implementation={"verify_head": "rows"},  # one layout: "auto" may pick another by timing (ulps apart: other samples)
    )
    torch.manual_seed(1234)
    counts2, counts3 = torch.zeros(VOCAB), torch.zeros(VOCAB)
    accepted = from_lookup = 0
    for _ in range(SAMPLES):
        out = target.generate(torch.tensor([prompt]), generation_config=config, assistant_model=drafter)
        x2, x3 = out.sequences[0, len(prompt) + 1 :].tolist()
        counts2[x2] += 1
        counts3[x3] += 1
        accepted += out.speculative_stats.accepted_tokens - out.speculative_stats.steps  # drafts accepted
        from_lookup += out.speculative_stats.lookup_tokens
    if step_policy == "off":
        assert accepted > SAMPLES // 10, "too few drafts accepted: the test would not exercise the sampler"
        assert from_lookup > SAMPLES // 20 or not lookup, "lookup drafts were not exercised"
    assert chi_square(counts2, p2) < CHI2_999_DF7
    assert chi_square(counts3, p3) < CHI2_999_DF7


def test_plain_sampling_passes_the_same_check():
    """Control: transformers' own sampling (no drafter) with the same processors passes the same check, so the
    enumeration and the threshold are right; `test_sampling_matches_target_distribution` then tests the
    speculative sampler alone."""
    target = tiny_target(vocab_size=VOCAB, seed=21)
    prompt = [1, 5, 3]
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])
    p2, p3 = exact_marginals(target, prompt, processors)
    torch.manual_seed(4321)
    counts2, counts3 = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for _ in range(SAMPLES):
        out = target.generate(torch.tensor([prompt]), do_sample=True, temperature=0.7, top_p=0.9, top_k=0,
                              max_new_tokens=3)
        x2, x3 = out[0, len(prompt) + 1 :].tolist()
        counts2[x2] += 1
        counts3[x3] += 1
    assert chi_square(counts2, p2) < CHI2_999_DF7
    assert chi_square(counts3, p3) < CHI2_999_DF7

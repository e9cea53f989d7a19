"""The candidate generator behind transformers' own interface: transformers' `_assisted_decoding` loop drives
`DynaSpecCandidateGenerator` as a chain drafter (hidden states through `requires_model_outputs` /
`model_kwargs_overrides`, draft logits for its speculative sampling, matches back through
`update_candidate_strategy`). Greedy output equals plain greedy; sampled tokens follow the target's
distribution. The tree interface is covered end to end by test_generate.py and test_properties.py.

    python -m pytest tests/test_candidates.py -q
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from helpers import (
    CHI2_999_DF7,
    VOCAB,
    chi_square,
    exact_marginals,
    greedy,
    prompt,
    tiny_drafter,
    tiny_target,
)
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerationMixin

from hf_dynaspec import DynaSpecCandidateGenerator, DynaSpecGenerationConfig
from hf_dynaspec.generation.loop import hook

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def transformers_loop(
    target, drafter, ids, config, generator_class: type = DynaSpecCandidateGenerator
) -> tuple[torch.Tensor, list[DynaSpecCandidateGenerator]]:
    """generate() through transformers' own assisted loop (the hook bypassed) with our candidate generator.
    Returns the sequences and the generator(s) the loop built."""
    built: list[DynaSpecCandidateGenerator] = []

    def candidate_generator(self, generation_config, **kwargs):
        built.append(generator_class.for_generate(self, drafter, generation_config))
        return built[-1]

    transformers_own = getattr(GenerationMixin._assisted_decoding, hook._MARK)
    with mock.patch.object(GenerationMixin, "_assisted_decoding", transformers_own), \
            mock.patch.object(GenerationMixin, "_get_candidate_generator", candidate_generator):
        out = target.generate(ids, generation_config=config, assistant_model=drafter)
    return out, built


@pytest.mark.parametrize("head_mode", ["dynamic", "full"])
@pytest.mark.parametrize("depth", [1, 3, 6])
def test_transformers_loop_with_our_generator_equals_plain_greedy(head_mode, depth):
    target = tiny_target(vocab_size=16, seed=3)
    drafter = tiny_drafter(target, num_clusters=4)
    ids = prompt(6, vocab_size=16, seed=depth)
    config = DynaSpecGenerationConfig(draft_depth=depth, head_mode=head_mode, max_new_tokens=30, do_sample=False)
    out, built = transformers_loop(target, drafter, ids, config)
    assert torch.equal(out, greedy(target, ids, max_new_tokens=30))
    (generator,) = built
    stats = generator.stats
    assert stats.accepted_tokens == 30 - 1  # every token but the prefill's came from a verified chain
    assert stats.tree_nodes <= stats.steps * depth  # chains of at most `depth` drafts
    assert stats.recall_checks == stats.steps


class OracleChain(DynaSpecCandidateGenerator):
    """Chains whose first `right` drafts are the target's greedy continuation, then a wrong token: long
    accepted prefixes and rejections, with the drafter still reading every verified position."""

    right = 2

    def get_candidates(self, input_ids, **kwargs):
        self.ids = input_ids
        return super().get_candidates(input_ids, **kwargs)

    def draft_chain(self, depth):
        super().draft_chain(depth)  # the drafter runs (and its cache is cropped back) as usual
        target, ids, tokens = self.drafter.bound_target, self.ids, []
        for t in range(depth):
            with torch.no_grad():
                best = int(target(ids).logits[0, -1].argmax())
            token = best if t < self.right else (best + 1) % self.drafter.config.vocab_size
            tokens.append(token)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=-1)
        logits = torch.full((depth, self.drafter.config.vocab_size), float("-inf"))
        logits[torch.arange(depth), torch.tensor(tokens)] = 0.0
        return torch.tensor(tokens), logits


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_accepted_chains_keep_both_caches_in_step(depth):
    target = tiny_target(vocab_size=64, seed=5)
    drafter = tiny_drafter(target)
    ids = prompt(5, vocab_size=64)
    config = DynaSpecGenerationConfig(draft_depth=depth, max_new_tokens=24, do_sample=False)
    out, (generator,) = transformers_loop(target, drafter, ids, config, OracleChain)
    assert torch.equal(out, greedy(target, ids, max_new_tokens=24))
    stats = generator.stats
    assert stats.accepted_tokens - stats.steps >= (stats.steps - 1) * min(depth, OracleChain.right)
    # the drafter read every position verified before the last step (1..depth + 1 tokens, not read: no
    # drafts follow them)
    assert out.shape[1] - 1 - (depth + 1) <= generator.committed <= out.shape[1] - 2


def test_first_call_waits_for_the_prefill_and_then_needs_hidden_states():
    target = tiny_target()
    drafter = tiny_drafter(target)
    generator = DynaSpecCandidateGenerator.for_generate(target, drafter, DynaSpecGenerationConfig(max_new_tokens=5))
    ids = prompt(4)
    assert generator.get_candidates(ids, model_outputs=None, is_first_iteration=True) == (ids, None)
    with pytest.raises(ValueError, match="hidden_states"):
        generator.get_candidates(ids, model_outputs=None, is_first_iteration=False)


def test_draft_logits_are_the_drafters_shortlisted_distribution():
    """get_candidates returns (1, L + k) ids and (1, k, V) logits, finite exactly on each position's
    shortlist, whose argmax is the greedy draft."""
    target = tiny_target()
    drafter = tiny_drafter(target)
    generator = DynaSpecCandidateGenerator.for_generate(
        target, drafter, DynaSpecGenerationConfig(draft_depth=3, max_new_tokens=20, do_sample=False))
    ids = prompt(6)
    with torch.no_grad():
        outputs = target(ids[:, :-1], output_hidden_states=True)  # the prefill of ids[:, :-1]; ids[-1] its pick
    candidates, logits = generator.get_candidates(ids, model_outputs=outputs, is_first_iteration=False)
    assert candidates.shape == (1, 6 + 3) and torch.equal(candidates[:, :6], ids)
    assert logits.shape == (1, 3, 128)
    assert torch.equal(logits[0].argmax(-1), candidates[0, 6:])
    finite = torch.isfinite(logits[0]).sum(-1)
    assert bool((finite > 0).all()) and bool((finite < 128).all())  # a shortlist, not the vocabulary
    assert generator.committed == 5 and generator.cache.get_seq_length() == 5  # drafts cropped away


SAMPLES = 1200


def test_sampling_through_transformers_loop_keeps_the_target_distribution():
    """Sampled chains with their draft logits go through transformers' speculative sampling: the second
    token (the first that verification decides) follows the target's exact marginal."""
    target = tiny_target(vocab_size=VOCAB, seed=21)
    drafter = tiny_drafter(target, num_clusters=4)
    context = [1, 5, 3]
    p2, _ = exact_marginals(target, context, LogitsProcessorList())
    config = DynaSpecGenerationConfig(draft_depth=2, head_mode="full", do_sample=True, top_k=0, max_new_tokens=3)
    torch.manual_seed(7)
    counts, accepted = torch.zeros(VOCAB), 0
    for _ in range(SAMPLES):
        out, (generator,) = transformers_loop(target, drafter, torch.tensor([context]), config)
        counts[int(out[0, len(context) + 1])] += 1  # x2, one draft verified before it
        accepted += generator.stats.accepted_tokens - generator.stats.steps
    assert accepted > SAMPLES // 10, "too few drafts accepted: the test would not exercise the sampler"
    assert chi_square(counts, p2) < CHI2_999_DF7

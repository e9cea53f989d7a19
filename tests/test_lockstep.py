"""Drafting several rows in lockstep (`lockstep.draft_together`): one drafter forward per round for every row
gives each row the tree it would draft alone (`generator.draft`), with rows of different lengths, depths and
room, for both tree policies; the rows' own caches are left as they were.

    python -m pytest tests/test_lockstep.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import prompt, tiny_drafter, tiny_target

from hf_dynaspec import DynaSpecCandidateGenerator, DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.lockstep import catch_up_together, draft_together, drafts_together
from hf_dynaspec.generation_config import resolve_draft_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def ready_generators(target, drafter, settings, lengths: list[int], vocab: int):
    """One generator per prompt length, each having read its prompt (as after a catch-up), with the sequences."""
    generators, sequences = [], []
    for row, length in enumerate(lengths):
        ids = prompt(length, vocab_size=vocab, seed=10 + row)
        with torch.no_grad():
            out = target(input_ids=ids, output_hidden_states=True)
        tokens = ids[0].tolist() + [int(out.logits[0, -1].argmax())]
        generator = DynaSpecCandidateGenerator(drafter, settings)
        generator.extend(drafter.target_features(out.hidden_states)[0], torch.tensor(tokens[1:]), tokens[1:])
        generators.append(generator)
        sequences.append(tokens)
    return generators, sequences


@pytest.mark.parametrize("policy", ["eagle2", "dyspec"])
@pytest.mark.parametrize("head_mode", ["dynamic", "static", "full"])
def test_lockstep_trees_equal_each_row_drafted_alone(policy, head_mode):
    vocab = 64
    target = tiny_target(vocab_size=vocab, seed=5)
    drafter = tiny_drafter(target, num_clusters=8, static_token_ids=torch.arange(3, 40)).bind(target)
    config = DynaSpecGenerationConfig(tree_policy=policy, head_mode=head_mode, num_draft_nodes=10, draft_depth=4,
                                      draft_top_k=3, lookup_num_tokens=3)
    settings = resolve_draft_settings(config, drafter.generation_config, drafter.config, "cpu")
    assert drafts_together(settings)
    lengths, max_depths, depths = [5, 9, 2, 7], [4, 2, 4, 0], [4, 4, 1, 3]
    generators, sequences = ready_generators(target, drafter, settings, lengths, vocab)
    caches = [(g.cache.layers[0].keys.clone(), g.cache.layers[0].values.clone()) for g in generators]
    together = draft_together(generators, sequences, max_depths, depths)
    for generator, (keys, values) in zip(generators, caches):  # the rows' own caches untouched
        assert torch.equal(generator.cache.layers[0].keys, keys) and torch.equal(generator.cache.layers[0].values,
                                                                                  values)
    for generator, tokens, max_depth, depth, tree in zip(generators, sequences, max_depths, depths, together):
        alone = generator.draft(torch.tensor([tokens]), max_depth=max_depth, committed=tokens, depth=depth)
        assert tree.token_list == alone.token_list
        assert tree.parent_list == alone.parent_list
        assert tree.grafted_list == alone.grafted_list
        assert torch.allclose(torch.tensor(tree.log_q_list), torch.tensor(alone.log_q_list), atol=1e-5)
    assert max(len(tree.token_list) for tree in together) > 4  # real trees were drafted


def test_rows_with_context_heads_do_not_draft_together():
    target = tiny_target(vocab_size=64, seed=5)
    drafter = tiny_drafter(target, num_clusters=8)
    for head_mode, expected in [("context", False), ("union", False), ("dynamic", True)]:
        config = DynaSpecGenerationConfig(head_mode=head_mode)
        assert drafts_together(resolve_draft_settings(config, drafter.generation_config, drafter.config,
                                                      "cpu")) is expected
    config = DynaSpecGenerationConfig(implementation={"tree_growth": "device"})
    assert not drafts_together(resolve_draft_settings(config, drafter.generation_config, drafter.config, "cpu"))


@pytest.mark.parametrize("head_mode", ["dynamic", "full"])
def test_catching_up_together_equals_each_row_catching_up_alone(head_mode):
    vocab = 64
    target = tiny_target(vocab_size=vocab, seed=7)
    drafter = tiny_drafter(target, num_clusters=8).bind(target)
    config = DynaSpecGenerationConfig(head_mode=head_mode, draft_top_k=3)
    settings = resolve_draft_settings(config, drafter.generation_config, drafter.config, "cpu")
    apart, _ = ready_generators(target, drafter, settings, [4, 8, 3], vocab)
    together, _ = ready_generators(target, drafter, settings, [4, 8, 3], vocab)
    width = drafter.config.hidden_size * len(drafter.config.feature_layer_ids)
    for row, new in enumerate([3, 1, 0]):  # accepted paths of different lengths; the last row has none pending
        for generators in (apart, together):
            if new:
                generator = torch.Generator().manual_seed(row)
                generators[row].defer(torch.randn(new, width, generator=generator), list(range(5, 5 + new)))
    for generator in apart:
        generator.catch_up()
    catch_up_together(together)
    for alone, joint in zip(apart, together):
        assert joint.committed == alone.committed and not joint.pending
        assert torch.allclose(joint.cache.layers[0].keys, alone.cache.layers[0].keys, atol=1e-5)
        assert torch.allclose(joint.cache.layers[0].values, alone.cache.layers[0].values, atol=1e-5)
        assert torch.allclose(joint.root.feature, alone.root.feature, atol=1e-5)
        assert torch.equal(joint.root.children[0], alone.root.children[0])
        assert torch.allclose(joint.root.children[1], alone.root.children[1], atol=1e-5)


def test_rows_reading_their_prompts_together_equal_each_reading_alone():
    """A row's first catch-up reads its whole prompt into an empty drafter cache (no layers yet)."""
    vocab = 64
    target = tiny_target(vocab_size=vocab, seed=8)
    drafter = tiny_drafter(target, num_clusters=8).bind(target)
    settings = resolve_draft_settings(DynaSpecGenerationConfig(draft_top_k=3), drafter.generation_config,
                                      drafter.config, "cpu")
    made = []
    for _ in range(2):
        generators = []
        for row, length in enumerate([6, 2, 9]):
            ids = prompt(length, vocab_size=vocab, seed=20 + row)
            with torch.no_grad():
                out = target(input_ids=ids, output_hidden_states=True)
            tokens = ids[0].tolist()[1:] + [int(out.logits[0, -1].argmax())]
            generator = DynaSpecCandidateGenerator(drafter, settings)
            generator.defer(drafter.target_features(out.hidden_states)[0], tokens)
            generators.append(generator)
        made.append(generators)
    apart, together = made
    for generator in apart:
        generator.catch_up()
    catch_up_together(together)
    for alone, joint in zip(apart, together):
        assert joint.committed == alone.committed > 0
        assert torch.allclose(joint.cache.layers[0].keys, alone.cache.layers[0].keys, atol=1e-5)
        assert torch.equal(joint.root.children[0], alone.root.children[0])

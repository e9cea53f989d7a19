"""Unsupported input to generate() with a DynaSpec drafter is refused with a clear message."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt, tiny_target

from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.generation_config import DEFAULT_SETTINGS, resolve_draft_settings


def test_a_row_of_padding_only_is_refused(target, drafter):
    ids = torch.cat([prompt(5, seed=1), prompt(5, seed=2)])
    mask = torch.tensor([[1] * 5, [0] * 5])
    with pytest.raises(ValueError, match="all padding"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4, pad_token_id=0)


def test_beam_search_is_refused(target, drafter):
    with pytest.raises(ValueError, match="num_beams=1"):
        target.generate(prompt(5), assistant_model=drafter, num_beams=2, max_new_tokens=4)


def test_drafter_for_another_target_is_refused(drafter):
    other = tiny_target(vocab_size=100)
    with pytest.raises(ValueError, match="vocabulary size 128.*100"):
        other.generate(prompt(5, vocab_size=100), assistant_model=drafter, max_new_tokens=4)


@pytest.mark.parametrize(
    ("field", "value"),
    [("tree_policy", "beam"), ("num_draft_nodes", 0), ("draft_depth", 100), ("draft_top_k", -1),
     ("head_mode", "sparse"), ("num_draft_nodes", 2.5)],
)
def test_impossible_generation_config_values(field, value):
    with pytest.raises(ValueError, match=field):
        DynaSpecGenerationConfig(**{field: value})


def test_misspelt_drafter_setting_is_refused(target):
    with pytest.raises(ValueError, match="'shortlist_schedul' \\(did you mean 'shortlist_schedule'\\?\\)"):
        DynaSpecDrafter.from_target(target, num_clusters=8, shortlist_schedul="linear")
    with pytest.raises(ValueError, match="'vocab_size'.*come from the target"):
        DynaSpecDrafter.from_target(target, num_clusters=8, vocab_size=64)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, shortlist_k0=4, cluster_iters=2)
    assert drafter.config.shortlist_k0 == 4


def test_shortlist_budget_above_cluster_count(target, drafter):
    config = DynaSpecGenerationConfig(shortlist_k0=99, max_new_tokens=4)
    with pytest.raises(ValueError, match="shortlist_k0=99 exceeds the drafter's 8 clusters"):
        target.generate(prompt(5), generation_config=config, assistant_model=drafter)


def test_output_attentions_is_refused(target, drafter):
    with pytest.raises(ValueError, match="output_attentions"):
        target.generate(prompt(5), assistant_model=drafter, max_new_tokens=4, output_attentions=True,
                        return_dict_in_generate=True)


def test_generation_config_json_round_trip(tmp_path):
    config = DynaSpecGenerationConfig(tree_policy="dyspec", num_draft_nodes=33, draft_depth=7, head_mode="full",
                                      max_new_tokens=5)
    config.save_pretrained(tmp_path)
    loaded = DynaSpecGenerationConfig.from_pretrained(tmp_path)
    assert loaded.speculative_fields() == config.speculative_fields()
    assert loaded.max_new_tokens == 5


def test_per_call_config_overrides_drafter_defaults():
    drafter_defaults = DynaSpecGenerationConfig(tree_policy="dyspec", num_draft_nodes=20, shortlist_k0=4)
    call = DynaSpecGenerationConfig(num_draft_nodes=7)
    settings = resolve_draft_settings(call, drafter_defaults, DynaSpecConfig(vocab_size=64, num_clusters=8))
    assert (settings.tree_policy, settings.num_draft_nodes, settings.shortlist_k0) == ("dyspec", 7, 4)


def test_generate_kwargs_reach_a_dynaspec_generation_config(target, drafter):
    # Extra speculative kwargs are accepted by generate() when a DynaSpecGenerationConfig is passed.
    config = DynaSpecGenerationConfig(max_new_tokens=6)
    out = target.generate(prompt(5), generation_config=config, assistant_model=drafter, tree_policy="chain",
                          return_dict_in_generate=True)
    # a chain holds at most draft_depth nodes (drafter default 5); the default eagle2 tree holds 12
    assert out.speculative_stats.mean_tree_size <= DEFAULT_SETTINGS["draft_depth"]
    assert out.sequences.shape[1] == 5 + 6


@pytest.mark.parametrize("how", ["plain-config", "kwargs"])
def test_dynaspec_settings_on_a_plain_config_or_as_kwargs_are_honoured(target, drafter, how):
    from transformers import GenerationConfig

    ids = prompt(5)
    if how == "plain-config":
        out = target.generate(ids, generation_config=GenerationConfig(tree_policy="chain", max_new_tokens=12,
                              return_dict_in_generate=True), assistant_model=drafter)
    else:
        out = target.generate(ids, assistant_model=drafter, tree_policy="chain", max_new_tokens=12,
                              return_dict_in_generate=True)
    # a chain holds at most draft_depth nodes (drafter default 5); the default eagle2 tree holds 12
    assert out.speculative_stats.mean_tree_size <= DEFAULT_SETTINGS["draft_depth"]
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=12))


def test_dynaspec_settings_without_a_drafter_are_refused(target):
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match=r"\['tree_policy'\] need a DynaSpec drafter"):
        target.generate(prompt(5), max_new_tokens=4, tree_policy="chain")
    with pytest.raises(ValueError, match="need a DynaSpec drafter"):
        target.generate(prompt(5), generation_config=GenerationConfig(draft_depth=3, max_new_tokens=4))


def test_invalid_settings_on_a_plain_config_are_validated(target, drafter):
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match="tree_policy must be one of"):
        target.generate(prompt(5), generation_config=GenerationConfig(tree_policy="beam", max_new_tokens=4),
                        assistant_model=drafter)

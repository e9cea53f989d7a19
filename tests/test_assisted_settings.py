"""transformers' assisted-generation settings with a DynaSpec drafter: each honoured, mapped or refused.

    python -m pytest tests/test_assisted_settings.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import greedy, prompt, speculative
from transformers import GenerationConfig

from hf_dynaspec import assisted_settings
from hf_dynaspec.assisted_settings import SETTINGS, assisted_path_fields, settings_markdown, undecided
from hf_dynaspec.generation.loop import decoding

# what a transformers user would pass, per refused setting (values that ask for something)
REFUSED_VALUES = {
    "use_cache": False, "assistant_early_exit": 2, "assistant_lookbehind": 5, "target_lookbehind": 5,
    "assistant_ensemble_weight": 0.5, "speculation_type": "dflash", "use_mtp": True, "is_assistant": True,
    "dola_layers": "high", "guidance_scale": 1.5, "prefill_chunk_size": 16, "cache_implementation": "static",
    "cache_config": {"offload": True}, "max_cache_len": 64, "compile_config": object(),
    "output_attentions": True, "output_hidden_states": True, "continuous_batching_config": object(),
}


@pytest.fixture
def resolved(monkeypatch):
    """The DraftSettings of each speculative call, as decoding resolved them."""
    seen = []
    original = decoding.resolve_draft_settings

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(decoding, "resolve_draft_settings", spy)
    return seen


def test_every_field_the_installed_assisted_path_reads_is_decided():
    fields = assisted_path_fields()
    assert {"num_assistant_tokens", "prompt_lookup_num_tokens", "assistant_early_exit"} <= fields  # the scan reads
    assert undecided(fields) == []
    assert set(GenerationConfig().to_dict()) - {"transformers_version", "_from_model_config"} <= set(SETTINGS)


def test_a_field_left_undecided_is_reported():
    table = {name: setting for name, setting in SETTINGS.items() if name != "assistant_lookbehind"}
    assert undecided(assisted_path_fields(), table) == ["assistant_lookbehind"]


def test_every_refused_setting_has_a_value_to_try():
    refused = {name for name, setting in SETTINGS.items() if setting.treatment == "refused"}
    assert refused == set(REFUSED_VALUES)


@pytest.mark.parametrize(("name", "value", "field", "expected"), [
    ("num_assistant_tokens", 2, "draft_depth", 2),
    ("num_assistant_tokens_schedule", "constant", "step_policy", "off"),
    ("num_assistant_tokens_schedule", "heuristic", "step_policy", "auto"),
    ("assistant_confidence_threshold", 0.05, "min_draft_prob", 0.05),
    ("prompt_lookup_num_tokens", 3, "lookup_num_tokens", 3),
    ("max_matching_ngram_size", 2, "lookup_max_ngram", 2),
])
def test_mapped_settings_reach_the_draft_settings_and_stay_exact(target, drafter, resolved, name, value, field,
                                                                 expected):
    ids = prompt()
    out = speculative(target, drafter, ids, max_new_tokens=12, **{name: value})
    assert getattr(resolved[-1], field) == expected
    assert torch.equal(out, greedy(target, ids, max_new_tokens=12))


def test_mapped_settings_from_a_generation_config(target, drafter, resolved):
    config = GenerationConfig(num_assistant_tokens=3, prompt_lookup_num_tokens=0, max_new_tokens=8, do_sample=False)
    target.generate(prompt(), generation_config=config, assistant_model=drafter)
    assert (resolved[-1].draft_depth, resolved[-1].lookup_num_tokens) == (3, 0)


def test_transformers_global_defaults_change_nothing(target, drafter, resolved):
    speculative(target, drafter, prompt(), max_new_tokens=6)
    default = resolved[-1]
    assert default.draft_depth != GenerationConfig._get_default_generation_params()["num_assistant_tokens"]
    assert default.min_draft_prob == 0.0  # not transformers' 0.4 threshold


def test_a_target_generation_config_setting_is_honoured(target, drafter, resolved, monkeypatch):
    monkeypatch.setattr(target.generation_config, "num_assistant_tokens", 1)
    speculative(target, drafter, prompt(), max_new_tokens=6)
    assert resolved[-1].draft_depth == 1


def test_a_mapped_setting_conflicting_with_its_dynaspec_setting_is_refused(target, drafter):
    with pytest.raises(ValueError, match=r"num_assistant_tokens=3 sets draft_depth=3 .* draft_depth=4: set one"):
        speculative(target, drafter, prompt(), max_new_tokens=4, num_assistant_tokens=3, draft_depth=4)
    speculative(target, drafter, prompt(), max_new_tokens=4, num_assistant_tokens=3, draft_depth=3)  # agreeing


def test_invalid_mapped_values_are_refused_with_the_range(target, drafter):
    with pytest.raises(ValueError, match="num_assistant_tokens_schedule must be one of"):
        speculative(target, drafter, prompt(), max_new_tokens=4, num_assistant_tokens_schedule="fast")
    with pytest.raises(ValueError, match=r"min_draft_prob must be a number in \[0, 1\)"):
        speculative(target, drafter, prompt(), max_new_tokens=4, assistant_confidence_threshold=1.0)


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_refused_settings_raise_saying_what_to_do(target, drafter, name):
    config = GenerationConfig(max_new_tokens=4, do_sample=False)
    setattr(config, name, REFUSED_VALUES[name])
    with pytest.raises(ValueError, match=rf"{name}=.* cannot apply with a DynaSpec drafter: .*(drop|use)"):
        assisted_settings.apply_assisted_settings(config, [name])


@pytest.mark.parametrize("kwargs", [dict(use_cache=False), dict(assistant_early_exit=1),
                                    dict(assistant_confidence_threshold=0.3, assistant_lookbehind=4)])
def test_refused_settings_raise_through_generate(target, drafter, kwargs):
    with pytest.raises(ValueError, match="cannot apply with a DynaSpec drafter"):
        speculative(target, drafter, prompt(), max_new_tokens=4, **kwargs)


def test_an_assistant_tokenizer_is_refused(target, drafter):
    with pytest.raises(ValueError, match="assistant_tokenizer=.*shares the target's"):
        speculative(target, drafter, prompt(), max_new_tokens=4, tokenizer=object(), assistant_tokenizer=object())


def test_inert_values_pass(target, drafter):
    ids = prompt()
    out = speculative(target, drafter, ids, max_new_tokens=6, use_cache=True, output_attentions=False)
    assert torch.equal(out, greedy(target, ids, max_new_tokens=6))


def test_docs_settings_holds_the_current_table():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    assert settings_markdown() in doc, "docs/settings.md is stale: run `make docs`"


def test_the_docs_table_lists_every_setting():
    table = settings_markdown()
    assert all(f"`{name}`" in table for name in SETTINGS)
    assert "| `num_assistant_tokens` (field) | sets `draft_depth` |" in table

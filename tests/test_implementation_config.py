"""Settings that choose how DynaSpec runs (not what it decides) live in one sub-object, `implementation=`; set flat,
their old home, they still load, with a FutureWarning.

    python -m pytest tests/test_implementation_config.py -q
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from helpers import greedy, prompt

from hf_dynaspec import DynaSpecGenerationConfig, ImplementationConfig
from hf_dynaspec.generation_config import IMPLEMENTATION_FIELDS, SPEC_FIELDS, resolve_draft_settings

DRAFTERS = Path(__file__).resolve().parents[1] / "drafters"


def resolved(config, drafter):
    return resolve_draft_settings(config, drafter.generation_config, drafter.config, "cpu")


def test_implementation_settings_are_not_flat_fields():
    assert not set(IMPLEMENTATION_FIELDS) & set(SPEC_FIELDS)
    assert set(IMPLEMENTATION_FIELDS) == set(ImplementationConfig().__dataclass_fields__)


@pytest.mark.parametrize("implementation", [ImplementationConfig(verify_head="rows", tree_growth="host"),
                                            {"verify_head": "rows", "tree_growth": "host"}])
def test_an_implementation_object_or_dict_sets_the_draft_settings(drafter, implementation):
    settings = resolved(DynaSpecGenerationConfig(implementation=implementation), drafter)
    assert (settings.verify_head, settings.tree_growth) == ("rows", "host")
    assert resolved(DynaSpecGenerationConfig(), drafter).verify_head == "auto"  # the automatic choice by default


def test_flat_settings_still_load_with_a_future_warning(drafter):
    with pytest.warns(FutureWarning, match=r"verify_head='rows' set flat is deprecated: pass implementation="):
        config = DynaSpecGenerationConfig(verify_head="rows")
    assert resolved(config, drafter).verify_head == "rows"


def test_a_setting_set_flat_and_in_implementation_otherwise_is_refused(drafter):
    with pytest.raises(ValueError, match="verify_head is set twice"), pytest.warns(FutureWarning):
        DynaSpecGenerationConfig(verify_head="rows", implementation={"verify_head": "columns"})


def test_unknown_implementation_keys_are_refused():
    with pytest.raises(ValueError, match="implementation= takes an ImplementationConfig or a dict with keys"):
        DynaSpecGenerationConfig(implementation={"head_mode": "full"})


def test_generate_takes_implementation_and_the_output_stays_exact(target, drafter):
    ids = prompt(7, seed=2)
    out = target.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=12,
                          implementation={"verify_head": "columns"})
    assert torch.equal(out, greedy(target, ids, max_new_tokens=12))
    with pytest.warns(FutureWarning, match="set flat is deprecated"):
        flat = target.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=12, verify_head="columns")
    assert torch.equal(flat, out)


def test_a_config_round_trips_through_json(tmp_path):
    DynaSpecGenerationConfig(implementation=ImplementationConfig(tree_growth="device")).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        loaded = DynaSpecGenerationConfig.from_pretrained(tmp_path)
    assert loaded.implementation == {"tree_growth": "device"}


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_the_shipped_drafters_load_without_a_warning(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config = DynaSpecGenerationConfig.from_pretrained(DRAFTERS / name)
    assert config.implementation is not None

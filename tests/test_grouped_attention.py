"""Grouped key / value heads read in place during a tree verification on a CPU (`grouped_attention`): the same
logits as transformers' SDPA path bit for bit, without its per-group copy of the cache, the user's attention
setting restored after each forward (an error inside included), and nothing changed for a model without grouped
heads or on another attention implementation."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import greedy, load_benchmark_script, prompt, speculative, tiny_drafter, tiny_target
from transformers import DynamicCache
from transformers.integrations import sdpa_attention

from hf_dynaspec.generation.verification.grouped_attention import GQA_SDPA, gqa_configs, grouped_attention
from hf_dynaspec.masks import causal_mask


def tree_step(model, n: int = 4, past: int = 9):
    """Logits (1, n, V) of `n` masked queries over a cache of `past` tokens, as a verification runs them."""
    generator = torch.Generator().manual_seed(n)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 128, (1, past), generator=generator), cache=cache, use_cache=True)
        out = model(input_ids=torch.randint(3, 128, (1, n), generator=generator), cache=cache, use_cache=True,
                    position_ids=torch.arange(past, past + n)[None],
                    attention_mask=causal_mask(n, past, torch.float32, "cpu"))
    return out.logits


def test_grouped_heads_read_in_place_give_the_same_logits_without_copying_the_cache(monkeypatch):
    model = tiny_target()
    expected = tree_step(model)
    configs = gqa_configs(model)
    assert configs == (model.config,)

    def no_copy(*args, **kwargs):
        raise AssertionError("repeat_kv copied the grouped heads")

    monkeypatch.setattr(sdpa_attention, "repeat_kv", no_copy)
    with pytest.raises(AssertionError, match="repeat_kv"):
        tree_step(model)  # transformers' own path copies them
    with grouped_attention(configs):
        assert model.config._attn_implementation == GQA_SDPA
        got = tree_step(model)
    assert torch.equal(got, expected)
    assert model.config._attn_implementation == "sdpa"


def test_the_users_attention_setting_is_restored_after_an_error():
    model = tiny_target()
    with pytest.raises(RuntimeError, match="inside"), grouped_attention(gqa_configs(model)):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("overrides", [{"num_key_value_heads": 4}, {"attn_implementation": "eager"}])
def test_nothing_changes_without_grouped_heads_or_sdpa(overrides):
    assert gqa_configs(tiny_target(**overrides)) == ()


def test_speculative_greedy_stays_plain_greedy_over_grouped_heads(one_thread):
    target = tiny_target(num_attention_heads=8, num_key_value_heads=2)
    drafter = tiny_drafter(target).bind(target)
    ids = prompt(12)
    assert torch.equal(speculative(target, drafter, ids, max_new_tokens=24), greedy(target, ids, max_new_tokens=24))
    assert target.config._attn_implementation == "sdpa"


def test_the_benchmark_times_both_paths_and_reports_each_shape(tmp_path, monkeypatch, one_thread):
    bench = load_benchmark_script("bench_grouped_attention")
    monkeypatch.setattr("sys.argv", ["bench_grouped_attention.py", "--target", "tiny", "--contexts", "8", "16",
                                     "--nodes", "2", "--repeats", "2", "--threads", "1", "--out", str(tmp_path)])
    bench.main()
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["context"], r["n"]) for r in rows] == [(8, 2), (16, 2)]
    assert all(r["copied"] > 0 and r["in_place"] > 0 for r in rows)
    assert "| 16 | 2 |" in (tmp_path / "results.md").read_text()

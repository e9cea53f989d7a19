"""Verification computes LM-head rows only along the walk when that is exact, and all rows otherwise."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt
from transformers import Gemma2Config, Gemma2ForCausalLM

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation import decoding, verify
from hf_dynaspec.generation.verify import head_reproduces_logits


def final_hidden_and_logits(model, ids):
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    return out.hidden_states[-1][0, -1:], out.logits[0, -1:]


def test_plain_head_reproduces_logits(target):
    assert head_reproduces_logits(target, *final_hidden_and_logits(target, prompt(5)))


def test_soft_capped_logits_are_detected():
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5)
    model = Gemma2ForCausalLM(config).eval()
    assert not head_reproduces_logits(model, *final_hidden_and_logits(model, prompt(5, vocab_size=64)))


@pytest.mark.parametrize("walk_logits", [True, False])
def test_both_logit_paths_are_exact(target, drafter, walk_logits, monkeypatch):
    on_demand = []
    original = verify.NodeLogits.row

    def counting_row(self, node):
        on_demand.append(node not in self.rows)
        return original(self, node)

    monkeypatch.setattr(decoding, "head_reproduces_logits", lambda *args: walk_logits)
    monkeypatch.setattr(verify.NodeLogits, "row", counting_row)
    ids = prompt(7, seed=4)
    config = DynaSpecGenerationConfig(tree_policy="eagle2", num_draft_nodes=10, draft_depth=4, draft_top_k=3,
                                      max_new_tokens=30, do_sample=False, return_dict_in_generate=True)
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=30))
    stats = out.speculative_stats
    assert len(on_demand) == sum(stats.accepted_lengths)  # the walk reads one row per emitted token
    # walking: the root's row comes from the forward pass, every other row on demand; else all precomputed
    assert sum(on_demand) == (sum(stats.accepted_lengths) - stats.num_steps if walk_logits else 0)

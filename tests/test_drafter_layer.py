"""The drafter layer's MLP: new drafters use silu (what EAGLE-3 servers take) whatever the target's activation, a
width of their own when asked, older checkpoints keep the target's; an export of a layer no server takes is
refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from helpers import greedy, prompt, speculative, tiny_drafter
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter
from hf_dynaspec.checkpoints import load_eagle3
from hf_dynaspec.interchange import export_eagle3


def tiny_gemma3(vocab_size: int = 96, layers: int = 2) -> Gemma3ForCausalLM:
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, bos_token_id=0,
                              eos_token_id=None, pad_token_id=None, max_position_embeddings=512,
                              layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                              sliding_window=16)
    return Gemma3ForCausalLM(config).eval()


def test_a_new_drafter_uses_silu_whatever_the_target_uses():
    target = tiny_gemma3()
    assert target.config.hidden_activation == "gelu_pytorch_tanh"
    drafter = tiny_drafter(target)
    assert drafter.config.layer_hidden_act == "silu"
    assert drafter.config.build_layer_config().hidden_act == "silu"


def test_a_drafter_saved_before_the_field_keeps_the_targets_activation():
    target = tiny_gemma3()
    fields = DynaSpecConfig.from_target_config(target.config, num_clusters=8).to_dict()
    fields.pop("layer_hidden_act")  # as configs written before the field existed
    old = DynaSpecConfig(**{k: v for k, v in fields.items() if k != "model_type"})
    assert old.layer_hidden_act is None
    assert old.build_layer_config().hidden_act == "gelu_pytorch_tanh"


def test_layer_width_and_activation_are_settable_and_stay_exact():
    target = tiny_gemma3()
    drafter = tiny_drafter(target, layer_intermediate_size=48, layer_hidden_act="gelu")
    assert drafter.layer.mlp.up_proj.out_features == 48
    ids = prompt(vocab_size=96)
    assert torch.equal(speculative(target, drafter, ids, max_new_tokens=12), greedy(target, ids, max_new_tokens=12))


@pytest.mark.parametrize("fields, message", [
    ({"layer_hidden_act": "swoosh"}, "activation name"),
    ({"layer_intermediate_size": 0}, "positive integer"),
])
def test_bad_layer_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        DynaSpecConfig(vocab_size=64, hidden_size=32, num_clusters=4, layer_family="llama", **fields)


def test_layer_settings_need_the_llama_layer():
    with pytest.raises(ValueError, match="layer_family"):
        DynaSpecConfig(vocab_size=64, hidden_size=32, num_clusters=4, target_model_type="gemma3_text",
                       layer_family="gemma3_text", layer_intermediate_size=16)


def test_export_refuses_an_activation_servers_refuse_before_writing(tmp_path):
    target = tiny_gemma3()
    drafter = tiny_drafter(target, layer_hidden_act="gelu_pytorch_tanh")
    out = tmp_path / "export"
    with pytest.raises(ValueError, match="Only silu|only 'silu'"):
        export_eagle3(drafter, target, out)
    assert not out.exists()


def test_export_and_load_keep_a_wider_silu_layer(tmp_path):
    target = tiny_gemma3(layers=8)  # EAGLE-3 servers fuse 3 distinct layers: (2, 4, 5)
    drafter = tiny_drafter(target, layer_intermediate_size=80)
    drafter.set_static_shortlist(torch.arange(40))
    loaded = load_eagle3(export_eagle3(drafter, target, tmp_path / "e"), target, num_clusters=8)
    assert isinstance(loaded, DynaSpecDrafter)
    assert loaded.config.layer_intermediate_size == 80 and loaded.config.layer_hidden_act == "silu"
    for name in ("fc.weight", "layer.mlp.up_proj.weight", "layer.mlp.down_proj.weight"):
        assert torch.equal(loaded.state_dict()[name], drafter.state_dict()[name].to(loaded.fc.weight.dtype))

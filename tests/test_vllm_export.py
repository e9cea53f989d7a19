"""The vllm-dynaspec export (hf_dynaspec/vllm_export.py): the EAGLE-3 folder vLLM runs with the DynaSpec plugin.
What it holds (no lm_head, the router and the clusters, the head's settings) and that the head rebuilt from it
scores what the drafter's own head scores."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_drafter, tiny_target
from safetensors import safe_open

from hf_dynaspec import cli
from hf_dynaspec.vllm_export import ARCHITECTURE, export_vllm_dynaspec, read_head


@pytest.fixture(scope="module")
def target():
    return tiny_target(eos_token_id=2, num_hidden_layers=8)  # EAGLE-3 servers fuse 3 distinct layers: (2, 4, 5)


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(1)
    d = tiny_drafter(target)
    with torch.no_grad():  # a router that is not all zeros
        for p in d.router.parameters():
            p.normal_(0, 0.5)
    return d


@pytest.fixture(scope="module")
def folder(target, drafter, tmp_path_factory):
    return export_vllm_dynaspec(drafter, target, tmp_path_factory.mktemp("vllm-dynaspec"))


def test_folder_holds_the_layer_router_and_clusters_but_no_head(folder, drafter):
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["model_type"] == "llama"
    assert config["draft_vocab_size"] == config["vocab_size"] == 128
    assert config["dynaspec"]["num_clusters"] == 8 and config["dynaspec"]["always_include_ids"] == [2]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    with safe_open(folder / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "norm.weight", "router.up.weight", "router.down.bias", "cluster_permutation",
            "cluster_offsets"} <= names
    assert any(n.startswith("midlayer.") for n in names)
    assert not {n for n in names if "lm_head" in n or "embed_tokens" in n or n in ("d2t", "t2d")}


def test_rebuilt_head_scores_what_the_drafters_head_scores(folder, drafter, target):
    head, router, settings = read_head(folder, target.lm_head.weight)
    generator = torch.Generator().manual_seed(0)
    router_input = torch.randn(4, drafter.router.up.in_features, generator=generator)
    features = torch.randn(4, drafter.config.hidden_size, generator=generator)
    with torch.no_grad():
        router_logits = router(router_input)
        torch.testing.assert_close(router_logits, drafter.router(router_input))
        ours = head.logits(features, "dynamic", router_logits, settings["shortlist_k0"]).to_vocab(128)
        theirs = drafter.bound_head.logits(features, "dynamic", router_logits, settings["shortlist_k0"]).to_vocab(128)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])


def test_cli_writes_it_and_refuses_a_static_vocabulary(tmp_path, drafter, target, capsys, monkeypatch):
    drafter.save_pretrained(tmp_path / "d")
    monkeypatch.setattr(cli, "target_from_args", lambda args: (target, None))
    assert cli.main(["export", str(tmp_path / "d"), str(tmp_path / "e"), "--format", "vllm-dynaspec"]) == 0
    assert json.loads((tmp_path / "e" / "config.json").read_text())["architectures"] == [ARCHITECTURE]
    assert cli.main(["export", str(tmp_path / "d"), str(tmp_path / "f"), "--format", "vllm-dynaspec",
                     "--draft-vocab-size", "64"]) == 1
    assert "drop --draft-vocab-size" in capsys.readouterr().err
    assert json.loads((tmp_path / "e" / "config.json").read_text())["dynaspec"]["max_union_tokens"] is None
    assert cli.main(["export", str(tmp_path / "d"), str(tmp_path / "g"), "--format", "vllm-dynaspec",
                     "--max-union-tokens", "48"]) == 0
    assert json.loads((tmp_path / "g" / "config.json").read_text())["dynaspec"]["max_union_tokens"] == 48
    assert cli.main(["export", str(tmp_path / "d"), str(tmp_path / "h"), "--max-union-tokens", "48"]) == 1
    assert "needs --format vllm-dynaspec" in capsys.readouterr().err


def test_a_folder_without_settings_is_refused(tmp_path, target):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="vllm-dynaspec export"):
        read_head(tmp_path, target.lm_head.weight)

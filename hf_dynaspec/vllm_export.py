"""The "vllm-dynaspec" export: an EAGLE-3 draft folder that vLLM runs with the DynaSpec plugin, its dynamic head
included (docs/vllm-plugin.md has the design, read from vLLM 0.32's sources).

The folder is the EAGLE-3 layout of `interchange.export_eagle3` with three differences:
    architectures       ["Eagle3DynaSpecLlamaForCausalLM"] (vLLM prefixes "Eagle3" to any other name; the plugin
                        registers this one, a subclass of vLLM's Eagle3LlamaForCausalLM)
    draft_vocab_size    the target's whole vocabulary, no lm_head / d2t / t2d: the plugin scores the router's
                        clusters of the target's own LM head (vLLM shares it with a draft that has none) and
                        returns full-vocabulary logits, -inf outside the shortlist, as vLLM's proposer expects
    "dynaspec"          the head's settings (clusters, budgets k0 -> k1 over the chain's depths, always-included
                        ids, the target's logit soft-cap, `max_union_tokens`: the most tokens one draft step of a
                        batch scores, null for no limit), and the tensors router.{up,down}.{weight,bias},
                        cluster_permutation, cluster_offsets in model.safetensors
`read_head` rebuilds the shortlisted head from a folder and the target's LM-head weight: the plugin's and the
tests' one way in, so what the folder holds is what scores drafts.

    python -c "
    from transformers import LlamaConfig, LlamaForCausalLM; from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.vllm_export import export_vllm_dynaspec, read_head
    t = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2))
    out = export_vllm_dynaspec(DynaSpecDrafter.from_target(t, num_clusters=8), t, '/tmp/dynaspec-draft')
    print(read_head(out, t.lm_head.weight).clusters.num_clusters)"
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import PreTrainedModel

from .clustering import OFFSETS_KEY, PERMUTATION_KEY, VocabClusters
from .head import LogitTransform, ShortlistHead
from .interchange import LAYER_PREFIX, WEIGHTS, eagle3_config, export_tensors, servable_layer
from .modeling import DynaSpecDrafter
from .router import ClusterRouter, check_max_union_tokens

ARCHITECTURE = "Eagle3DynaSpecLlamaForCausalLM"
ROUTER = ("router.up.weight", "router.up.bias", "router.down.weight", "router.down.bias")
CLUSTERS = ("cluster_permutation", "cluster_offsets")


def dynaspec_settings(drafter: DynaSpecDrafter, target: PreTrainedModel) -> dict[str, Any]:
    """The head's settings the plugin reads (config.json's "dynaspec")."""
    config, transform = drafter.config, LogitTransform.of(target.config)
    return {
        "num_clusters": config.num_clusters,
        "router_hidden_size": config.router_hidden_size,
        "router_input_size": drafter.router.up.in_features,
        "shortlist_k0": config.shortlist_k0,
        "shortlist_k1": config.shortlist_k1,
        "shortlist_schedule": config.shortlist_schedule,
        "always_include_ids": sorted(int(i) for i in config.always_include_ids),
        "logit_scale": transform.scale,
        "logit_softcap": transform.softcap,
    }


def export_vllm_dynaspec(drafter: DynaSpecDrafter, target: PreTrainedModel, out_dir: str | os.PathLike,
                         max_union_tokens: int | None = None) -> Path:
    """Write `drafter` (EAGLE-3 architecture, bound to `target`) as a vllm-dynaspec folder (module docstring).
    max_union_tokens: the most tokens the union of a batch's shortlists may hold in one draft step (the plugin
    keeps each request's best clusters first, `router.within_union_limit`); None: no limit."""
    check_max_union_tokens(max_union_tokens)
    if not drafter.is_eagle3:
        raise ValueError("Only drafter_architecture='eagle3' drafters have a vLLM EAGLE-3 equivalent.")
    drafter.check_target(target)
    servable_layer(drafter)  # refused before anything is written
    vocab = drafter.config.vocab_size
    config = eagle3_config(drafter, target, vocab) | {"architectures": [ARCHITECTURE]}
    config["dynaspec"] = {"exported_from": "hf_dynaspec", "target_name_or_path": drafter.config.target_name_or_path,
                          **dynaspec_settings(drafter, target), "max_union_tokens": max_union_tokens}
    tensors = export_tensors(drafter, target, torch.arange(vocab), LAYER_PREFIX["eagle3"])
    tensors.pop("lm_head.weight")  # the target's own head is shared (every id: no d2t / t2d either)
    state = drafter.state_dict()
    tensors |= {name: state[name].detach().cpu().contiguous() for name in (*ROUTER, *CLUSTERS)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / WEIGHTS, {"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_head(folder: str | os.PathLike, lm_head_weight: torch.Tensor) -> tuple[ShortlistHead, ClusterRouter, dict]:
    """(the shortlisted head over `lm_head_weight` (V, d), the router, the settings) of a vllm-dynaspec folder."""
    folder = Path(folder)
    settings = json.loads((folder / "config.json").read_text()).get("dynaspec")
    if not settings or "num_clusters" not in settings:
        raise ValueError(f"{folder} is not a vllm-dynaspec export (no 'dynaspec' settings in its config.json): "
                         "write one with `hf-dynaspec export DRAFTER OUT --format vllm-dynaspec`.")
    with safe_open(folder / WEIGHTS, "pt") as f:
        tensors = {name: f.get_tensor(name) for name in (*ROUTER, *CLUSTERS)}
    head, router = head_from_tensors(tensors, settings, lm_head_weight)
    return head, router, settings


def head_from_tensors(
    tensors: dict[str, torch.Tensor], settings: dict, lm_head_weight: torch.Tensor
) -> tuple[ShortlistHead, ClusterRouter]:
    """(the shortlisted head over `lm_head_weight` (V, d), the router) from a folder's router and cluster tensors
    (`ROUTER`, `CLUSTERS`) and its "dynaspec" settings."""
    clusters = VocabClusters.from_tensors({PERMUTATION_KEY: tensors["cluster_permutation"],
                                           OFFSETS_KEY: tensors["cluster_offsets"]})
    router = ClusterRouter(settings["router_input_size"], settings["router_hidden_size"], settings["num_clusters"])
    router.load_state_dict({name.removeprefix("router."): tensors[name] for name in ROUTER})
    transform = LogitTransform(scale=settings["logit_scale"], softcap=settings["logit_softcap"])
    head = ShortlistHead(lm_head_weight, clusters.to(lm_head_weight.device), settings["always_include_ids"], None,
                         transform)
    return head, router.to(lm_head_weight.device, lm_head_weight.dtype)

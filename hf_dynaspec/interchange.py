"""EAGLE-3 checkpoint interchange: export a DynaSpec EAGLE-3 drafter as a vLLM / SGLang draft model, and load such a
checkpoint (ours, the EAGLE authors' layout converted to safetensors, SpecForge's or vLLM speculators') back into a
`DynaSpecDrafter` whose static head is the checkpoint's draft vocabulary.

    python -c "
    from transformers import LlamaConfig, LlamaForCausalLM; from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.interchange import export_eagle3, load_eagle3
    t = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2))
    d = DynaSpecDrafter.from_target(t, num_clusters=8); d.set_static_shortlist(list(range(3, 60)))
    export_eagle3(d, t, '/tmp/eagle3-draft', draft_vocab_size=64)
    print(load_eagle3('/tmp/eagle3-draft', t, num_clusters=8).static_token_ids.numel())"

What an exported folder holds (config.json + model.safetensors, nothing pickled):
    fc.weight        (d, 3d)    the fused target layers, blocks in ascending layer order (the order servers concatenate)
    midlayer.*                  the decoder layer (`layers.0.*` in the speculators layout); q/k/v_proj are (·, 2d)
    norm.weight      (d,)
    lm_head.weight   (N, d)     the target's LM-head rows of the N-token draft vocabulary (ascending ids)
    d2t              (N,) int64 target id of draft index i minus i (EAGLE-3's definition: target = i + d2t[i])
    t2d              (V,) bool  membership of each target id in the draft vocabulary
The embeddings are not written: both servers borrow the target's when the draft has none.

Checked against (file @ commit):
- vLLM vllm/model_executor/models/llama_eagle3.py @ 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190 (and the older
  583507d13075783a12ccbd774575974d10ca4959): `midlayer.` -> `layers.0.`, every name but lm_head gets `model.`, `d2t`
  -> `draft_id_to_target_id` with target = arange(draft_vocab_size) + d2t, `t2d` skipped, fc in = 3 *
  target_hidden_size (no bias), lm_head (draft_vocab_size, hidden_size), logits * `logit_scale`, q/k/v read
  [input_layernorm(embed); hidden_norm(h)], residual = h unless `norm_before_residual`, the next step reads the
  pre-norm output. vllm/model_executor/models/registry.py @ 0002bff0b6cb36a3c8a17364de3303664463c412:
  "LlamaForCausalLMEagle3" -> Eagle3LlamaForCausalLM. vllm/v1/worker/gpu/spec_decode/eagle/utils.py @
  055e47c28003156421365af985d676fc921cb075: the target's embed_tokens are shared when the draft has none.
- vLLM speculators format: vllm/transformers_utils/configs/speculators/algos.py @
  cfb173ab8e1b8e44dd35f8b5188255b6a03e13ec (`transformer_layer_config` is the layer config; top-level
  draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids, and norm_before_residual, read as TRUE
  when absent) and base.py @ 052316aeab2a1b2a9076518f20fe776052b947c9 (speculators_config.proposal_methods[0].
  speculative_tokens, verifier.name_or_path); vllm-project/speculators src/speculators/models/eagle3/core.py @
  033c87f2390373b1f0fec7fbc3e29a75dc97f274 (weights fc, layers.0.*, norm, lm_head, d2t, t2d).
- Layer ids. vLLM (gpu_model_runner `_get_eagle3_aux_layers_from_config`: the top-level
  `eagle_aux_hidden_state_layer_ids` first, then eagle_config's) captures the hidden state ENTERING layer i
  (`hidden_states + residual` before layer i), i.e. HF `output_hidden_states[i]`: our indices as they are.
  SGLang python/sglang/srt/models/llama.py @ 00239548f1cd1a06ca145a5447a86738090a48f1 reads only
  eagle_config["eagle_aux_hidden_state_layer_ids"] as "output of layer i" and captures before layer i + 1, so it
  gets HF index i + 1 (sgl-project/sglang PR #25454 later adds 1 only when the first id is 1). With no ids, both
  default to (2, L // 2, L - 3) entering-layer indices, as the EAGLE authors' target code does. So we write the
  top-level key in HF / vLLM indices and eagle_config's as those minus one (exact for SGLang before #25454, and
  after it whenever the first index is 2, the default). HF index L (the final NORMED state) has no server
  equivalent and is refused.
- SGLang python/sglang/srt/models/llama_eagle3.py @ d737979cbd17c6162f39c1953cfa72d3d23cc0d0 (LlamaForCausalLMEagle3):
  loads fc.*, midlayer.*, norm.*, lm_head.* (unknown names are skipped silently, hence `midlayer.` here), q/k/v
  without bias, hot_token_id = d2t + arange; python/sglang/srt/speculative/eagle_worker.py @
  00559eacbf0841146db7e27e445d1971e35e6294 ignores `--speculative-token-map` for EAGLE-3 ("EAGLE3 models already
  have this") and shares the target's embeddings. The token map itself (spec_utils.load_token_map) is read with
  `torch.load(weights_only=True)`, a pickle: no token-map file is written, d2t carries the hot tokens.
- SafeAILab/EAGLE eagle/traineagle3/cnets.py @ 09fe6a050421cc4dfb1e3f4dfbe4f65aa9b9f63c: d2t = sorted used tokens
  minus arange, t2d a (V,) bool mask, fc without bias, `midlayer` names; its releases ship pytorch_model.bin, which
  `load_eagle3` refuses (convert it to safetensors first).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, PreTrainedModel

from .configuration import SERVED_ACTIVATION, DynaSpecConfig, eagle3_layer_ids
from .head import LogitTransform
from .modeling import DynaSpecDrafter
from .router import select_clusters
from .training.data import load_dataset
from .training.trainer import check_data_layers

# SGLang's class name; vLLM's registry maps it to Eagle3LlamaForCausalLM
ARCHITECTURE = "LlamaForCausalLMEagle3"
FORMATS = ("eagle3", "speculators")
DEFAULT_DRAFT_VOCAB = 32768  # draft tokens chosen from counts when no size is given (FR-Spec's usual size)
LAYER_PREFIX = {"eagle3": "midlayer.", "speculators": "layers.0."}
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
NUM_FUSED_LAYERS = 3  # both servers build fc with 3 * target_hidden_size inputs
LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")


# ---------------------------------------------------------------------------------------------- draft vocabulary


@torch.no_grad()
def shortlist_token_counts(
    drafter: DynaSpecDrafter,
    target_features: torch.Tensor,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    num_clusters: int | None = None,
) -> torch.Tensor:
    """How often each token is in the drafter's dynamic (first draft step) shortlist over some data: (V,) int64.

    target_features: (B, T, k d) `drafter.target_features(target(..., output_hidden_states=True).hidden_states)`;
    tokens: (B, T) the token each position reads (the next token); attention_mask: (B, T), 0 where padding;
    num_clusters: clusters per position (default `config.shortlist_k0`). The EOS ids count at every position.
    Counts add up: call it on chunks of a corpus and sum.
    """
    k = num_clusters if num_clusters is not None else drafter.config.shortlist_k0
    hidden = drafter.project(target_features)  # (B, T, d)
    out = drafter(input_ids=tokens.to(hidden.device), hidden_states=hidden, head_mode=None)
    router_logits = out.router_logits.flatten(0, 1)  # (B T, M)
    if attention_mask is not None:
        router_logits = router_logits[attention_mask.flatten().to(router_logits.device).bool()]
    selected = select_clusters(router_logits.float(), k)  # (N, M)
    per_cluster = selected.sum(dim=0).cpu()  # (M,)
    counts = per_cluster[drafter.clusters.cluster_of_token]  # (V,)
    counts[drafter.config.always_include_ids] = selected.shape[0]
    return counts.to(torch.int64)


@torch.no_grad()
def shortlist_counts_on_data(drafter: DynaSpecDrafter, data_dirs: list[str], max_positions: int = 200_000) -> torch.Tensor:
    """`shortlist_token_counts` summed over the conversations of feature folders (`hf-dynaspec features`), up to
    `max_positions` positions: (V,) int64."""
    counts = torch.zeros(drafter.config.vocab_size, dtype=torch.int64)
    positions = 0
    for conv in (c for folder in data_dirs for c in load_dataset(folder)):
        check_data_layers([conv], drafter.config.feature_layer_ids)
        features = conv.features[None].to(drafter.fc.weight.dtype)  # (1, L - 1, k d)
        counts += shortlist_token_counts(drafter, features, conv.input_ids[None, 1:])
        positions += conv.input_ids.numel() - 1
        if positions >= max_positions:
            break
    if positions == 0:
        raise ValueError(f"{data_dirs} hold no conversations to count shortlists on.")
    return counts


def draft_vocabulary(
    drafter: DynaSpecDrafter, draft_vocab_size: int | None = None, token_counts: torch.Tensor | None = None
) -> torch.Tensor:
    """(N,) ascending target ids, the EOS ids always in. With `token_counts` (V,): the `draft_vocab_size` (default
    `DEFAULT_DRAFT_VOCAB`) most frequent tokens (ties: lower id). Without: the drafter's static shortlist (ranked,
    most frequent first), all of it or its first `draft_vocab_size` tokens. `draft_vocab_size` = the vocabulary:
    every id (the full head, for comparisons)."""
    vocab_size = drafter.config.vocab_size
    if draft_vocab_size == vocab_size:
        return torch.arange(vocab_size)
    eos = torch.tensor(sorted(set(drafter.config.always_include_ids)), dtype=torch.long)  # (E,), E may be 0
    if token_counts is None:
        if drafter.static_token_ids.numel() == 0:
            raise ValueError(
                "export_eagle3 needs `token_counts` (e.g. `shortlist_token_counts(drafter, features, tokens)`) or a "
                "drafter with a static shortlist (`drafter.set_static_shortlist(ids)`) to choose the draft vocabulary."
            )
        ranked = drafter.static_token_ids.cpu()
        available = int(torch.cat([ranked, eos]).unique().numel())
        size = available if draft_vocab_size is None else draft_vocab_size
        if size > available:
            raise ValueError(
                f"draft_vocab_size={size}, but the drafter's static shortlist holds {available} tokens (EOS "
                f"included): pass a size up to {available}, or token counts to choose more (`hf-dynaspec export "
                "--data FEATURES`: the tokens the drafter's dynamic shortlists held most often there)."
            )
        order = ranked
    else:
        if token_counts.shape != (vocab_size,):
            raise ValueError(f"token_counts must be a ({vocab_size},) tensor, got shape {tuple(token_counts.shape)}.")
        size = DEFAULT_DRAFT_VOCAB if draft_vocab_size is None else draft_vocab_size
        if size > vocab_size:
            raise ValueError(f"draft_vocab_size must be at most the vocabulary, {vocab_size}, got {size}.")
        order = torch.argsort(-token_counts.cpu().to(torch.float64), stable=True)  # most frequent first
    if size < eos.numel():
        raise ValueError(f"draft_vocab_size must hold at least the {eos.numel()} EOS ids, got {size}.")
    rest = order[~torch.isin(order, eos)][: size - eos.numel()]
    return torch.cat([rest, eos]).sort().values


def vocabulary_maps(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3's maps of an ascending draft vocabulary (N,): d2t (N,) int64 = id - arange, t2d (V,) bool."""
    d2t = draft_ids.to(torch.int64) - torch.arange(draft_ids.numel(), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d


# ---------------------------------------------------------------------------------------------- layer ids


def server_layer_ids(drafter: DynaSpecDrafter) -> tuple[list[int], list[int]]:
    """(ascending HF hidden-state indices = vLLM's aux layer ids, the order of the drafter's fc blocks that puts
    them in that order). Servers capture each listed layer once, in layer order, below the final norm."""
    ids = list(drafter.config.target_layer_ids)
    num_layers = int(drafter.config.target_config.get("num_hidden_layers") or 0)
    if len(ids) != NUM_FUSED_LAYERS or len(set(ids)) != len(ids):
        raise ValueError(
            f"target_layer_ids {ids}: vLLM and SGLang fuse exactly {NUM_FUSED_LAYERS} distinct target layers "
            f"(fc is 3 d wide); a target with {num_layers} layers needs at least 8 for the default (2, L//2, L-3)."
        )
    if not all(1 <= i < num_layers for i in ids):
        raise ValueError(
            f"target_layer_ids {ids} must lie in [1, {num_layers - 1}]: index 0 (the embeddings) and {num_layers} "
            "(the final normed state) have no vLLM / SGLang equivalent."
        )
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return [ids[j] for j in order], order


def sglang_layer_ids(hf_ids: list[int]) -> list[int]:
    """SGLang's eagle_config ids ("output of layer i", captured before layer i + 1) for HF indices."""
    if hf_ids[0] != 2:
        warnings.warn(
            f"Target layers {hf_ids} are written for SGLang as {[i - 1 for i in hf_ids]}: exact for SGLang before "
            "PR #25454; later versions read ids whose first entry is not 1 as they are (one layer off).",
            stacklevel=3,
        )
    return [i - 1 for i in hf_ids]


def layer_ids_from_config(spec: dict[str, Any], num_layers: int) -> list[int]:
    """HF indices of a checkpoint's fused layers: top-level ids (vLLM convention) first, else eagle_config's
    (SGLang: +1 when the first id is 1, as SGLang reads them since PR #25454), else the servers' default."""
    top, nested = spec.get("eagle_aux_hidden_state_layer_ids"), spec.get("sglang_layer_ids")
    if top:
        ids = [int(i) for i in top]
    elif nested:
        ids = [int(i) + (1 if int(nested[0]) == 1 else 0) for i in nested]
    else:
        ids = eagle3_layer_ids(num_layers)
    if len(set(ids)) != len(ids) or not all(0 <= i < num_layers for i in ids):
        raise ValueError(
            f"eagle_aux_hidden_state_layer_ids {ids} (as HF hidden-state indices) must be distinct and in "
            f"[0, {num_layers - 1}] for a {num_layers}-layer target ({num_layers}, the last layer's un-normed "
            "output in recent vLLM, is not a hidden state the drafter reads)."
        )
    return sorted(ids)  # servers concatenate in layer order


# ---------------------------------------------------------------------------------------------- export


def servable_layer(drafter: DynaSpecDrafter) -> LlamaConfig:
    """The drafter layer's config, or `ValueError` saying what the EAGLE-3 servers would refuse in it."""
    layer = drafter.config.build_layer_config()
    if layer.attention_bias or getattr(layer, "mlp_bias", False):
        raise ValueError("The drafter layer has biases: SGLang's EAGLE-3 loader builds q/k/v without bias.")
    if layer.hidden_act != SERVED_ACTIVATION:
        raise ValueError(
            f"The drafter layer's MLP uses {layer.hidden_act!r}; vLLM's EAGLE-3 layer takes only "
            f"{SERVED_ACTIVATION!r} (it refuses the folder with 'Only silu is supported for now'). Drafters built "
            f"by `hf-dynaspec init` use {SERVED_ACTIVATION!r}: retrain this one from such an init to export it."
        )
    return layer


def layer_config_fields(drafter: DynaSpecDrafter, vocab_size: int) -> dict[str, Any]:
    """The Llama config keys both servers read for the draft layer (legacy rope keys and `rope_parameters`)."""
    layer = servable_layer(drafter)
    rope = dict(layer.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    dtype = str(drafter.fc.weight.dtype).removeprefix("torch.")
    fields = {name: getattr(layer, name) for name in LAYER_FIELDS}
    return fields | dict(
        model_type="llama",
        num_hidden_layers=1,
        hidden_act=layer.hidden_act,
        rms_norm_eps=layer.rms_norm_eps,
        max_position_embeddings=layer.max_position_embeddings,
        rope_theta=rope.get("rope_theta", 10000.0),
        rope_scaling=None if scaling.get("rope_type", "default") == "default" else scaling,
        rope_parameters=rope,
        attention_bias=False,
        mlp_bias=False,
        vocab_size=vocab_size,
        tie_word_embeddings=False,
        torch_dtype=dtype,
        bos_token_id=drafter.config.bos_token_id,
        eos_token_id=drafter.config.eos_token_id,
        pad_token_id=drafter.config.pad_token_id,
    )


def eagle3_config(drafter: DynaSpecDrafter, target: PreTrainedModel, draft_vocab_size: int) -> dict[str, Any]:
    """config.json of the EAGLE-3 layout (vLLM `--speculative-config` model, SGLang `--speculative-draft-model-path`)."""
    hf_ids, _ = server_layer_ids(drafter)
    config = layer_config_fields(drafter, drafter.config.vocab_size)
    config.update(
        architectures=[ARCHITECTURE],
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=drafter.config.hidden_size,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=hf_ids,  # vLLM: the hidden state entering layer i
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(hf_ids),
            "use_aux_hidden_state": True,
        },
    )
    scale = LogitTransform.of(target.config).scale
    if scale != 1.0:
        config["logit_scale"] = scale  # vLLM multiplies the draft logits by it
    return config


def speculators_config(
    drafter: DynaSpecDrafter, target: PreTrainedModel, draft_vocab_size: int, speculative_tokens: int
) -> dict[str, Any]:
    """config.json of vLLM's speculators layout (`speculators_model_type: eagle3`)."""
    hf_ids, _ = server_layer_ids(drafter)
    layer = layer_config_fields(drafter, drafter.config.vocab_size)
    layer["architectures"] = ["LlamaForCausalLM"]
    verifier = {
        "name_or_path": getattr(target.config, "_name_or_path", "")
        or drafter.config.target_name_or_path
        or "",
        "architectures": list(getattr(target.config, "architectures", None) or [type(target).__name__]),
    }
    method = {"proposal_type": "greedy", "speculative_tokens": speculative_tokens}
    return dict(
        architectures=["Eagle3Speculator"],
        speculators_model_type="eagle3",
        transformer_layer_config=layer,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=drafter.config.hidden_size,
        norm_before_residual=False,  # vLLM reads a missing value as true
        norm_before_fc=False,
        eagle_aux_hidden_state_layer_ids=hf_ids,
        torch_dtype=layer["torch_dtype"],
        speculators_config={
            "algorithm": "eagle3",
            "proposal_methods": [method],
            "default_proposal_method": "greedy",
            "verifier": verifier,
        },
    )


@torch.no_grad()
def export_tensors(
    drafter: DynaSpecDrafter, target: PreTrainedModel, draft_ids: torch.Tensor, prefix: str
) -> dict[str, torch.Tensor]:
    """The draft model's tensors under the servers' names (contiguous CPU copies in the drafter's dtype)."""
    _, order = server_layer_ids(drafter)
    d, dtype = drafter.config.hidden_size, drafter.fc.weight.dtype
    blocks = drafter.fc.weight.detach().unflatten(1, (len(order), d))  # (d, 3, d), the drafter's order
    fc = blocks[:, order].flatten(1)  # (d, 3d) in layer order
    head = target.get_output_embeddings().weight.detach()  # (V, d)
    tensors = {"fc.weight": fc, "norm.weight": drafter.norm.weight.detach()}
    tensors |= {prefix + name: value.detach() for name, value in drafter.layer.state_dict().items()}
    tensors["lm_head.weight"] = head.index_select(0, draft_ids.to(head.device)).to(dtype)  # (N, d)
    if draft_ids.numel() < drafter.config.vocab_size:  # every id: no maps (vLLM then has no d2t to load into)
        tensors |= dict(zip(("d2t", "t2d"), vocabulary_maps(draft_ids, drafter.config.vocab_size)))
    return {name: value.cpu().contiguous() for name, value in tensors.items()}


def export_eagle3(
    drafter: DynaSpecDrafter,
    target: PreTrainedModel,
    out_dir: str | os.PathLike,
    draft_vocab_size: int | None = None,
    token_counts: torch.Tensor | None = None,
    format: str = "eagle3",
    speculative_tokens: int = 3,
) -> Path:
    """Write `drafter` (EAGLE-3 architecture, bound to `target`) as an EAGLE-3 draft model folder: config.json and
    model.safetensors (see the module docstring). The draft vocabulary (`draft_vocabulary`) is the
    `draft_vocab_size` most frequent tokens of `token_counts` (V,) plus the EOS ids, or, without counts, the
    drafter's static shortlist (all of it, or its first `draft_vocab_size` tokens).
    `format`: "eagle3" (vLLM and SGLang) or "speculators" (vLLM). Returns the folder."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}.")
    if not drafter.is_eagle3:
        raise ValueError(
            "Only drafter_architecture='eagle3' drafters have a vLLM / SGLang EAGLE-3 equivalent."
        )
    drafter.check_target(target)
    servable_layer(drafter)  # before the draft vocabulary, and before anything is written
    draft_ids = draft_vocabulary(drafter, draft_vocab_size, token_counts)
    size = int(draft_ids.numel())
    if format == "eagle3":
        config = eagle3_config(drafter, target, size)
    else:
        config = speculators_config(drafter, target, size, speculative_tokens)
    config["dynaspec"] = {
        "exported_from": "hf_dynaspec",
        "target_name_or_path": drafter.config.target_name_or_path,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        export_tensors(drafter, target, draft_ids, LAYER_PREFIX[format]), out / WEIGHTS, {"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------- load


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, tensors) of a local EAGLE-3 folder: model.safetensors, a sharded index, or any *.safetensors.
    Pickled weights (pytorch_model.bin, *.pt) are refused."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"{folder / 'config.json'} is missing: {folder} is not an EAGLE-3 checkpoint folder."
        )
    config = json.loads((folder / "config.json").read_text())
    if (folder / INDEX).is_file():
        files = sorted({folder / f for f in json.loads((folder / INDEX).read_text())["weight_map"].values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl"))
        raise ValueError(
            f"{folder} has no *.safetensors weights{f' (only pickled {pickled})' if pickled else ''}: safetensors only. "
            "Convert once in a trusted environment: safetensors.torch.save_file(torch.load(bin), 'model.safetensors')."
        )
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            tensors |= {name: handle.get_tensor(name) for name in handle.keys()}
    return config, tensors


def checkpoint_spec(config: dict[str, Any]) -> dict[str, Any]:
    """One view of both layouts: the layer's Llama config under "layer", the EAGLE-3 keys beside it."""
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != "eagle3":
            raise ValueError(
                f"speculators_model_type {config['speculators_model_type']!r}: only 'eagle3' is supported."
            )
        if "norm_before_residual" not in config:
            raise ValueError(
                "norm_before_residual is missing from the speculators config (vLLM reads it as true)."
            )
        layer, top = dict(config.get("transformer_layer_config") or {}), config
        nested: dict[str, Any] = {}
    else:
        layer, top, nested = config, config, dict(config.get("eagle_config") or {})
    keys = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
    spec = {key: top.get(key) for key in keys}
    spec |= {
        "layer": layer,
        "sglang_layer_ids": nested.get("eagle_aux_hidden_state_layer_ids"),
        "norm_before_residual": bool(top.get("norm_before_residual", False)),
        "norm_before_fc": bool(top.get("norm_before_fc", nested.get("norm_before_fc", False))),
        "use_aux_hidden_state": bool(nested.get("use_aux_hidden_state", True)),
    }
    return spec


def check_spec(
    spec: dict[str, Any], drafter_layer: LlamaConfig, target_vocab: int, target_width: int
) -> None:
    """Raise `ValueError` naming the config key that this target / drafter layer cannot serve."""
    layer = spec["layer"]
    unsupported = [k for k in ("norm_before_residual", "norm_before_fc") if spec[k]]
    if unsupported or not spec["use_aux_hidden_state"]:
        raise ValueError(f"Unsupported EAGLE-3 variant ({unsupported or ['use_aux_hidden_state=false']}).")
    found = {"hidden_size": layer.get("hidden_size"), "vocab_size": layer.get("vocab_size")}
    # target_hidden_size absent: the servers take the draft's own width
    found["target_hidden_size"] = spec["target_hidden_size"] or found["hidden_size"]
    for key, want in (
        ("hidden_size", target_width),
        ("target_hidden_size", target_width),
        ("vocab_size", target_vocab),
    ):
        if found[key] is None or int(found[key]) != want:
            raise ValueError(f"Checkpoint config {key}={found[key]!r}, but the target needs {want}.")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(
            f"Checkpoint config num_hidden_layers={layer['num_hidden_layers']}: one layer is supported."
        )
    for key in LAYER_FIELDS[1:]:
        got = layer.get(key)
        if got is not None and int(got) != int(getattr(drafter_layer, key)):
            raise ValueError(
                f"Checkpoint config {key}={got}, the drafter layer (sized from the target) has "
                f"{getattr(drafter_layer, key)}."
            )
    check_rope_and_norm(layer, drafter_layer)


def check_rope_and_norm(layer: dict[str, Any], drafter_layer: LlamaConfig) -> None:
    """The checkpoint's rotary embedding and norm epsilon as transformers reads them (missing keys: the defaults the
    servers would use) must be the drafter's."""
    rope_keys = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")
    fields = {k: layer[k] for k in rope_keys if layer.get(k) is not None}
    fields.setdefault("max_position_embeddings", drafter_layer.max_position_embeddings)
    theirs = dict(LlamaConfig(**fields).rope_parameters or {})
    mine = dict(drafter_layer.rope_parameters or {})
    for key in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(key), mine.get(key)
        same = math.isclose(a, b) if isinstance(a, float | int) and isinstance(b, float | int) else a == b
        if not same:
            raise ValueError(f"Checkpoint config rope {key}={a!r}, the drafter layer has {b!r}.")
    eps = layer.get("rms_norm_eps", 1e-6)
    if not math.isclose(float(eps), float(drafter_layer.rms_norm_eps), rel_tol=1e-6):
        raise ValueError(
            f"Checkpoint config rms_norm_eps={eps}, the drafter layer has {drafter_layer.rms_norm_eps}."
        )


def checkpoint_vocabulary(
    tensors: dict[str, torch.Tensor], spec: dict[str, Any], vocab_size: int
) -> torch.Tensor:
    """(N,) target ids of the draft vocabulary: arange(N) + d2t, checked against t2d and the config."""
    size = int(spec["draft_vocab_size"] or vocab_size)
    if "d2t" not in tensors:
        if size != vocab_size:
            raise ValueError(
                f"Tensor d2t is missing: draft_vocab_size={size} < vocab_size={vocab_size} needs it."
            )
        return torch.arange(vocab_size)
    d2t = tensors["d2t"]
    if d2t.shape != (size,) or d2t.is_floating_point():
        raise ValueError(f"Tensor d2t has shape {tuple(d2t.shape)} {d2t.dtype}; expected ({size},) integers.")
    ids = torch.arange(size) + d2t.to(torch.int64)  # (N,)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != size:
        raise ValueError(f"Tensor d2t maps to ids outside [0, {vocab_size}) or to repeated ids.")
    t2d = tensors.get("t2d")
    if t2d is not None and (
        t2d.shape != (vocab_size,) or not torch.equal(t2d.bool().nonzero().flatten(), ids.sort().values)
    ):
        raise ValueError(f"Tensor t2d (shape {tuple(t2d.shape)}) disagrees with d2t.")
    return ids


def drafter_weights(
    tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The checkpoint's fc / layer / norm tensors under the drafter's names, shape-checked against `expected`."""
    known = {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight"}
    renamed: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        short = name.removeprefix("model.")
        if short in known:
            continue
        for prefix in ("midlayer.", "layers.0."):
            if short.startswith(prefix):
                short = "layer." + short.removeprefix(prefix)
        if short not in expected:
            raise ValueError(
                f"Unexpected tensor {name} (shape {tuple(value.shape)}): not part of a one-layer EAGLE-3 draft."
            )
        if value.shape != expected[short].shape:
            raise ValueError(
                f"Tensor {name} has shape {tuple(value.shape)}, expected {tuple(expected[short].shape)}."
            )
        renamed[short] = value
    missing = sorted(set(expected) - set(renamed))
    if missing:
        stored = [name.removeprefix("model.") for name in tensors]
        prefix = "layers.0." if any(name.startswith("layers.0.") for name in stored) else "midlayer."
        names = [prefix + m.removeprefix("layer.") if m.startswith("layer.") else m for m in missing]
        raise ValueError(f"Checkpoint tensors missing: {names}.")
    return renamed


def check_head(tensors: dict[str, torch.Tensor], draft_ids: torch.Tensor, target: PreTrainedModel) -> None:
    """lm_head must be (N, d); warn when it is not the target's rows (EAGLE-3 trains its own head, the DynaSpec
    drafter borrows the target's, so drafts then differ from the server's)."""
    head = target.get_output_embeddings().weight.detach()  # (V, d)
    theirs = tensors.get("lm_head.weight")
    if theirs is None:
        if draft_ids.numel() != head.shape[0]:
            raise ValueError("Tensor lm_head.weight is missing (needed when draft_vocab_size < vocab_size).")
        return
    if theirs.shape != (draft_ids.numel(), head.shape[1]):
        raise ValueError(
            f"Tensor lm_head.weight has shape {tuple(theirs.shape)}, expected ({draft_ids.numel()}, {head.shape[1]})."
        )
    rows = head.index_select(0, draft_ids.to(head.device)).float().cpu()
    gap = float((theirs.float() - rows).abs().max())
    if gap > 1e-3 * max(1.0, float(rows.abs().max())):
        warnings.warn(
            f"The checkpoint's lm_head differs from the target's LM-head rows of its draft vocabulary (max |diff| "
            f"{gap:.3g}): the DynaSpec drafter uses the target's rows, so its drafts differ from the server's.",
            stacklevel=3,
        )


def load_eagle3(
    path: str | os.PathLike, target: PreTrainedModel, num_clusters: int = 64, seed: int = 0
) -> DynaSpecDrafter:
    """A `DynaSpecDrafter` (EAGLE-3 architecture, bound to `target`) from an EAGLE-3 checkpoint folder: fc, layer
    and norm loaded, the checkpoint's draft vocabulary stored as the static shortlist (`head_mode="static"`), fresh
    vocabulary clusters and router (train the router before using `head_mode="dynamic"`)."""
    config, tensors = read_checkpoint(path)
    spec = checkpoint_spec(config)
    text = target.config.get_text_config()
    vocab_size = target.get_output_embeddings().weight.shape[0]
    settings = dict(drafter_architecture="eagle3", num_clusters=min(num_clusters, vocab_size))
    settings["target_layer_ids"] = layer_ids_from_config(spec, int(text.num_hidden_layers))
    settings["layer_hidden_act"] = spec["layer"].get("hidden_act") or SERVED_ACTIVATION  # the servers' default
    if spec["layer"].get("intermediate_size") is not None:
        settings["layer_intermediate_size"] = int(spec["layer"]["intermediate_size"])
    layer = DynaSpecConfig.from_target_config(target.config, **settings).build_layer_config()
    check_spec(spec, layer, vocab_size, int(text.hidden_size))  # before the (slower) clustering
    draft_ids = checkpoint_vocabulary(tensors, spec, vocab_size)
    embed = tensors.get("embed_tokens.weight", tensors.get("model.embed_tokens.weight"))
    if embed is not None and embed.shape != (vocab_size, text.hidden_size):
        raise ValueError(
            f"Tensor embed_tokens.weight has shape {tuple(embed.shape)}, expected ({vocab_size}, {text.hidden_size})."
        )
    check_head(tensors, draft_ids, target)
    drafter = DynaSpecDrafter.from_target(target, seed=seed, **settings)
    expected = {k: v for k, v in drafter.state_dict().items() if k.split(".")[0] in ("fc", "layer", "norm")}
    weights = drafter_weights(tensors, expected)
    dtype = drafter.fc.weight.dtype
    drafter.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
    drafter.set_static_shortlist(draft_ids)
    return drafter.eval()

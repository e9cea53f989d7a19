"""EAGLE-3 checkpoint export: write a DynaSpec EAGLE-3 drafter as a vLLM / SGLang draft model (the reverse,
opening checkpoints written here or elsewhere, is `hf_dynaspec.checkpoints`).

    python -c "
    from transformers import LlamaConfig, LlamaForCausalLM; from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.interchange import export_eagle3
    t = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2))
    d = DynaSpecDrafter.from_target(t, num_clusters=8); d.set_static_shortlist(list(range(3, 60)))
    export_eagle3(d, t, '/tmp/eagle3-draft', draft_vocab_size=64)
    print(DynaSpecDrafter.from_pretrained('/tmp/eagle3-draft').draft_token_ids.numel())"

What an exported folder holds (config.json + model.safetensors, nothing pickled):
    fc.weight        (d, 3d)    the fused target layers, blocks in ascending layer order (the order servers concatenate)
    midlayer.*                  the decoder layer (`layers.0.*` in the speculators layout); q/k/v_proj are (·, 2d)
    norm.weight      (d,)
    lm_head.weight   (N, d)     the target's LM-head rows of the N-token draft vocabulary (ascending ids), or the
                                drafter's own trained head (an imported checkpoint's, with its vocabulary's order)
    input_norm / fc_norm.{i} / embed_tokens   where the drafter has them (an imported checkpoint's variants)
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
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, PreTrainedModel

from .configuration import EAGLE3_VARIANTS, SERVED_ACTIVATION
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
    """EAGLE-3's maps of a draft vocabulary (N,) (ascending, or an imported head's own order): d2t (N,) int64 =
    id - arange, t2d (V,) bool."""
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


def eagle3_config(
    drafter: DynaSpecDrafter, target: PreTrainedModel, draft_vocab_size: int, trained_head: bool = False
) -> dict[str, Any]:
    """config.json of the EAGLE-3 layout (vLLM `--speculative-config` model, SGLang `--speculative-draft-model-path`);
    `trained_head`: the lm_head written is the drafter's own (its logit scale), else the target's rows."""
    hf_ids, _ = server_layer_ids(drafter)
    config = layer_config_fields(drafter, drafter.config.vocab_size)
    if drafter.config.norm_output:
        raise ValueError("norm_output (the next step reads the normed output) has another meaning in SGLang / "
                         "SpecForge configs: export this drafter with format='speculators'.")
    variants = {k: getattr(drafter.config, k) for k in ("norm_before_residual", "norm_before_fc", "fc_norm")}
    config.update(
        architectures=[ARCHITECTURE],
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=drafter.config.hidden_size,
        eagle_aux_hidden_state_layer_ids=hf_ids,  # vLLM: the hidden state entering layer i
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(hf_ids),
            "use_aux_hidden_state": True,
            "norm_before_fc": variants["norm_before_fc"],
        },
        **variants,
    )
    scale = drafter.config.draft_logit_scale if trained_head else LogitTransform.of(target.config).scale
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
        # written out: vLLM reads a missing norm_before_residual as true
        **{k: getattr(drafter.config, k) for k in EAGLE3_VARIANTS},
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
    drafter: DynaSpecDrafter, target: PreTrainedModel, draft_ids: torch.Tensor, prefix: str, trained_head: bool = False
) -> dict[str, torch.Tensor]:
    """The draft model's tensors under the servers' names (contiguous CPU copies in the drafter's dtype); lm_head:
    the drafter's own trained head (`trained_head`, over its own `draft_token_ids`), else the target's rows of
    `draft_ids`."""
    _, order = server_layer_ids(drafter)
    d, dtype = drafter.config.hidden_size, drafter.fc.weight.dtype
    blocks = drafter.fc.weight.detach().unflatten(1, (len(order), d))  # (d, 3, d), the drafter's order
    fc = blocks[:, order].flatten(1)  # (d, 3d) in layer order
    tensors = {"fc.weight": fc, "norm.weight": drafter.norm.weight.detach()}
    if drafter.config.norm_before_fc:
        tensors["input_norm.weight"] = drafter.input_norm.weight.detach().unflatten(0, (len(order), d))[order].flatten()
    if drafter.config.fc_norm:
        tensors |= {f"fc_norm.{i}.weight": drafter.fc_norm[j].weight.detach() for i, j in enumerate(order)}
    if drafter.config.own_embeddings:
        tensors["embed_tokens.weight"] = drafter.embed_tokens.weight.detach()
    tensors |= {prefix + name: value.detach() for name, value in drafter.layer.state_dict().items()}
    if trained_head:  # its own trained head, as it was read
        tensors["lm_head.weight"] = drafter.draft_head.weight.detach()  # (N, d)
    else:
        head = target.get_output_embeddings().weight.detach()  # (V, d)
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
    if drafter.config.draft_vocab_size:  # an imported head goes back as it came, over its own vocabulary
        if draft_vocab_size is not None or token_counts is not None:
            raise ValueError(f"This drafter has its own trained head over {drafter.config.draft_vocab_size} tokens; "
                             "it is exported as it is: drop draft_vocab_size / token_counts.")
        draft_ids = drafter.draft_token_ids.cpu()
    else:
        draft_ids = draft_vocabulary(drafter, draft_vocab_size, token_counts)
    size = int(draft_ids.numel())
    trained = bool(drafter.config.draft_vocab_size)
    if format == "eagle3":
        config = eagle3_config(drafter, target, size, trained)
    else:
        config = speculators_config(drafter, target, size, speculative_tokens)
    config["dynaspec"] = {
        "exported_from": "hf_dynaspec",
        "target_name_or_path": drafter.config.target_name_or_path,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        export_tensors(drafter, target, draft_ids, LAYER_PREFIX[format], trained), out / WEIGHTS, {"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out

"""EAGLE-3 drafters trained elsewhere, opened as they were trained: checkpoints written by vLLM's speculators, by
SpecForge, by the EAGLE authors' code, or exported by hf-dynaspec (`interchange.export_eagle3`), from a folder or
the Hub, become a `DynaSpecDrafter` whose default head is the checkpoint's own trained head over its draft
vocabulary (`head.TrainedHead`, `head_mode="trained"`).

    drafter = DynaSpecDrafter.from_pretrained("<EAGLE-3 folder or Hub id>")   # recognised here (`open_eagle3`)
    target.generate(**inputs, assistant_model=drafter)                      # or assistant_model="<same id>"

What is kept from the checkpoint: fc, the decoder layer, norm, its `lm_head` with the target ids i + d2t[i] of
its draft indices (exported back unchanged), its own `embed_tokens` where it carries them (vLLM uses those),
its variants (`norm_before_fc`, `fc_norm`, `norm_before_residual`, `norm_output`) and its target layers. The
target's LM-head rows over the same draft vocabulary become the "static" head (what `import-eagle3` substituted
before), and the "dynamic" head's router is fitted on top with `hf-dynaspec router-fit` (until then the router
heads are refused).

The layouts (each checked against its source; /tmp research notes are not kept, the citations are):
- speculators (vllm-project/speculators src/speculators/models/eagle3/{config,core,model_definitions}.py @
  c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b): `speculators_model_type: "eagle3"`, the layer's config nested under
  `transformer_layer_config`, weights `layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`, `embed_tokens`
  (a frozen copy of the verifier's), optional `input_norm` (norm_before_fc) / `fc_norm.{i}`. Its training CLI
  defaults norm_before_residual, norm_before_fc and norm_output to true and the layer to sliding-window
  attention (2048). A missing norm_before_residual is read as true, as vLLM's adapter
  (vllm/transformers_utils/configs/speculators/algos.py @ cfb173ab8e1b8e44dd35f8b5188255b6a03e13ec) reads it.
- SpecForge (sgl-project/SpecForge specforge/modeling/draft/llama3_eagle.py @
  a6b6b0230009d15ec2a97a57384e6f53f0f96946): a flat Llama config, `architectures: ["LlamaForCausalLMEagle3"]`,
  `draft_vocab_size`, optional `eagle_config.eagle_aux_hidden_state_layer_ids` (SGLang's "output of layer i"),
  `fc_norm`, `norm_output`; weights `midlayer.*`, no embeddings. Its `norm_output` only says whether `norm` runs
  before `lm_head` (the state fed back is always the pre-norm output): true (its default) is the standard layer;
  false is refused.
- The EAGLE authors (SafeAILab/EAGLE eagle/traineagle3/cnets.py @ cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b): a
  plain `LlamaForCausalLM` config with one layer and `draft_vocab_size`, weights `midlayer.*` in
  `pytorch_model.bin` (read with `torch.load(weights_only=True)`, transformers' own rule for such files), no
  embeddings, the target layers the servers' default (2, L // 2, L - 3), resolved when the drafter is bound.

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_checkpoints.py
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import LlamaConfig, PreTrainedModel
from transformers.utils.hub import cached_file

from .configuration import LAYER_FAMILY, SERVED_ACTIVATION, DynaSpecConfig, eagle3_layer_ids
from .modeling import HUB_OPTIONS, DynaSpecDrafter, register_checkpoint_format

# config.json `architectures` of the flat layout: SGLang's / SpecForge's class, vLLM's registry name for it
FLAT_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")
LAYER_PREFIXES = ("midlayer.", "layers.0.")  # the flat layout's and speculators' names of the one decoder layer


# ---------------------------------------------------------------------------------------------- recognise


def checkpoint_format(config: dict[str, Any]) -> str | None:
    """"speculators" (nested layer config), "flat" (SpecForge's, the EAGLE authors' and hf-dynaspec's exports:
    a one-layer Llama config with `draft_vocab_size`), or None: not an EAGLE-3 checkpoint."""
    if "speculators_model_type" in config:
        return "speculators"
    if set(config.get("architectures") or ()) & set(FLAT_ARCHITECTURES):
        return "flat"
    if config.get("model_type") == "llama" and "draft_vocab_size" in config and config.get("num_hidden_layers") == 1:
        return "flat"  # the EAGLE authors' config names the plain LlamaForCausalLM
    return None


@dataclass(frozen=True)
class CheckpointSpec:
    """One view of every layout. layer: the decoder layer's Llama config fields; layer_ids: HF hidden-state
    indices (vLLM's convention, the state entering layer i) or None (the servers' default for the target);
    variants: the EAGLE-3 variant flags (`configuration.EAGLE3_VARIANTS`); sliding_window: the layer's trained window or None."""

    format: str
    layer: dict[str, Any]
    draft_vocab_size: int | None
    target_hidden_size: int | None
    layer_ids: list[int] | None
    variants: dict[str, bool] = field(default_factory=dict)
    sliding_window: int | None = None
    logit_scale: float = 1.0


def checkpoint_spec(config: dict[str, Any], source: str = "config.json") -> CheckpointSpec:
    """The spec of a checkpoint's config.json, or `ValueError` naming the field this loader does not read."""
    fmt = checkpoint_format(config)
    if fmt is None:
        raise ValueError(f"{source} is not an EAGLE-3 draft config (no `speculators_model_type`, no "
                         f"`architectures` {list(FLAT_ARCHITECTURES)}, no one-layer Llama with `draft_vocab_size`).")
    if fmt == "speculators":
        if config["speculators_model_type"] != "eagle3":
            raise ValueError(f"{source}: speculators_model_type {config['speculators_model_type']!r}; only "
                             "'eagle3' drafters are read.")
        layer, nested = dict(config.get("transformer_layer_config") or {}), {}
        variants = {"norm_before_residual": bool(config.get("norm_before_residual", True))}  # vLLM's reading
        variants |= {k: bool(config.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
    else:
        layer, nested = config, dict(config.get("eagle_config") or {})
        if config.get("norm_output") is False:  # SpecForge: lm_head reads the un-normed output
            raise ValueError(f"{source}: norm_output=false (SpecForge's head without the final norm) is not read.")
        variants = {"norm_before_residual": bool(config.get("norm_before_residual", False)),
                    "norm_before_fc": bool(nested.get("norm_before_fc", config.get("norm_before_fc", False))),
                    "fc_norm": bool(config.get("fc_norm", False)), "norm_output": False}
    if not nested.get("use_aux_hidden_state", True):
        raise ValueError(f"{source}: eagle_config.use_aux_hidden_state=false (an EAGLE-1-style draft) is not read.")
    check_layer_kind(layer, source)
    return CheckpointSpec(
        format=fmt, layer=layer, draft_vocab_size=config.get("draft_vocab_size"),
        target_hidden_size=config.get("target_hidden_size"),
        layer_ids=layer_ids_of(config, nested), variants=variants,
        sliding_window=sliding_window_of(layer), logit_scale=float(config.get("logit_scale") or 1.0),
    )


def check_layer_kind(layer: dict[str, Any], source: str) -> None:
    """The draft layer must be one Llama layer without biases: `ValueError` naming the field otherwise."""
    kind = layer.get("model_type", LAYER_FAMILY)
    if kind != LAYER_FAMILY:
        raise ValueError(f"{source}: the draft layer is a {kind!r} layer (model_type); only Llama layers are read.")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{source}: num_hidden_layers={layer['num_hidden_layers']}; one draft layer is read.")
    for key in ("attention_bias", "mlp_bias"):
        if layer.get(key):
            raise ValueError(f"{source}: {key}=true; draft layers without biases are read.")
    if (layer.get("hidden_act") or SERVED_ACTIVATION) not in ("silu", "swish"):
        raise ValueError(f"{source}: hidden_act={layer['hidden_act']!r}; the EAGLE-3 layer's MLP is SiLU.")


def layer_ids_of(config: dict[str, Any], nested: dict[str, Any]) -> list[int] | None:
    """HF indices of the fused target layers, ascending (servers concatenate in layer order): the top-level ids
    (vLLM / speculators: the state entering layer i), else eagle_config's (SGLang / SpecForge: "the output of layer
    i", i + 1, where the first id is 1, as SGLang reads them since PR #25454; as they are otherwise), else None (the
    servers' default)."""
    top, sglang = config.get("eagle_aux_hidden_state_layer_ids"), nested.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return sorted(int(i) for i in top)
    if sglang:
        shift = 1 if int(sglang[0]) == 1 else 0
        return sorted(int(i) + shift for i in sglang)
    return None


def sliding_window_of(layer: dict[str, Any]) -> int | None:
    """The layer's trained attention window (speculators: `layer_types` ["sliding_attention"], `sliding_window`)."""
    kinds = layer.get("layer_types") or []
    if layer.get("sliding_window") and (kinds[:1] == ["sliding_attention"] or layer.get("use_sliding_window")):
        return int(layer["sliding_window"])
    return None


# ---------------------------------------------------------------------------------------------- read


def checkpoint_config(name_or_path: str | os.PathLike, **hub_kwargs: Any) -> dict[str, Any] | None:
    """config.json of a folder or Hub repo as a dict, or None where there is none."""
    path = cached_file(str(name_or_path), "config.json", _raise_exceptions_for_missing_entries=False,
                       **hub_kwargs)
    return None if path is None else json.loads(Path(path).read_text())


def weight_files(name_or_path: str | os.PathLike, **hub_kwargs: Any) -> list[Path]:
    """The checkpoint's weight files: model.safetensors, the shards of a safetensors index, or pytorch_model.bin
    (the EAGLE authors' releases); in a local folder also any other *.safetensors."""
    for name in WEIGHT_FILES:
        path = cached_file(str(name_or_path), name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
        if path is None:
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(json.loads(Path(path).read_text())["weight_map"].values()))
            return [Path(cached_file(str(name_or_path), shard, **hub_kwargs)) for shard in shards]
        return [Path(path)]
    local = Path(name_or_path) / hub_kwargs.get("subfolder", "")
    found = sorted(local.glob("*.safetensors")) if local.is_dir() else []
    if not found:
        raise ValueError(f"{name_or_path} has none of {list(WEIGHT_FILES)}: no EAGLE-3 weights to read.")
    return found


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the files. Pickled files are read with `torch.load(weights_only=True)`, which refuses any
    object but tensors and plain containers."""
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as handle:
                tensors |= {name: handle.get_tensor(name) for name in handle.keys()}
            continue
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001  (pickle errors come in many types)
            raise ValueError(f"{file} could not be read as plain tensors (torch.load weights_only=True): {err}. "
                             "Convert it to safetensors in a trusted environment.") from err
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"{file} holds no flat name -> tensor mapping (a state dict).")
        tensors |= state
    return {name.removeprefix("model."): value for name, value in tensors.items()}


# ---------------------------------------------------------------------------------------------- check


def check_against_target(spec: CheckpointSpec, target: PreTrainedModel, source: str) -> None:
    """`ValueError` naming the field when the checkpoint was made for another target (width, vocabulary, layers)."""
    text = target.config.get_text_config()
    vocab = target.get_output_embeddings().weight.shape[0]
    width = spec.target_hidden_size or spec.layer.get("hidden_size")
    for key, got, want in (("hidden_size", spec.layer.get("hidden_size"), text.hidden_size),
                           ("target_hidden_size", width, text.hidden_size), ("vocab_size", spec.layer.get("vocab_size"),
                                                                             vocab)):
        if got is None or int(got) != int(want):
            raise ValueError(f"{source}: {key}={got!r}, but the target has {want}: this drafter was made for "
                             "another target.")
    if spec.layer_ids is not None:
        check_layer_ids(spec.layer_ids, int(text.num_hidden_layers), source)


def check_layer_ids(ids: list[int], num_layers: int, source: str) -> None:
    if len(set(ids)) != len(ids) or not all(0 <= i < num_layers for i in ids):
        raise ValueError(
            f"{source}: eagle_aux_hidden_state_layer_ids {ids} (as HF hidden-state indices) must be distinct and in "
            f"[0, {num_layers - 1}] for this {num_layers}-layer target: the checkpoint was made for another target."
        )


def check_rope_and_norm(layer: dict[str, Any], drafter_layer: LlamaConfig, source: str) -> None:
    """The checkpoint's rotary embedding and norm epsilon as transformers reads them must be the drafter layer's
    (a check that the config was turned into the layer faithfully)."""
    fields = {k: layer[k] for k in ROPE_KEYS if layer.get(k) is not None}
    fields.setdefault("max_position_embeddings", drafter_layer.max_position_embeddings)
    theirs, mine = dict(LlamaConfig(**fields).rope_parameters or {}), dict(drafter_layer.rope_parameters or {})
    for key in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(key), mine.get(key)
        same = math.isclose(a, b) if isinstance(a, float | int) and isinstance(b, float | int) else a == b
        if not same:
            raise ValueError(f"{source}: rope {key}={a!r}, the drafter layer has {b!r}.")


def draft_vocabulary(tensors: dict[str, torch.Tensor], size: int, vocab_size: int, source: str) -> torch.Tensor:
    """(N,) target ids of the draft indices, i + d2t[i] in the checkpoint's order, checked against t2d."""
    if "d2t" not in tensors:
        if size != vocab_size:
            raise ValueError(f"{source}: tensor d2t is missing, but draft_vocab_size={size} < vocab_size="
                             f"{vocab_size} needs it (the target id of each draft index).")
        return torch.arange(vocab_size)
    d2t = tensors["d2t"]
    if d2t.shape != (size,) or d2t.is_floating_point():
        raise ValueError(f"{source}: tensor d2t has shape {tuple(d2t.shape)} {d2t.dtype}; expected ({size},) integers "
                         f"(draft_vocab_size={size}).")
    ids = torch.arange(size) + d2t.to(torch.int64)  # (N,)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != size:
        raise ValueError(f"{source}: tensor d2t maps to ids outside [0, {vocab_size}) or to repeated ids.")
    t2d = tensors.get("t2d")
    if t2d is not None and (t2d.shape != (vocab_size,) or not torch.equal(t2d.bool().nonzero().flatten(),
                                                                        ids.sort().values)):
        raise ValueError(f"{source}: tensor t2d (shape {tuple(t2d.shape)}) disagrees with d2t.")
    return ids


# ---------------------------------------------------------------------------------------------- open


def drafter_config(
    spec: CheckpointSpec, fused: int, target: PreTrainedModel | None, num_clusters: int, source: str
) -> DynaSpecConfig:
    """The drafter config of a checkpoint: its layer sized from the checkpoint's own fields, the target's family
    and layer count where the target is known (else checked when the drafter is bound)."""
    layer = spec.layer
    if target is not None:
        check_against_target(spec, target, source)
    for key in ("hidden_size", "vocab_size", "num_attention_heads"):
        if layer.get(key) is None:
            raise ValueError(f"{source}: the draft layer's config has no {key}.")
    vocab, width = int(layer["vocab_size"]), int(layer["hidden_size"])
    if spec.target_hidden_size is not None and int(spec.target_hidden_size) != width:
        raise ValueError(f"{source}: target_hidden_size={spec.target_hidden_size} differs from hidden_size={width}; "
                         "drafters as wide as their target are read.")
    own = {k: layer[k] for k in (*LAYER_FIELDS, *ROPE_KEYS, "rms_norm_eps") if layer.get(k) is not None}
    text = target.config.get_text_config() if target is not None else None
    ids = spec.layer_ids
    if ids is None and text is not None:
        ids = eagle3_layer_ids(int(text.num_hidden_layers))
    if ids is not None and len(ids) != fused or ids is None and fused != 3:
        raise ValueError(f"{source}: fc.weight reads {fused} target layers, eagle_aux_hidden_state_layer_ids names "
                         f"{ids if ids is not None else 'none (the servers default to 3)'}.")
    eos = text.eos_token_id if text is not None else layer.get("eos_token_id")  # int, list or None
    return DynaSpecConfig(
        vocab_size=vocab, hidden_size=width,
        target_model_type=text.model_type if text is not None else None,
        target_config=own | ({"num_hidden_layers": int(text.num_hidden_layers)} if text is not None else {}),
        num_clusters=min(num_clusters, vocab), drafter_architecture="eagle3", layer_family=LAYER_FAMILY,
        target_layer_ids=ids, layer_ids_from_target=ids is None,
        layer_hidden_act=SERVED_ACTIVATION, layer_intermediate_size=int(layer.get("intermediate_size") or 4 * width),
        router_fitted=False, layer_sliding_window=spec.sliding_window,
        target_name_or_path=getattr(getattr(target, "config", None), "_name_or_path", None) or None,
        always_include_ids=[] if eos is None else [eos] if isinstance(eos, int) else list(eos), eos_token_id=eos,
        **spec.variants,
    )


def split_weights(tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], source: str
                  ) -> dict[str, torch.Tensor]:
    """The checkpoint's fc / layer / norm / input_norm / fc_norm / embed_tokens tensors under the drafter's names,
    shape-checked against `expected` (the drafter's state dict); `ValueError` naming a tensor left over or missing."""
    head = {"lm_head.weight", "d2t", "t2d"}
    renamed: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if name in head:
            continue
        short = next((("layer." + name.removeprefix(p)) for p in LAYER_PREFIXES if name.startswith(p)), name)
        if short not in expected:
            raise ValueError(f"{source}: unexpected tensor {name} (shape {tuple(value.shape)}): not part of a "
                             "one-layer EAGLE-3 draft with this config.")
        if value.shape != expected[short].shape:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(value.shape)}, expected "
                             f"{tuple(expected[short].shape)}.")
        renamed[short] = value
    missing = sorted(set(expected) - set(renamed))
    if missing:
        raise ValueError(f"{source}: tensors missing: {[m.replace('layer.', 'midlayer.', 1) for m in missing]}.")
    return renamed


def open_eagle3(
    name_or_path: str | os.PathLike, target: PreTrainedModel | None = None, *, num_clusters: int = 64,
    dtype: torch.dtype | str | None = None, **hub_kwargs: Any,
) -> DynaSpecDrafter:
    """A `DynaSpecDrafter` from an EAGLE-3 checkpoint folder or Hub repo (module docstring), its own trained head the
    default (`head_mode="trained"`), the target's rows over its draft vocabulary the "static" head, the router
    unfitted. With `target`: checked against it and bound to it; without: checked when bound."""
    dtype = hub_kwargs.pop("torch_dtype", None) if dtype is None else dtype
    unknown = sorted(set(hub_kwargs) - set(HUB_OPTIONS))
    if unknown:
        raise ValueError(f"from_pretrained options {unknown} are not read for an EAGLE-3 checkpoint (it takes "
                         f"target=, num_clusters=, dtype= and the Hub options {list(HUB_OPTIONS)}).")
    source = str(name_or_path)
    config = checkpoint_config(name_or_path, **hub_kwargs)
    if config is None:
        raise ValueError(f"{source} has no config.json: not an EAGLE-3 checkpoint.")
    config_file = f"{source}/config.json"  # errors name the file and the field
    spec = checkpoint_spec(config, config_file)
    files = weight_files(name_or_path, **hub_kwargs)
    tensors, weights_file = read_tensors(files), f"{source}/{'+'.join(f.name for f in files)}"
    if "fc.weight" not in tensors:
        raise ValueError(f"{weights_file}: tensor fc.weight is missing.")
    fused = tensors["fc.weight"].shape[1] // max(int(spec.layer.get("hidden_size") or 1), 1)
    settings = drafter_config(spec, fused, target, num_clusters, config_file)
    settings.own_embeddings = "embed_tokens.weight" in tensors
    drafter = DynaSpecDrafter(settings)
    check_rope_and_norm(spec.layer, settings.build_layer_config(), config_file)
    expected = {k: v for k, v in drafter.state_dict().items()
                if k.split(".")[0] in ("fc", "layer", "norm", "input_norm", "fc_norm", "embed_tokens")}
    weights = split_weights(tensors, expected, weights_file)
    drafter.load_state_dict({k: v.to(drafter.fc.weight.dtype) for k, v in weights.items()}, strict=False)
    add_heads(drafter, tensors, spec, weights_file)
    drafter.config._name_or_path = source
    if dtype is not None:
        drafter.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    drafter.eval()
    return drafter if target is None else drafter.bind(target)


def add_heads(drafter: DynaSpecDrafter, tensors: dict[str, torch.Tensor], spec: CheckpointSpec, source: str) -> None:
    """The checkpoint's own head ("trained", the default) and the target rows of its draft vocabulary ("static")."""
    vocab = drafter.config.vocab_size
    ids = draft_vocabulary(tensors, int(spec.draft_vocab_size or vocab), vocab, source)
    head = tensors.get("lm_head.weight")
    if head is None:  # the servers then draft with the target's head
        if ids.numel() != vocab:
            raise ValueError(f"{source}: tensor lm_head.weight is missing (needed when draft_vocab_size < vocab_size).")
        default = "full"
    else:
        if head.shape != (ids.numel(), drafter.config.hidden_size):
            raise ValueError(f"{source}: tensor lm_head.weight has shape {tuple(head.shape)}, expected "
                             f"({ids.numel()}, {drafter.config.hidden_size}).")
        drafter.set_trained_head(ids, head.to(drafter.fc.weight.dtype), spec.logit_scale)
        default = "trained"
    drafter.set_static_shortlist(ids)
    drafter.generation_config.head_mode = default


register_checkpoint_format(checkpoint_format, open_eagle3)


def load_eagle3(path: str | os.PathLike, target: PreTrainedModel | None = None, num_clusters: int = 64,
                **hub_kwargs: Any) -> DynaSpecDrafter:
    """`open_eagle3` (kept for the `import-eagle3` command and older code)."""
    return open_eagle3(path, target, num_clusters=num_clusters, **hub_kwargs)

"""DynaSpecDrafter: an EAGLE-style drafter whose LM head only scores a context-dependent shortlist.

Two architectures (`DynaSpecConfig.drafter_architecture`):
- "eagle3" (new drafters): the target's low, middle and high layers, concatenated, go through `fc` (3d -> d);
  one EAGLE-3 decoder layer (`eagle3.py`) attends over [norm(embed(token)); hidden_norm(feature)] and its
  pre-norm output is the feature the next draft step reads; `norm` of it feeds the head.
- "eagle1" (checkpoints saved before): one decoder layer runs over `x = fc([embed(token); target_hidden_state])`;
  its output, after a norm, estimates the target's next final hidden state and is also what the next step reads.
The router reads what the layer reads (the 2d attention input, or x) and runs beside it. The drafter borrows the target's input
embeddings and LM head at run time (`drafter.bind(target)`) and never stores them: its checkpoint holds
`fc`, the layer, the norm, the router and the vocabulary cluster table (safetensors only).

    python -c "
    import torch; from transformers import LlamaConfig, LlamaForCausalLM; from hf_dynaspec import DynaSpecDrafter
    t = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2))
    d = DynaSpecDrafter.from_target(t, num_clusters=8); print(d)"
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_outputs import ModelOutput
from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

from .balanced_clusters import balanced_vocabulary
from .clustering import VocabClusters, cluster_vocabulary
from .configuration import DynaSpecConfig
from .eagle3 import Eagle3DecoderLayer
from .generation_config import DynaSpecGenerationConfig, default_drafter_generation_config
from .head import HeadOutput, LogitTransform, ShortlistHead, TrainedHead
from .masks import attention_kinds, causal_mask
from .router import ClusterRouter, Timer, run_router_beside
from .target_states import select_hidden_states


@dataclass
class DrafterOutput(ModelOutput):
    """One drafting call over T positions.

    hidden_states: (B, T, d) the drafter's features after its final norm (what the head reads);
    next_hidden_states: (B, T, d) what the next draft step reads as `hidden_states` (EAGLE-3: the pre-norm
    output, or hidden_states with `norm_output`; EAGLE-1: the same as hidden_states); router_logits: (B, T, M);
    head: shortlisted logits of the T positions (only when B == 1 and a head mode is asked for); vocab_logits: (T, V) scatter of `head` with -inf outside the shortlist, only when asked.
    """

    hidden_states: torch.Tensor | None = None
    next_hidden_states: torch.Tensor | None = None
    router_logits: torch.Tensor | None = None
    head: HeadOutput | None = None
    vocab_logits: torch.Tensor | None = None


@dataclass
class _Binding:
    target: nn.Module
    embed_tokens: nn.Module
    head: ShortlistHead


def family_modules(model_type: str) -> tuple[type, type, type]:
    """(DecoderLayer, RMSNorm, RotaryEmbedding) classes of a transformers model family: Llama's for every new
    drafter (`DynaSpecConfig.layer_family`), the target's own for checkpoints saved before that field."""
    base_name = MODEL_MAPPING_NAMES.get(model_type)
    if base_name is None:
        raise ValueError(f"Drafter layer family {model_type!r} is unknown to this transformers version.")
    prefix = base_name.removesuffix("Model")
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    names = (f"{prefix}DecoderLayer", f"{prefix}RMSNorm", f"{prefix}RotaryEmbedding")
    classes = tuple(getattr(module, name, None) for name in names)
    if any(cls is None for cls in classes):
        raise ValueError(
            f"Drafter layer family {model_type!r} is not supported: the drafter needs {names} in "
            f"{module.__name__}. Rebuild the drafter with `DynaSpecDrafter.from_target(target)` (a Llama layer)."
        )
    return classes  # type: ignore[return-value]


class DynaSpecPreTrainedModel(PreTrainedModel):
    config_class = DynaSpecConfig
    base_model_prefix = "dynaspec"
    _supports_sdpa = True
    _supports_attention_backend = True


class DynaSpecDrafter(DynaSpecPreTrainedModel):
    """EAGLE-style drafter with a DynaSpec shortlisted head. See the module docstring."""

    def __init__(self, config: DynaSpecConfig) -> None:
        super().__init__(config)
        layer_config = config.build_layer_config()
        layer_cls, norm_cls, rotary_cls = family_modules(config.layer_family)
        d = config.hidden_size
        eps = getattr(layer_config, "rms_norm_eps", 1e-6)
        self.is_eagle3 = config.drafter_architecture == "eagle3"
        if self.is_eagle3:
            width = config.num_fused_layers * d  # the fused target layers
            if config.norm_before_fc:  # one norm over them (speculators' training default)
                self.input_norm = norm_cls(width, eps=eps)
            elif config.fc_norm:  # one norm per fused layer (EAGLE 3.1)
                self.fc_norm = nn.ModuleList(norm_cls(d, eps=eps) for _ in range(config.num_fused_layers))
            self.fc = nn.Linear(width, d, bias=False)  # fused target layers -> d
            self.layer = Eagle3DecoderLayer(layer_config, layer_idx=0, norm_before_residual=config.norm_before_residual)
        else:
            self.fc = nn.Linear(2 * d, d, bias=False)  # [embedding; hidden state] -> d
            self.layer = layer_cls(layer_config, layer_idx=0)
        self.norm = norm_cls(d, eps=eps)
        self.rotary_emb = rotary_cls(config=layer_config)
        router_width = 2 * d if self.is_eagle3 else d
        self.router = ClusterRouter(router_width, config.router_hidden_size, config.num_clusters)
        self.register_buffer("cluster_permutation", torch.arange(config.vocab_size), persistent=True)
        # placeholder table (M contiguous id ranges) until `set_clusters`; built without reading tensor
        # values, as from_pretrained constructs the model on the meta device
        V, M = config.vocab_size, config.num_clusters
        offsets = torch.tensor([-(-c * V // M) for c in range(M + 1)], dtype=torch.long)  # ceil(c V / M)
        self.register_buffer("cluster_offsets", offsets, persistent=True)
        self.register_buffer(
            "static_token_ids", torch.zeros(config.static_shortlist_size, dtype=torch.long), persistent=True
        )
        if config.own_embeddings:  # a checkpoint's own embeddings (vLLM uses them where a checkpoint has them)
            self.embed_tokens = nn.Embedding(config.vocab_size, d)
        if config.draft_vocab_size:  # an own trained head over N draft tokens (`head_mode="trained"`)
            self.draft_head = nn.Linear(d, config.draft_vocab_size, bias=False)  # (N, d)
            self.register_buffer(
                "draft_token_ids", torch.zeros(config.draft_vocab_size, dtype=torch.long), persistent=True
            )  # (N,) target id of each draft index, in the checkpoint's order (EAGLE-3: i + d2t[i])
        self.generation_config = default_drafter_generation_config(config.shortlist_k0, config.shortlist_k1)
        self._binding: _Binding | None = None
        self._clusters_cache: VocabClusters | None = None
        self.post_init()

    # ----------------------------------------------------------------- construction and binding
    @classmethod
    def from_target(
        cls,
        target: PreTrainedModel,
        num_clusters: int = 64,
        *,
        seed: int = 0,
        static_token_ids: torch.Tensor | None = None,
        cluster_iters: int = 20,
        balanced_clusters: bool = False,
        **config_kwargs: Any,
    ) -> DynaSpecDrafter:
        """A fresh (untrained) drafter for `target`: clusters from its LM head (all of one size with
        `balanced_clusters`, for the fixed-shape "lanes" head), one Llama decoder layer sized from its config
        (whatever its family)."""
        check_target_kind(target)
        if static_token_ids is not None:
            config_kwargs["static_shortlist_size"] = int(static_token_ids.numel())
        config = DynaSpecConfig.from_target_config(target.config, num_clusters=num_clusters, **config_kwargs)
        config._attn_implementation = target.config._attn_implementation
        drafter = cls(config)
        weight = target.get_output_embeddings().weight.detach()
        cluster = balanced_vocabulary if balanced_clusters else cluster_vocabulary
        drafter.set_clusters(cluster(weight, num_clusters, seed=seed, max_iters=cluster_iters))
        if static_token_ids is not None:
            drafter.static_token_ids = static_token_ids.detach().to(torch.long).clone()
        drafter.to(device=weight.device, dtype=weight.dtype)
        return drafter.bind(target)

    @torch.no_grad()
    def init_layer_from_target(self, target: PreTrainedModel, layer_index: int = -1) -> DynaSpecDrafter:
        """Start the drafter layer from one of the target's decoder layers (same parameters: Llama-style targets
        such as Llama, Mistral, SmolLM2): the drafter then begins close to the target's own computation, which
        speeds up training."""
        self.check_target(target)
        layers = getattr(getattr(target, "model", None), "layers", None)
        if layers is None:
            raise ValueError(f"{type(target).__name__} has no `model.layers` to copy a decoder layer from.")
        if self.is_eagle3:
            return self._init_eagle3_layer(layers[layer_index])
        try:
            self.layer.load_state_dict(layers[layer_index].state_dict())
        except RuntimeError as err:
            raise ValueError(
                f"The drafter's {type(self.layer).__name__} cannot start from a {type(layers[layer_index]).__name__} "
                f"(different parameters): skip init_layer_from_target (--copy-last-layer) for this target.\n{err}"
            ) from err
        return self

    def _init_eagle3_layer(self, source: nn.Module) -> DynaSpecDrafter:
        """The EAGLE-3 layer starts as `source` applied to the feature: its q/k/v read the hidden_norm half of the
        2d input with the source's weights (the embedding half starts at zero), the rest copied as it is."""
        layer = self.layer
        try:
            for name in ("q_proj", "k_proj", "v_proj"):
                weight = getattr(layer.self_attn, name).weight  # (out, 2d)
                weight.zero_()
                weight[:, weight.shape[1] // 2 :] = getattr(source.self_attn, name).weight
            layer.self_attn.o_proj.load_state_dict(source.self_attn.o_proj.state_dict())
            layer.mlp.load_state_dict(source.mlp.state_dict())
            layer.hidden_norm.load_state_dict(source.input_layernorm.state_dict())
            layer.post_attention_layernorm.load_state_dict(source.post_attention_layernorm.state_dict())
        except (AttributeError, RuntimeError) as err:
            raise ValueError(
                f"The EAGLE-3 layer cannot start from a {type(source).__name__} (other parameters): skip "
                f"init_layer_from_target (--copy-last-layer) for this target.\n{err}"
            ) from err
        check_same_function(
            {"hidden_norm": (layer.hidden_norm, source.input_layernorm), "mlp": (layer.mlp, source.mlp)},
            type(source).__name__, layer.hidden_norm.weight,
        )
        return self

    def set_static_shortlist(self, token_ids: torch.Tensor, ranked: bool = False) -> None:
        """Store the fixed token set of `head_mode="static"` (e.g. the most frequent tokens) in the drafter.
        `ranked=True`: `token_ids` are in frequency order, most frequent first (kept so; duplicates dropped), so
        a call can use only the first N (`static_size`); else they are stored sorted by id."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        if ranked:
            first = {int(t): i for i, t in reversed(list(enumerate(ids.tolist())))}  # first occurrence of each
            ids = ids[sorted(first.values())]
        else:
            ids = ids.unique()
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.config.vocab_size:
            raise ValueError(f"static shortlist ids must lie in [0, {self.config.vocab_size}).")
        self.config.static_shortlist_size = int(ids.numel())
        self.config.static_shortlist_ranked = ranked
        self.static_token_ids = ids.to(self.cluster_permutation.device)
        if self._binding is not None:
            self.bind(self._binding.target, force=True)

    def set_clusters(self, clusters: VocabClusters) -> None:
        clusters.validate()
        if clusters.vocab_size != self.config.vocab_size or clusters.num_clusters != self.config.num_clusters:
            raise ValueError(
                f"Cluster table has V={clusters.vocab_size}, M={clusters.num_clusters}; the drafter config "
                f"expects V={self.config.vocab_size}, M={self.config.num_clusters}."
            )
        device = self.cluster_permutation.device
        self.cluster_permutation = clusters.permutation.to(device)
        self.cluster_offsets = clusters.offsets.to(device)
        self._clusters_cache = None
        if self._binding is not None:
            self.bind(self._binding.target, force=True)

    @property
    def clusters(self) -> VocabClusters:
        if self._clusters_cache is None:
            tensors = {"clusters.permutation": self.cluster_permutation, "clusters.offsets": self.cluster_offsets}
            self._clusters_cache = VocabClusters.from_tensors({k: v.cpu() for k, v in tensors.items()})
        return self._clusters_cache

    def check_target(self, target: PreTrainedModel) -> None:
        """Raise `ValueError` naming both values when `target` is not the model this drafter was built for."""
        check_target_kind(target)
        text_config = target.config.get_text_config()
        head = target.get_output_embeddings()
        checks = (
            ("model family (model_type)", text_config.model_type, self.config.target_model_type),
            ("vocabulary size", head.weight.shape[0], self.config.vocab_size),
            ("hidden size", text_config.hidden_size, self.config.hidden_size),
        )
        for what, target_value, drafter_value in checks:
            if drafter_value is not None and target_value != drafter_value:
                raise ValueError(
                    f"This drafter was built for a target with {what} {drafter_value!r}, but the target has "
                    f"{target_value!r}. Use a drafter trained for this target, or build one with "
                    "`DynaSpecDrafter.from_target(target)` and train it (`hf-dynaspec train`)."
                )
        num_layers = int(text_config.num_hidden_layers)
        ids = [] if self.config.layer_ids_from_target else self.config.target_layer_ids
        if any(not 0 <= i <= num_layers for i in ids):
            raise ValueError(
                f"This drafter reads the target's hidden states {ids} (eagle_aux_hidden_state_layer_ids), but the "
                f"target has {num_layers} layers (hidden states 0..{num_layers}): it was made for another target."
            )

    def bind(self, target: PreTrainedModel, force: bool = False) -> DynaSpecDrafter:
        """Borrow `target`'s input embeddings and LM head (no copy of the embeddings; head views are prepared)."""
        current = self._binding
        if current is not None and current.target is target and not force:
            # the same target, unless it was moved or cast since (target.half()): then rebind to its new head
            if _same_storage(current.head.weight, target.get_output_embeddings().weight):
                return self
        self.check_target(target)
        self.config.resolve_layer_ids(int(target.config.get_text_config().num_hidden_layers))
        weight = target.get_output_embeddings().weight.detach()
        if self.fc.weight.device != weight.device or self.fc.weight.dtype != weight.dtype:
            self.to(device=weight.device, dtype=weight.dtype)
        static_ids = self.static_token_ids if self.static_token_ids.numel() else None
        transform = LogitTransform.of(target.config)
        head = ShortlistHead(weight, self.clusters, self.config.always_include_ids, static_ids, transform,
                             static_ranked=self.config.static_shortlist_ranked, trained=self.trained_head())
        embed = self.embed_tokens if self.config.own_embeddings else target.get_input_embeddings()
        self._binding = _Binding(target, embed, head)
        return self

    def trained_head(self) -> TrainedHead | None:
        """The drafter's own trained head (`head_mode="trained"`), or None when it only borrows the target's rows."""
        if not self.config.draft_vocab_size:
            return None
        return TrainedHead(self.draft_token_ids, self.draft_head.weight.detach(), self.config.draft_logit_scale)

    def set_trained_head(self, token_ids: torch.Tensor, weight: torch.Tensor, logit_scale: float = 1.0) -> None:
        """Give an EAGLE-3 drafter its own trained head: weight (N, d) over the target ids token_ids (N,) (distinct,
        in the head's order), replacing any it had."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        size, d = ids.numel(), self.config.hidden_size
        if weight.shape != (size, d):
            raise ValueError(f"The trained head's weight must be ({size}, {d}) for {size} token ids, got "
                             f"{tuple(weight.shape)}.")
        if size and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size or ids.unique().numel() != size):
            raise ValueError(f"The trained head's token ids must be distinct and in [0, {self.config.vocab_size}).")
        self.config.draft_vocab_size = size
        self.config.draft_logit_scale = float(logit_scale)
        self.config.validate_settings()
        like = self.fc.weight
        self.draft_head = nn.Linear(d, size, bias=False).to(device=like.device, dtype=like.dtype)
        with torch.no_grad():
            self.draft_head.weight.copy_(weight)
        self.register_buffer("draft_token_ids", ids.to(like.device), persistent=True)  # replaces any held
        if self._binding is not None:
            self.bind(self._binding.target, force=True)

    @property
    def bound_target(self) -> nn.Module | None:
        return None if self._binding is None else self._binding.target

    @property
    def bound_head(self) -> ShortlistHead:
        return self._require_binding().head

    def _require_binding(self) -> _Binding:
        if self._binding is None:
            raise RuntimeError("The drafter is not bound to a target: call `drafter.bind(target)` first.")
        return self._binding

    # ----------------------------------------------------------------- forward
    def target_features(self, hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
        """What the drafter reads from a target forward with `output_hidden_states=True`: the layers of
        `config.feature_layer_ids` concatenated, (B, T, k * d)."""
        return select_hidden_states(tuple(hidden_states), self.config.feature_layer_ids)

    def project(self, target_features: torch.Tensor) -> torch.Tensor:
        """The first draft step's `hidden_states` from `target_features` (..., k * d): EAGLE-3 fuses the layers
        with `fc` (-> (..., d)), after `input_norm` / `fc_norm` where the checkpoint has them; EAGLE-1 reads the
        final hidden state as it is."""
        width = len(self.config.feature_layer_ids) * self.config.hidden_size
        if target_features.shape[-1] != width:
            raise ValueError(
                f"Expected target features {width} wide ({len(self.config.feature_layer_ids)} layers x "
                f"{self.config.hidden_size}), got {target_features.shape[-1]}: pass `drafter.target_features(...)`."
            )
        features = target_features.to(self.fc.weight.dtype)
        if not self.is_eagle3:
            return features
        if self.config.norm_before_fc:
            features = self.input_norm(features)  # (..., k d)
        elif self.config.fc_norm:
            blocks = features.chunk(len(self.fc_norm), dim=-1)  # k x (..., d)
            features = torch.cat([norm(block) for norm, block in zip(self.fc_norm, blocks)], dim=-1)
        return self.fc(features)

    def forward(
        self,
        input_ids: torch.LongTensor,
        hidden_states: torch.Tensor,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        head_mode: str | None = "dynamic",
        num_clusters: int | None = None,
        return_vocab_logits: bool = False,
        timer: Timer | None = None,
        shortlist_layout: str = "union",
    ) -> DrafterOutput:
        """One drafting call.

        input_ids: (B, T) the token at each position; hidden_states: (B, T, d) the feature of the previous
        position: `project(target_features)` where the target's are known, else the drafter's own
        `next_hidden_states` (deeper in the tree); attention_mask: 4D float (B, 1, T, cache_len + T) with 0 where
        attention is allowed, or None for causal attention; cache: a `DynamicCache` for the drafter layer.
        `head_mode=None` skips the head (training computes its own); `shortlist_layout` lays out a router head's
        shortlists (`head.LAYOUTS`). `timer` (e.g. `SpeculativeStats.timer`) times the router where it does not
        overlap the layer.
        """
        binding = self._require_binding()
        batch, length = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=input_ids.device).expand(batch, -1)
        if attention_mask is None:
            attention_mask = causal_mask(length, past, hidden_states.dtype, hidden_states.device)
        embeds = binding.embed_tokens(input_ids).to(hidden_states.dtype)  # (B, T, d)
        if self.is_eagle3:
            layer_input = self.layer.attention_input(embeds, hidden_states)  # (B, T, 2d)
            layer_args = (layer_input, self.layer.residual(hidden_states))
        else:
            layer_input = self.fc(torch.cat([embeds, hidden_states], dim=-1))  # (B, T, d)
            layer_args = (layer_input,)
        router_logits, layer_out = run_router_beside(
            self.router,
            layer_input,
            self.layer,
            *layer_args,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=self.rotary_emb(layer_input, position_ids),
            timer=timer,
        )
        features = self.norm(layer_out)  # (B, T, d)
        output = DrafterOutput(
            hidden_states=features,
            next_hidden_states=layer_out if self.is_eagle3 and not self.config.norm_output else features,
            router_logits=router_logits,
        )
        if head_mode is not None:
            if batch != 1:
                raise ValueError("The shortlisted head runs on one sequence (batch 1) of draft positions.")
            k = num_clusters if num_clusters is not None else self.config.shortlist_k0
            output.head = binding.head.logits(features[0], head_mode, router_logits[0], k, layout=shortlist_layout)
            if return_vocab_logits:
                output.vocab_logits = output.head.to_vocab(self.config.vocab_size)
        return output

    def dense_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Dense logits over the whole vocabulary, as the target makes them: features (..., d) -> (..., V). For
        training and tests."""
        head = self._require_binding().head
        return head.transform(nn.functional.linear(features, head.weight))

    # ----------------------------------------------------------------- persistence
    def save_pretrained(
        self, save_directory: str | os.PathLike, tokenizer: Any = None, **kwargs: Any
    ) -> None:
        """Weights (safetensors only), config.json and generation_config.json; with `tokenizer` (the target's),
        its files too, so the folder also works where transformers loads an assistant by name
        (`pipeline(..., assistant_model="<folder or Hub id>")` reads it with `AutoTokenizer`)."""
        kwargs.pop("safe_serialization", None)  # safetensors only: never pickle
        super().save_pretrained(save_directory, **kwargs)
        # pipelines load a named assistant with the classes `config.architectures` names in transformers' own
        # namespace: AutoModelForCausalLM (this drafter is registered with it) comes first
        self.config.architectures = ["AutoModelForCausalLM", type(self).__name__]
        self.config.save_pretrained(save_directory)
        self.generation_config.save_pretrained(save_directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(save_directory)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, target: PreTrainedModel | None = None,
        **kwargs: Any,
    ):
        """A saved DynaSpec drafter, or a checkpoint of a format registered with `register_checkpoint_format` (the
        EAGLE-3 layouts of `hf_dynaspec.checkpoints`), from a folder or the Hub. With `target`, bound to it."""
        hub_kwargs = {k: kwargs[k] for k in HUB_OPTIONS if k in kwargs}
        if "config" not in kwargs and _CHECKPOINT_FORMATS:
            config_dict = _config_dict(pretrained_model_name_or_path, hub_kwargs)
            for recognise, open_checkpoint in _CHECKPOINT_FORMATS:
                if config_dict is not None and recognise(config_dict):
                    return open_checkpoint(pretrained_model_name_or_path, target, *args, **kwargs)
        model = cls._from_saved(pretrained_model_name_or_path, *args, **kwargs)
        return model if target is None else model.bind(target)

    @classmethod
    def _from_saved(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any):
        kwargs["use_safetensors"] = True
        local = Path(pretrained_model_name_or_path) / kwargs.get("subfolder", "")
        if local.is_dir() and not (local / "config.json").is_file() and "config" not in kwargs:
            raise OSError(
                f"{local / 'config.json'} is missing: {local} is not a saved DynaSpec drafter "
                "(make one with `drafter.save_pretrained(path)`)."
            )
        # every file the drafter reads honours the same Hub options
        hub_kwargs = {k: kwargs[k] for k in HUB_OPTIONS if k in kwargs}
        if "config" not in kwargs:
            _check_config_model_type(pretrained_model_name_or_path, hub_kwargs)
        try:
            model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as err:
            files = sorted(local.glob("*.safetensors")) or ["*.safetensors"]
            raise OSError(
                f"Could not read the drafter weights {', '.join(str(f) for f in files)}: {err}. The file is "
                "truncated or corrupt: download it again or re-save the drafter."
            ) from err
        try:
            model.generation_config = DynaSpecGenerationConfig.from_pretrained(
                pretrained_model_name_or_path, **hub_kwargs
            )
        except OSError:
            pass  # no generation_config.json: keep the defaults built in __init__
        model.clusters.validate()
        return model


HUB_OPTIONS = ("subfolder", "revision", "cache_dir", "token", "local_files_only", "force_download", "proxies")
# (recognise(config.json as a dict) -> bool, open(name_or_path, target, *args, **kwargs) -> drafter): checkpoint
# layouts other than DynaSpec's own that `from_pretrained` opens (`hf_dynaspec.checkpoints` registers EAGLE-3's)
_CHECKPOINT_FORMATS: list[tuple[Callable[[dict[str, Any]], Any], Callable[..., DynaSpecDrafter]]] = []


def register_checkpoint_format(
    recognise: Callable[[dict[str, Any]], Any], open_checkpoint: Callable[..., DynaSpecDrafter]
) -> None:
    """Let `DynaSpecDrafter.from_pretrained` open another checkpoint layout (idempotent)."""
    if (recognise, open_checkpoint) not in _CHECKPOINT_FORMATS:
        _CHECKPOINT_FORMATS.append((recognise, open_checkpoint))


def names_a_drafter(name_or_path: str | os.PathLike, **hub_kwargs: Any) -> bool:
    """Whether a folder or Hub repo holds a DynaSpec drafter or a checkpoint of a registered layout."""
    config_dict = _config_dict(name_or_path, hub_kwargs)
    if config_dict is None:
        return False
    return config_dict.get("model_type") == DynaSpecConfig.model_type or any(
        recognise(config_dict) for recognise, _ in _CHECKPOINT_FORMATS)


def _config_dict(name_or_path: str | os.PathLike, hub_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """config.json of a folder or Hub repo, or None where there is none (the saved-drafter path then explains)."""
    try:
        config_dict, _ = DynaSpecConfig.get_config_dict(name_or_path, **hub_kwargs)
    except OSError:
        return None
    return config_dict


def check_target_kind(target: PreTrainedModel) -> None:
    """Raise `ValueError` saying what is missing when `target` cannot be drafted for: it must be a decoder-only
    model with an LM head whose layers use full or sliding-window attention (`masks.attention_kinds`)."""
    name = type(target).__name__
    if getattr(target.config, "is_encoder_decoder", False):
        raise ValueError(
            f"{name} is an encoder-decoder model: DynaSpec drafts for decoder-only causal LMs (*ForCausalLM)."
        )
    head = target.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{name} has no LM head: bind the drafter to a *ForCausalLM model.")
    attention_kinds(target.config)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and a.data_ptr() == b.data_ptr()


def _check_config_model_type(name_or_path: str | os.PathLike, hub_kwargs: dict[str, Any]) -> None:
    """Refuse a config.json of another model type (e.g. the target's LlamaConfig saved over the drafter's)."""
    config_dict, _ = DynaSpecConfig.get_config_dict(name_or_path, **hub_kwargs)
    model_type = config_dict.get("model_type")
    if model_type is not None and model_type != DynaSpecConfig.model_type:
        raise ValueError(
            f"The config.json of {name_or_path} is for model_type {model_type!r}, not a DynaSpec drafter "
            f"({DynaSpecConfig.model_type!r}): point `from_pretrained` at a directory saved with "
            "`drafter.save_pretrained(path)`."
        )


AutoModel.register(DynaSpecConfig, DynaSpecDrafter, exist_ok=True)
# as transformers loads a named assistant (pipelines: config.architectures, then AutoModelForCausalLM)
AutoModelForCausalLM.register(DynaSpecConfig, DynaSpecDrafter, exist_ok=True)


@torch.no_grad()
def check_same_function(pairs: dict[str, tuple[nn.Module, nn.Module]], source_name: str, like: torch.Tensor) -> None:
    """A copied module must compute what its source computes (same parameters are not enough: a Gemma RMSNorm
    scales by 1 + weight where a Llama one scales by weight, Gemma's MLP is GELU where Llama's is SiLU)."""
    x = torch.randn(4, like.shape[-1], generator=torch.Generator().manual_seed(0)).to(like)  # (4, d)
    for name, (copy, source) in pairs.items():
        if not torch.allclose(copy(x).float(), source(x).float(), rtol=1e-3, atol=1e-4):
            raise ValueError(
                f"The drafter's {name}, copied from a {source_name}, computes something else than its source "
                f"(another norm or activation convention): skip init_layer_from_target (--copy-last-layer) for "
                f"this target and train the layer from its fresh initialisation."
            )


"""DynaSpecConfig: the drafter's configuration (an HF `PretrainedConfig`, model_type "dynaspec_drafter").

It records the target the drafter was built for (family, vocabulary size, width: a mismatched target is
refused at bind time), the drafter layer's settings (copied from the target's own config, one layer), the
vocabulary clustering and the router, and the shortlist budget schedule over draft depth.

    python -c "from hf_dynaspec import DynaSpecConfig; print(DynaSpecConfig(vocab_size=1000, hidden_size=64))"
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from transformers import AutoConfig, PretrainedConfig

MODEL_TYPE = "dynaspec_drafter"

# Keys of the target's config that describe the target, not the drafter layer: dropped when copied.
_DROPPED_TARGET_KEYS = (
    "quantization_config",  # GGUF / bnb targets: the drafter is never quantized and it does not serialise
    "architectures",
    "auto_map",
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "id2label",
    "label2id",
    "model_type",
)
SCHEDULES = ("linear", "exponential")
EAGLE3_VARIANTS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")  # config flags, see below
ARCHITECTURES = ("eagle1", "eagle3")
LAYER_FAMILY = "llama"  # the drafter layer of every new drafter, whatever the target's family (as vLLM / SGLang)
SERVED_ACTIVATION = "silu"  # the only MLP activation vLLM's EAGLE-3 layer takes: every new drafter's


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """The target layers an EAGLE-3 drafter reads, as indices into the target's `output_hidden_states` tuple
    (0: embeddings, i: the output of decoder layer i - 1, num_layers: the final normed state): low, middle and
    high, (2, L // 2, L - 3) as vLLM's `get_eagle3_aux_hidden_state_layers` chooses them (clamped to [1, L]
    for very shallow targets)."""
    return [min(max(i, 1), num_layers) for i in (2, num_layers // 2, num_layers - 3)]


def cluster_budget(depth: int, max_depth: int, k0: int, k1: int, schedule: str, num_clusters: int) -> int:
    """Cluster budget k_c(t) for draft position t = `depth` (0-based) of D = `max_depth` positions:

        linear:       k(t) = k0 + (k1 - k0) * t / (D - 1)
        exponential:  k(t) = k0 * (k1 / k0) ** (t / (D - 1))
        rounded to the nearest integer and clamped to [1, num_clusters].
    """
    frac = 0.0 if max_depth <= 1 else min(max(depth, 0), max_depth - 1) / (max_depth - 1)
    k = k0 + (k1 - k0) * frac if schedule == "linear" else k0 * (k1 / k0) ** frac
    return int(min(max(round(k), 1), num_clusters))


def default_shortlist_budget(num_clusters: int) -> tuple[int, int]:
    """(k0, k1) when not given: 1/8 of the clusters at the first draft position, 1/16 at the deepest."""
    return max(1, num_clusters // 8), max(1, num_clusters // 16)


class DynaSpecConfig(PretrainedConfig):
    r"""Configuration of a [`DynaSpecDrafter`].

    Args:
        vocab_size (`int`): the target's vocabulary size (rows of its LM head).
        hidden_size (`int`): the target's hidden size (the drafter reads the target's hidden states).
        target_model_type (`str`): the target's `model_type` (e.g. "llama", "gemma3_text"); None for a checkpoint
            opened without its target (an EAGLE-3 checkpoint trained elsewhere: any target of its width and
            vocabulary is accepted).
        target_config (`dict`): the target's text config as a dict; the drafter layer is sized from it.
        layer_family (`str`, *optional*): the drafter layer's family: "llama" (one Llama decoder layer sized from
            the target's config, for targets of any family; what new drafters use), or the target's own
            `model_type` (drafters saved before this field existed, whose layer was of the target's family).
            Default: `target_model_type`, so older checkpoints load as they were saved.
        num_clusters (`int`): number of vocabulary clusters M (spherical k-means over LM-head rows).
        router_hidden_size (`int`): width of the router MLP's hidden layer.
        drafter_architecture (`str`, *optional*): "eagle3" (what new drafters use: the drafter reads a fusion of
            several target layers, `fc` maps them to d, and its decoder layer attends over [norm(embedding);
            hidden_norm(feature)], 2d wide, as vLLM / SGLang define EAGLE-3) or "eagle1" (`fc` over [embedding;
            final hidden state], then a standard decoder layer). Default "eagle1", so checkpoints saved before
            this field load as they were trained.
        target_layer_ids (`list[int]`, *optional*): the target hidden states an "eagle3" drafter reads, indices into
            the target's `output_hidden_states` tuple; default `eagle3_layer_ids(num_hidden_layers)`.
        layer_ids_from_target (`bool`, *optional*): the target layers are not known yet (an EAGLE-3 checkpoint that
            does not name them, opened without its target): they are the servers' default for the target,
            `eagle3_layer_ids`, filled in when the drafter is bound (`resolve_layer_ids`).
        own_embeddings (`bool`, *optional*): the drafter carries its own token embeddings (a speculators
            checkpoint's `embed_tokens`, which vLLM uses); False: it borrows the target's.
        shortlist_k0 (`int`, *optional*): clusters kept at the first draft position (depth 0); default
            `default_shortlist_budget(num_clusters)`.
        shortlist_k1 (`int`, *optional*): clusters kept at the deepest draft position; default as for k0.
        shortlist_schedule (`str`): "linear" or "exponential" decay of the cluster budget from k0 to k1.
        always_include_ids (`list[int]`): tokens always in the shortlist (the EOS ids by default).
        static_shortlist_size (`int`, *optional*): size of the stored static (frequency-ranked) shortlist
            used by `head_mode="static"`; 0 when the checkpoint carries none.
        static_shortlist_ranked (`bool`, *optional*): the stored static tokens are in frequency order (most
            frequent first), so a call can keep only the first N (`static_size`); False for lists stored by id.
        layer_hidden_act (`str`, *optional*): the drafter layer's MLP activation (a transformers `ACT2FN` name).
            New drafters use "silu", the one EAGLE-3 servers take (`from_target_config`); None (drafters saved
            before this field) means the target's own activation.
        layer_intermediate_size (`int`, *optional*): the drafter layer's MLP width; None means the target's.
        draft_vocab_size (`int`, *optional*): N, the size of the drafter's own trained LM head (`head_mode=
            "trained"`: an EAGLE-3 checkpoint trained elsewhere, its `lm_head` over N draft tokens and the target ids
            of its `d2t` map); 0 (DynaSpec's own drafters) when the drafter only borrows the target's LM-head rows.
        draft_logit_scale (`float`, *optional*): the own head's logit scale (an EAGLE-3 config's `logit_scale`).
        norm_before_fc / fc_norm / norm_before_residual / norm_output (`bool`, *optional*): EAGLE-3 variants of
            checkpoints trained elsewhere (speculators' training defaults turn the first, third and fourth on): an
            RMSNorm over the fused target layers before `fc` (`input_norm`), one per fused layer (`fc_norm`), the
            residual read through `hidden_norm`, and the next draft step reading the normed output. All False for
            DynaSpec's own drafters (the layer as vLLM and SGLang serve it by default).
        layer_sliding_window (`int`, *optional*): the window a checkpoint's draft layer was trained with
            (speculators: 2048); drafting beyond it attends in full (a warning says so; output stays exact).
        router_fitted (`bool`, *optional*): the router (and its vocabulary clusters) was trained for this drafter;
            False for an imported EAGLE-3 checkpoint until `hf-dynaspec router-fit` has run, and the heads that read
            the router ("dynamic", "union") are refused until then.
        target_name_or_path (`str`, *optional*): where the target came from (informational).
        bos_token_id / eos_token_id / pad_token_id: the target's special tokens (same tokenizer).
    """

    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 64,
        target_model_type: str = "llama",
        target_config: dict[str, Any] | None = None,
        num_clusters: int = 64,
        router_hidden_size: int = 256,
        shortlist_k0: int | None = None,
        shortlist_k1: int | None = None,
        shortlist_schedule: str = "linear",
        always_include_ids: list[int] | None = None,
        static_shortlist_size: int = 0,
        static_shortlist_ranked: bool = False,
        target_name_or_path: str | None = None,
        layer_family: str | None = None,
        drafter_architecture: str = "eagle1",
        target_layer_ids: list[int] | None = None,
        layer_ids_from_target: bool = False,
        own_embeddings: bool = False,
        layer_hidden_act: str | None = None,
        layer_intermediate_size: int | None = None,
        draft_vocab_size: int = 0,
        draft_logit_scale: float = 1.0,
        router_fitted: bool = True,
        norm_before_fc: bool = False,
        fc_norm: bool = False,
        norm_before_residual: bool = False,
        norm_output: bool = False,
        layer_sliding_window: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.target_model_type = target_model_type
        self.target_config = dict(target_config or {})
        self.num_clusters = num_clusters
        self.router_hidden_size = router_hidden_size
        default_k0, default_k1 = default_shortlist_budget(num_clusters) if isinstance(num_clusters, int) else (1, 1)
        self.shortlist_k0 = default_k0 if shortlist_k0 is None else shortlist_k0
        self.shortlist_k1 = default_k1 if shortlist_k1 is None else shortlist_k1
        self.shortlist_schedule = shortlist_schedule
        self.always_include_ids = list(always_include_ids or [])
        self.static_shortlist_size = static_shortlist_size
        self.static_shortlist_ranked = bool(static_shortlist_ranked)
        self.target_name_or_path = target_name_or_path
        self.layer_family = layer_family or target_model_type
        self.drafter_architecture = drafter_architecture
        num_layers = int(self.target_config.get("num_hidden_layers") or 1)
        self.layer_ids_from_target = bool(layer_ids_from_target)
        self.own_embeddings = bool(own_embeddings)
        if drafter_architecture == "eagle3" and target_layer_ids is None and not self.layer_ids_from_target:
            target_layer_ids = eagle3_layer_ids(num_layers)
        self.target_layer_ids = [int(i) for i in target_layer_ids or []]
        self.layer_hidden_act = layer_hidden_act
        self.layer_intermediate_size = layer_intermediate_size
        self.draft_vocab_size = draft_vocab_size
        self.draft_logit_scale = float(draft_logit_scale)
        self.router_fitted = bool(router_fitted)
        self.norm_before_fc, self.fc_norm = bool(norm_before_fc), bool(fc_norm)
        self.norm_before_residual, self.norm_output = bool(norm_before_residual), bool(norm_output)
        self.layer_sliding_window = layer_sliding_window
        # the target's special tokens: transformers compares them to decide whether tokenizers are shared
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        kwargs.pop("tie_word_embeddings", None)  # the drafter owns no head: nothing to tie
        super().__init__(tie_word_embeddings=False, **kwargs)
        self.validate_settings()

    def validate_settings(self) -> None:
        """Raise `ValueError` with what to change when a field is impossible."""
        positive = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_clusters": self.num_clusters,
            "router_hidden_size": self.router_hidden_size,
            "shortlist_k0": self.shortlist_k0,
            "shortlist_k1": self.shortlist_k1,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DynaSpecConfig.{name} must be a positive integer, got {value!r}.")
        if self.num_clusters > self.vocab_size:
            raise ValueError(
                f"DynaSpecConfig.num_clusters ({self.num_clusters}) cannot exceed vocab_size ({self.vocab_size})."
            )
        for name in ("shortlist_k0", "shortlist_k1"):
            if getattr(self, name) > self.num_clusters:
                raise ValueError(
                    f"DynaSpecConfig.{name} ({getattr(self, name)}) cannot exceed num_clusters ({self.num_clusters})."
                )
        self._validate_architecture()
        self._validate_layer()
        if self.shortlist_schedule not in SCHEDULES:
            raise ValueError(f"shortlist_schedule must be one of {SCHEDULES}, got {self.shortlist_schedule!r}.")
        bad = [i for i in self.always_include_ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise ValueError(f"always_include_ids {bad} are outside the vocabulary [0, {self.vocab_size}).")
        if not 0 <= self.static_shortlist_size <= self.vocab_size:
            raise ValueError(f"static_shortlist_size must be in [0, vocab_size], got {self.static_shortlist_size}.")
        if not isinstance(self.draft_vocab_size, int) or not 0 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be an integer in [0, vocab_size={self.vocab_size}], got "
                             f"{self.draft_vocab_size!r}.")
        variants = [n for n in EAGLE3_VARIANTS if getattr(self, n)]
        if (self.draft_vocab_size or variants) and self.drafter_architecture != "eagle3":
            raise ValueError(f"draft_vocab_size / {variants or 'the EAGLE-3 variants'} are for "
                             "drafter_architecture='eagle3' drafters.")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm exclude each other (one norm over the fused layers, or one "
                             "per layer): set one.")

    def _validate_architecture(self) -> None:
        if self.drafter_architecture not in ARCHITECTURES:
            raise ValueError(
                f"drafter_architecture must be one of {ARCHITECTURES}, got {self.drafter_architecture!r}."
            )
        if self.drafter_architecture == "eagle1" and self.target_layer_ids:
            raise ValueError(
                "target_layer_ids is for drafter_architecture='eagle3' (an EAGLE-1 drafter reads the target's "
                "final hidden state): drop it or set drafter_architecture='eagle3'."
            )
        if self.drafter_architecture == "eagle3" and self.layer_family != LAYER_FAMILY:
            raise ValueError(f"An EAGLE-3 drafter's layer is a Llama layer: layer_family must be {LAYER_FAMILY!r}.")
        num_layers = self.target_config.get("num_hidden_layers")
        bad = [i for i in self.target_layer_ids if not 0 <= i <= (num_layers if num_layers else i)]
        if self.layer_ids_from_target and self.target_layer_ids:
            raise ValueError("layer_ids_from_target fills target_layer_ids in at bind time: pass one or the other.")
        deferred = self.layer_ids_from_target
        if bad or (self.drafter_architecture == "eagle3" and not self.target_layer_ids and not deferred):
            raise ValueError(
                f"target_layer_ids {self.target_layer_ids} must be a non-empty list of indices into the target's "
                f"hidden states, 0..{num_layers} (0: embeddings, i: output of layer i - 1)."
            )

    def _validate_layer(self) -> None:
        from transformers.activations import ACT2FN

        if self.layer_hidden_act is not None and self.layer_hidden_act not in ACT2FN:
            raise ValueError(f"layer_hidden_act must be a transformers activation name (e.g. 'silu'), got "
                             f"{self.layer_hidden_act!r}.")
        size = self.layer_intermediate_size
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ValueError(f"layer_intermediate_size must be a positive integer or None, got {size!r}.")
        if (self.layer_hidden_act or size) and self.layer_family != LAYER_FAMILY:
            raise ValueError(f"layer_hidden_act / layer_intermediate_size set the Llama drafter layer's MLP: they "
                             f"need layer_family={LAYER_FAMILY!r}, this config has {self.layer_family!r}.")

    @property
    def feature_layer_ids(self) -> list[int]:
        """Indices of the target's `output_hidden_states` the drafter reads, concatenated in this order: the
        EAGLE-3 layers, or [-1] (the final normed state) for an EAGLE-1 drafter."""
        if self.layer_ids_from_target:
            raise ValueError("This drafter's target layers are the servers' default for its target: bind it to the "
                             "target first (`drafter.bind(target)`, or generate with it).")
        return list(self.target_layer_ids) if self.drafter_architecture == "eagle3" else [-1]

    @property
    def num_fused_layers(self) -> int:
        """How many target layers `fc` fuses (3, the servers' default, while they are resolved at bind time)."""
        return len(self.target_layer_ids) if self.target_layer_ids else len(eagle3_layer_ids(8))

    def resolve_layer_ids(self, num_layers: int) -> None:
        """Fill in the servers' default target layers for a target of `num_layers` layers (`layer_ids_from_target`)."""
        if self.layer_ids_from_target:
            self.target_config["num_hidden_layers"] = num_layers
            self.target_layer_ids = eagle3_layer_ids(num_layers)
            self.layer_ids_from_target = False

    def clusters_at_depth(self, depth: int, max_depth: int, k0: int | None = None, k1: int | None = None) -> int:
        """Cluster budget k_c(t) for draft position `depth` (0-based) of `max_depth` positions (`cluster_budget`)."""
        k0 = self.shortlist_k0 if k0 is None else k0
        k1 = self.shortlist_k1 if k1 is None else k1
        return cluster_budget(depth, max_depth, k0, k1, self.shortlist_schedule, self.num_clusters)

    def build_layer_config(self) -> PretrainedConfig:
        """The config of the single drafter layer: a Llama layer sized from the target (`layer_family="llama"`),
        or, for older checkpoints, the target family's own config with one layer."""
        if self.layer_family == LAYER_FAMILY:
            fields = llama_layer_fields(self.target_config)
            fields.update(hidden_size=self.hidden_size, vocab_size=self.vocab_size)
            if self.layer_hidden_act is not None:
                fields["hidden_act"] = self.layer_hidden_act
            if self.layer_intermediate_size is not None:
                fields["intermediate_size"] = self.layer_intermediate_size
            layer_config = AutoConfig.for_model(LAYER_FAMILY, **fields)
        elif self.layer_family == self.target_model_type:
            fields = {k: v for k, v in self.target_config.items() if k not in _DROPPED_TARGET_KEYS}
            fields.update(num_hidden_layers=1, hidden_size=self.hidden_size, vocab_size=self.vocab_size)
            try:
                layer_config = AutoConfig.for_model(self.target_model_type, **fields)
            except ValueError as err:
                raise ValueError(
                    f"Unknown target model type {self.target_model_type!r} in the drafter config: this "
                    "transformers version cannot build its decoder layer."
                ) from err
        else:
            raise ValueError(
                f"DynaSpecConfig.layer_family must be {LAYER_FAMILY!r} or the target's model_type "
                f"{self.target_model_type!r}, got {self.layer_family!r}."
            )
        layer_config._attn_implementation = self._attn_implementation or "sdpa"
        return layer_config

    @classmethod
    def from_target_config(cls, target_config: PretrainedConfig, **kwargs: Any) -> DynaSpecConfig:
        """Build a drafter config for a target (its text config), with drafter settings from `kwargs`."""
        check_setting_names(kwargs, cls.__init__, from_target=_FROM_TARGET)
        text_config = target_config.get_text_config()
        fields = {k: v for k, v in text_config.to_dict().items() if k not in _DROPPED_TARGET_KEYS}
        eos = text_config.eos_token_id if text_config.eos_token_id is not None else []
        eos_ids = [eos] if isinstance(eos, int) else list(eos)
        kwargs.setdefault("always_include_ids", eos_ids)
        kwargs.setdefault("target_name_or_path", getattr(target_config, "_name_or_path", None) or None)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            kwargs.setdefault(name, getattr(text_config, name, None))
        kwargs.setdefault("layer_family", LAYER_FAMILY)
        kwargs.setdefault("drafter_architecture", "eagle3")
        if kwargs["layer_family"] == LAYER_FAMILY:
            kwargs.setdefault("layer_hidden_act", SERVED_ACTIVATION)
        return cls(
            vocab_size=text_config.vocab_size,
            hidden_size=text_config.hidden_size,
            target_model_type=text_config.model_type,
            target_config=fields,
            **kwargs,
        )


_FROM_TARGET = ("vocab_size", "hidden_size", "target_model_type", "target_config")  # from_target_config's own


def check_setting_names(settings: dict[str, Any], init: Any, from_target: tuple[str, ...] = ()) -> None:
    """Raise `ValueError` naming each setting that `init` (a config's `__init__`) does not declare, or that is
    read `from_target`, with the closest declared name: PretrainedConfig would otherwise keep a misspelt drafter
    setting as a stray attribute."""
    skipped = ("self", "kwargs", *from_target)
    declared = [name for name in inspect.signature(init).parameters if name not in skipped]
    unknown = sorted(set(settings) - set(declared))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, declared, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"Unknown drafter setting(s) {', '.join(hints)}. Known: {', '.join(declared)}"
            + (f" ({', '.join(from_target)} come from the target)." if from_target else ".")
        )


def llama_layer_fields(target: dict[str, Any]) -> dict[str, Any]:
    """A Llama decoder layer's config fields from a target's text config (any family): its width, heads,
    activation, norm epsilon and the rotary embedding of its full-attention layers."""
    heads = target["num_attention_heads"]
    rope = target.get("rope_parameters") or {}
    if "full_attention" in rope:  # per attention kind (Gemma 3): the global layers' rotary embedding
        rope = rope["full_attention"]
    if not rope and target.get("rope_theta") is not None:
        rope = {"rope_type": "default", "rope_theta": target["rope_theta"]}
    return dict(
        hidden_size=target["hidden_size"],
        intermediate_size=target.get("intermediate_size") or 4 * target["hidden_size"],
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=target.get("num_key_value_heads") or heads,
        head_dim=target.get("head_dim") or target["hidden_size"] // heads,
        hidden_act=target.get("hidden_activation") or target.get("hidden_act") or "silu",
        rms_norm_eps=target.get("rms_norm_eps") or target.get("layer_norm_eps") or 1e-6,
        max_position_embeddings=target.get("max_position_embeddings") or 4096,
        rope_parameters=dict(rope) or None,
        attention_bias=bool(target.get("attention_bias", False)),
    )


AutoConfig.register(MODEL_TYPE, DynaSpecConfig, exist_ok=True)

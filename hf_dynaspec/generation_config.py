"""DynaSpecGenerationConfig: the speculative settings, as a `GenerationConfig` subclass.

Defaults live on the drafter (`drafter.generation_config`, saved as `generation_config.json` beside its
weights), as transformers does for assistants. A `DynaSpecGenerationConfig` passed to `generate()` as
`generation_config=` overrides them per call; fields left at `None` inherit the drafter's value.
`resolve_draft_settings` merges both into a validated, frozen `DraftSettings` used by the decoding loop.

The draft tree's size depends on the device: verifying many nodes is dear on a CPU and nearly free on a GPU.
So the tree fields (`TREE_FIELDS`) also come per device type, in `device_trees={"cpu": {...}, "cuda": {...}}`,
which applies over the same config's flat fields when the target runs on that device type. The library's own
per-device trees (`DEFAULT_DEVICE_TREES`) are chosen from measured costs (`benchmarks/device_tree.py`).

    python -c "from hf_dynaspec import DynaSpecGenerationConfig as C; print(C(tree_policy='dyspec').to_json_string())"
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from .configuration import DynaSpecConfig
from .head import LAYOUTS
from .head_modes import head_modes, head_named

TREE_POLICIES = ("eagle2", "dyspec", "chain")
# How DynaSpec runs, not what it decides: set in one sub-object, `implementation=` (`ImplementationConfig`); the
# automatic choice is each one's default. Set flat (the names' first home) they still load, with a FutureWarning.
IMPLEMENTATION_FIELDS = ("shortlist_layout", "tree_growth", "draft_graphs", "verify_head", "synchronize_timers",
                         "count_host_reads")
SPEC_FIELDS = (
    "tree_policy",
    "num_draft_nodes",
    "draft_depth",
    "draft_top_k",
    "head_mode",
    "shortlist_k0",
    "shortlist_k1",
    "static_size",
    "min_draft_prob",
    "lookup_num_tokens",
    "lookup_max_ngram",
    "lookup_min_ngram",
    "step_policy",
    "device_trees",
    "implementation",
)
# The fields that size the draft tree: what `device_trees` may set per device type.
TREE_FIELDS = ("tree_policy", "num_draft_nodes", "draft_depth", "draft_top_k", "min_draft_prob", "step_policy")
# Settings the step policy replaced (`generation.planning.policy`): their inert values load (older generation_config.json
# files carry them); any other value is refused with what to use instead.
REMOVED_FIELDS = {"verify_costs": ("off",), "draft_gate": (False,)}
STEP_POLICIES = ("auto", "off")
# Defaults; the tree is the one for CPUs (small: verification of many nodes is costly there; docs/architecture.md).
DEFAULT_SETTINGS = dict(
    tree_policy="eagle2", num_draft_nodes=12, draft_depth=5, draft_top_k=4, head_mode="dynamic", min_draft_prob=0.0,
    lookup_num_tokens=8, lookup_max_ngram=3, lookup_min_ngram=1, step_policy="auto", static_size=None,
    synchronize_timers=False, shortlist_layout="auto", count_host_reads=False,
    tree_growth="auto", draft_graphs="auto", verify_head="auto",
)
SHORTLIST_LAYOUTS = ("auto", *LAYOUTS)
TREE_GROWTHS = ("auto", "host", "device")
DRAFT_GRAPHS = ("auto", "on", "off")
VERIFY_HEADS = ("auto", "full", "rows", "columns", "prefilter")  # "auto" and the walk layouts are CPU paths
GRAPH_DEVICE_TYPES = ("cuda",)  # where draft steps can be captured as graphs (`generation.drafting.graphs`)
# Per device type, over DEFAULT_SETTINGS: the tree with the best modelled speed from measured GPU costs and
# measured acceptance (`python benchmarks/device_tree.py`, results in benchmarks/results/cuda-default-tree).
DEFAULT_DEVICE_TREES: dict[str, dict[str, Any]] = {
    "cuda": dict(num_draft_nodes=48, draft_depth=3, draft_top_k=16, min_draft_prob=0.0),
}


@dataclass
class ImplementationConfig:
    """How DynaSpec runs on the target's device, not what it decides: each field's automatic choice is its
    default (None: the drafter's, else the library's), as transformers keeps `compile_config` apart. Fields are
    documented on `DynaSpecGenerationConfig`; a dict with the same keys works wherever this does."""

    shortlist_layout: str | None = None
    tree_growth: str | None = None
    draft_graphs: str | None = None
    verify_head: str | None = None
    synchronize_timers: bool | None = None
    count_host_reads: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set."""
        return {name: value for name, value in asdict(self).items() if value is not None}


def implementation_dict(value: ImplementationConfig | dict | None) -> dict[str, Any] | None:
    """`implementation=` as a dict of the fields set (None: nothing set); unknown keys refused."""
    if value is None:
        return None
    if isinstance(value, ImplementationConfig):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - set(IMPLEMENTATION_FIELDS):
        raise ValueError(f"implementation= takes an ImplementationConfig or a dict with keys from "
                         f"{IMPLEMENTATION_FIELDS}, got {value!r}.")
    return {name: field for name, field in value.items() if field is not None} or None


def split_implementation(fields: dict[str, Any]) -> dict[str, Any]:
    """Settings given flat, as keyword arguments: the implementation ones gathered into `implementation`."""
    implementation = {**(implementation_dict(fields.get("implementation")) or {}),
                      **{k: v for k, v in fields.items() if k in IMPLEMENTATION_FIELDS}}
    rest = {k: v for k, v in fields.items() if k not in IMPLEMENTATION_FIELDS and k != "implementation"}
    return {**rest, "implementation": implementation} if implementation else rest


def moved_to_implementation(name: str, value: Any) -> None:
    """The FutureWarning of an implementation setting set flat."""
    warnings.warn(f"{name}={value!r} set flat is deprecated: pass implementation={{{name!r}: {value!r}}} (settings "
                  "that choose how DynaSpec runs, not what it decides, live in `implementation`).", FutureWarning,
                  stacklevel=4)


class DynaSpecGenerationConfig(GenerationConfig):
    r"""[`GenerationConfig`] with the settings of DynaSpec speculative decoding.

    Args:
        tree_policy (`str`): "eagle2" (top-k per depth, global re-rank by cumulative log-probability),
            "dyspec" (greedy expansion of the most probable candidate paths until the node budget is spent),
            or "chain" (one draft per depth).
        num_draft_nodes (`int`): node budget of the draft tree, root excluded (1..1024).
        draft_depth (`int`): maximum draft depth (1..64).
        draft_top_k (`int`): children proposed per expanded node, and nodes expanded per drafter call.
        head_mode (`str`): drafter head: "dynamic" (router shortlist), "full" (whole vocabulary), "static" (the
            drafter's stored frequent tokens), "context" (the context's tokens + the static set as a core,
            NanoSpec), "union" (router shortlist + the context's tokens) or "trained" (the drafter's own trained
            head over its draft vocabulary: an EAGLE-3 checkpoint trained elsewhere).
        shortlist_k0 / shortlist_k1 (`int`): clusters kept at the first / deepest draft position
            (default: the drafter config's).
        min_draft_prob (`float`): drafts whose path probability q(path) (the product of the draft
            probabilities from the root) falls below this are neither verified nor expanded, so the tree
            shrinks where the drafter is unsure (0: off). Verification stays exact whatever the value.
        lookup_num_tokens (`int`): length of the lookup branch: the tokens that followed the latest earlier
            occurrence of the sequence's last n tokens (prompt lookup), grafted onto the tree as one more
            root path (0: off). Helps where answers copy the prompt or repeat themselves.
        lookup_max_ngram / lookup_min_ngram (`int`): n-gram sizes tried for the lookup, longest first.
        step_policy (`str`): "auto" (before each step, choose the tree that maximises expected tokens per
            second from the target's measured verification costs, the drafter's measured costs and acceptance
            estimates calibrated on this sequence: a drafted tree of some depth trimmed to what its verification
            pays for, the lookup branch alone, or a plain step; `generation.planning.policy`) or "off" (the whole
            configured tree every step).
        static_size (`int`, *optional*): "static" head: use only the N most frequent tokens of the drafter's
            frequency-ranked static shortlist (None: all of it), e.g. to compare shortlist sizes in one run;
            "context" head: the size of its frequent core (NanoSpec keeps it under 3k tokens).
        device_trees (`dict[str, dict]`): tree fields per device type, e.g.
            `{"cpu": {"num_draft_nodes": 12}, "cuda": {"num_draft_nodes": 60, "draft_depth": 6}}`: where the
            target runs on that device type, they override this config's flat fields (keys: `TREE_FIELDS`).
        implementation (`ImplementationConfig` or `dict`): how DynaSpec runs, not what it decides; each field's
            automatic choice is its default (set flat, as before, they still load, with a FutureWarning):
            synchronize_timers (`bool`): on CUDA, synchronise around each timed section of `speculative_stats`
                so its times measure work rather than kernel launches (slows decoding; for profiling).
            shortlist_layout (`str`): how the "dynamic" and "union" heads lay out their shortlists: "union" (the
                union of the positions' clusters in one GEMM, planned on the host: one host read per head call),
                "lanes" (each position's own clusters in fixed-size lanes: no host read, for CUDA graphs and
                compiled steps) or "auto" ("lanes" on CUDA, "union" elsewhere). Same drafts either way.
            tree_growth (`str`): where the "eagle2" and "chain" trees grow: "host" (each expansion's proposals read
                on the host to pick the next: one host read per draft depth), "device" (fixed-shape tensor ops, the
                tree read once; `generation.drafting.tree`, a pool without host columns) or "auto" ("device" on CUDA, "host"
                elsewhere). Same trees.
                "dyspec" trees always grow on the host.
            draft_graphs (`str`): run each draft step of device-grown trees as a captured CUDA graph, one per step
                shape (`generation.drafting.graphs`; a capture that fails runs eagerly, with the reason logged): "on", "off"
                or "auto" ("on" where it applies: CUDA, `tree_growth="device"`, an "eagle2" or "chain" tree, head
                "dynamic" with the "lanes" layout, "static" or "full"). Same drafts either way.
            verify_head (`str`): how verification applies the target's LM head: "full" (every node's logits in the
                verification pass), "rows" / "columns" (only along the walk, the rows the walk reaches, in the
                head's own or a transposed layout), "prefilter" (greedy without logits processors or kept scores
                only: each walk row's exact argmax from a bf16 copy of the head and an fp32 rescoring of the tokens
                its error bound leaves, `generation.verification.prefilter`) or "auto" (on CPU the fastest here of those the
                call can use, learned from the call's own verifications; "full" elsewhere). Same output either way.
            count_host_reads (`bool`): count the reads of device values on the host in each decoding step (each is a
                GPU synchronisation), ours and the target forward's apart, into `speculative_stats` (slows decoding:
                every tensor operation is intercepted; for profiling).
    """

    def __init__(
        self,
        tree_policy: str | None = None,
        num_draft_nodes: int | None = None,
        draft_depth: int | None = None,
        draft_top_k: int | None = None,
        head_mode: str | None = None,
        shortlist_k0: int | None = None,
        shortlist_k1: int | None = None,
        min_draft_prob: float | None = None,
        lookup_num_tokens: int | None = None,
        lookup_max_ngram: int | None = None,
        lookup_min_ngram: int | None = None,
        step_policy: str | None = None,
        static_size: int | None = None,
        device_trees: dict[str, dict[str, Any]] | None = None,
        implementation: ImplementationConfig | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.tree_policy = tree_policy
        self.num_draft_nodes = num_draft_nodes
        self.draft_depth = draft_depth
        self.draft_top_k = draft_top_k
        self.head_mode = head_mode
        self.shortlist_k0 = shortlist_k0
        self.shortlist_k1 = shortlist_k1
        self.min_draft_prob = min_draft_prob
        self.lookup_num_tokens = lookup_num_tokens
        self.lookup_max_ngram = lookup_max_ngram
        self.lookup_min_ngram = lookup_min_ngram
        self.step_policy = step_policy
        self.static_size = static_size
        self.device_trees = device_trees
        chosen = dict(implementation_dict(implementation) or {})
        for name in IMPLEMENTATION_FIELDS:  # set flat: still honoured, with a FutureWarning
            if kwargs.get(name) is not None:
                moved_to_implementation(name, kwargs[name])
                chosen = merge_flat(chosen, name, kwargs[name])
            kwargs.pop(name, None)
        self.implementation = chosen or None
        super().__init__(**kwargs)

    def speculative_fields(self) -> dict[str, Any]:
        """The speculative fields that are set (not None)."""
        return speculative_fields_of(self)

    def validate(self, strict: bool = False, user_set_attributes: set[str] | None = None) -> None:
        super().validate(strict=strict, user_set_attributes=user_set_attributes)
        check_speculative_fields(self.speculative_fields())


def speculative_fields_of(config: GenerationConfig | None) -> dict[str, Any]:
    """The speculative fields set on any generation config: a `DynaSpecGenerationConfig`'s, or those set on a
    plain `GenerationConfig` (`GenerationConfig(tree_policy=...)` keeps unknown keys as attributes, and the
    generate() hook moves DynaSpec keyword arguments onto the call's config), so none is silently dropped."""
    if config is None:
        return {}
    check_removed_fields(config)
    fields = {name: getattr(config, name) for name in SPEC_FIELDS if getattr(config, name, None) is not None}
    chosen = dict(implementation_dict(fields.pop("implementation", None)) or {})
    for name in IMPLEMENTATION_FIELDS:  # set flat on a plain GenerationConfig, or moved there from generate()
        if getattr(config, name, None) is not None:
            moved_to_implementation(name, getattr(config, name))
            chosen = merge_flat(chosen, name, getattr(config, name))
    return {**fields, **chosen}


def merge_flat(chosen: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """`chosen` with an implementation setting given flat; refused where `implementation` sets it otherwise."""
    if chosen.get(name, value) != value:
        raise ValueError(f"{name} is set twice, {value!r} flat and {chosen[name]!r} in implementation=: set it once, "
                         "in implementation=.")
    return {**chosen, name: value}


def check_removed_fields(config: GenerationConfig) -> None:
    """A removed setting (`REMOVED_FIELDS`) set to anything but its inert value is refused, never ignored."""
    for name, inert in REMOVED_FIELDS.items():
        value = getattr(config, name, None)
        if value is not None and value not in inert:
            raise ValueError(
                f"{name}={value!r} was replaced by the step policy (step_policy='auto', the default), which "
                "trims each tree to what its verification pays for and decodes plainly where no draft pays; drop "
                f"{name}, or set step_policy='off' to verify the whole configured tree every step."
            )


@dataclass(frozen=True)
class DraftSettings:
    """Concrete, validated settings of one generate() call (every field set by `resolve_draft_settings`;
    the defaults live in DEFAULT_SETTINGS and, per device type, DEFAULT_DEVICE_TREES only)."""

    tree_policy: str
    num_draft_nodes: int
    draft_depth: int
    draft_top_k: int
    head_mode: str
    shortlist_k0: int
    shortlist_k1: int
    min_draft_prob: float
    lookup_num_tokens: int
    lookup_max_ngram: int
    lookup_min_ngram: int
    step_policy: str
    static_size: int | None
    synchronize_timers: bool
    shortlist_layout: str  # "union" or "lanes" ("auto" is resolved per device)
    count_host_reads: bool
    tree_growth: str  # "host" or "device" ("auto" is resolved per device)
    draft_graphs: str  # "on" or "off" ("auto" is resolved per device and settings)
    verify_head: str  # resolved at prefill, where the call's sampling and logits processors are known


def check_speculative_fields(fields: dict[str, Any]) -> None:
    """Raise `ValueError` naming the field and the valid range for impossible values."""
    choices = {"tree_policy": TREE_POLICIES, "head_mode": head_modes(), "shortlist_layout": SHORTLIST_LAYOUTS,
               "tree_growth": TREE_GROWTHS, "draft_graphs": DRAFT_GRAPHS, "verify_head": VERIFY_HEADS,
               "step_policy": STEP_POLICIES}
    ranges = {
        "num_draft_nodes": (1, 1024),
        "draft_depth": (1, 64),
        "draft_top_k": (1, 64),
        "shortlist_k0": (1, 1 << 20),
        "shortlist_k1": (1, 1 << 20),
        "lookup_num_tokens": (0, 64),
        "lookup_max_ngram": (1, 64),
        "lookup_min_ngram": (1, 64),
        "static_size": (1, 1 << 24),
    }
    for name, value in fields.items():
        if name == "static_size" and value is None:
            continue
        if name == "device_trees":
            check_device_trees(value)
        if name in ("synchronize_timers", "count_host_reads") and not isinstance(value, bool):
            raise ValueError(f"DynaSpecGenerationConfig.{name} must be True or False, got {value!r}.")
        if name == "min_draft_prob" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                         or not 0.0 <= value < 1.0):
            raise ValueError(f"DynaSpecGenerationConfig.min_draft_prob must be a number in [0, 1), got {value!r}.")
        if name in choices and value not in choices[name]:
            raise ValueError(f"DynaSpecGenerationConfig.{name} must be one of {choices[name]}, got {value!r}.")
        if name in ranges:
            low, high = ranges[name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(
                    f"DynaSpecGenerationConfig.{name} must be an integer in [{low}, {high}], got {value!r}."
                )


def check_device_trees(value: Any) -> None:
    """`device_trees`: {device type: {tree field: value}}, each value valid for its field."""
    if not isinstance(value, dict):
        raise ValueError(f"DynaSpecGenerationConfig.device_trees must be a dict {{device type: {{field: value}}}}, "
                         f"got {value!r}.")
    for device_type, tree in value.items():
        if not isinstance(device_type, str) or ":" in device_type or not _is_device_type(device_type):
            raise ValueError(f"DynaSpecGenerationConfig.device_trees keys are device types such as 'cpu' or 'cuda' "
                             f"(no index), got {device_type!r}.")
        unknown = sorted(set(tree) - set(TREE_FIELDS)) if isinstance(tree, dict) else None
        if unknown is None or unknown:
            raise ValueError(f"DynaSpecGenerationConfig.device_trees[{device_type!r}] sets tree fields only "
                             f"({', '.join(TREE_FIELDS)}); got {tree!r}: set other fields flat.")
        check_speculative_fields(tree)


def _is_device_type(name: str) -> bool:
    try:
        return torch.device(name).type == name
    except RuntimeError:
        return False


def check_static_size(static_size: int | None, head_mode: str, drafter_config: DynaSpecConfig) -> None:
    """`static_size` sizes the static shortlist of the heads that read it, and needs a frequency-ranked static
    shortlist at least that long in the drafter."""
    if static_size is None:
        return
    if not head_named(head_mode).reads_static:
        raise ValueError(
            f"static_size={static_size} sizes the static shortlist of head_mode 'static' or the frequent core of "
            f"head_mode 'context'; head_mode={head_mode!r} does not read it: drop static_size or change head_mode."
        )
    stored = drafter_config.static_shortlist_size
    if not drafter_config.static_shortlist_ranked or static_size > stored:
        raise ValueError(
            f"static_size={static_size} needs a frequency-ranked static shortlist of at least that many tokens; "
            f"the drafter stores {stored} ({'ranked' if drafter_config.static_shortlist_ranked else 'by id'}). "
            "Store one with `hf-dynaspec static --size N`."
        )


def default_drafter_generation_config(shortlist_k0: int, shortlist_k1: int) -> DynaSpecGenerationConfig:
    """The defaults a fresh drafter carries: all but the tree, which it takes per device from the library
    (`DEFAULT_SETTINGS`, `DEFAULT_DEVICE_TREES`) until a tuned tree is stored in its `device_trees`."""
    flat = {k: v for k, v in DEFAULT_SETTINGS.items() if k not in (*TREE_FIELDS, *IMPLEMENTATION_FIELDS)}
    implementation = {k: v for k, v in DEFAULT_SETTINGS.items() if k in IMPLEMENTATION_FIELDS}
    return DynaSpecGenerationConfig(shortlist_k0=shortlist_k0, shortlist_k1=shortlist_k1,
                                    implementation=implementation, **flat)


def resolve_draft_settings(
    call_config: GenerationConfig | None, drafter_generation_config: GenerationConfig | None,
    drafter_config: DynaSpecConfig, device_type: str = "cpu",
) -> DraftSettings:
    """Per-call fields override the drafter's generation defaults, which override the library defaults (and
    the drafter config's shortlist budget). At each level a config's `device_trees[device_type]` (the type of
    the target's device) overrides its flat fields. A level that picks a head which does not read `static_size`
    drops a lower level's (a drafter shipped with a sized static head still runs `head_mode="dynamic"`)."""
    num_clusters = drafter_config.num_clusters
    merged: dict[str, Any] = dict(DEFAULT_SETTINGS)
    merged.update(DEFAULT_DEVICE_TREES.get(device_type, {}))
    merged.update(shortlist_k0=drafter_config.shortlist_k0, shortlist_k1=drafter_config.shortlist_k1)
    for config in (drafter_generation_config, call_config):
        fields = speculative_fields_of(config)
        trees = fields.pop("device_trees", {})
        check_speculative_fields({"device_trees": trees})
        if fields.get("head_mode") is not None and not head_named(fields["head_mode"]).reads_static \
                and "static_size" not in fields:
            fields["static_size"] = None  # a lower level's list size went with its head, which this level replaces
        merged.update(fields)
        merged.update(trees.get(device_type, {}))
    check_speculative_fields(merged)
    if merged["lookup_min_ngram"] > merged["lookup_max_ngram"]:
        raise ValueError(
            f"DynaSpecGenerationConfig.lookup_min_ngram={merged['lookup_min_ngram']} exceeds "
            f"lookup_max_ngram={merged['lookup_max_ngram']}; set lookup_min_ngram <= lookup_max_ngram."
        )
    for name in ("shortlist_k0", "shortlist_k1"):
        if merged[name] > num_clusters:
            raise ValueError(
                f"DynaSpecGenerationConfig.{name}={merged[name]} exceeds the drafter's {num_clusters} clusters."
            )
    check_static_size(merged["static_size"], merged["head_mode"], drafter_config)
    check_head_available(merged["head_mode"], drafter_config)
    if merged["shortlist_layout"] == "auto":
        merged["shortlist_layout"] = "lanes" if device_type == "cuda" else "union"
    if merged["tree_growth"] == "auto":
        merged["tree_growth"] = "device" if device_type == "cuda" else "host"
    if merged["tree_policy"] == "chain":
        merged["draft_top_k"] = 1
        merged["num_draft_nodes"] = min(merged["num_draft_nodes"], merged["draft_depth"])
    merged["draft_graphs"] = resolve_draft_graphs(merged, device_type)
    return DraftSettings(**merged)


def check_head_available(head_mode: str, drafter_config: DynaSpecConfig) -> None:
    """Raise `ValueError` saying what to do when the drafter cannot run `head_mode` (an unfitted router, no own
    trained head: `HeadMode.check_drafter`)."""
    head_named(head_mode).check_drafter(drafter_config)


def resolve_draft_graphs(merged: dict[str, Any], device_type: str) -> str:
    """"on" / "off" for the resolved settings: "auto" turns graphs on wherever they apply, "on" raises where they
    cannot (saying what to change), "off" stays off."""
    wanted = merged["draft_graphs"]
    if wanted == "off":
        return "off"
    blockers = []
    head_blocker = head_named(merged["head_mode"]).graph_blocker(merged["shortlist_layout"])
    if device_type not in GRAPH_DEVICE_TYPES:
        blockers.append(f"the target runs on {device_type!r} (graphs are CUDA graphs)")
    if merged["tree_growth"] != "device" or merged["tree_policy"] == "dyspec":
        blockers.append("trees must grow on the device (tree_growth='device', tree_policy 'eagle2' or 'chain')")
    if head_blocker is not None:
        blockers.append(head_blocker)
    if wanted == "on" and blockers:
        raise ValueError("DynaSpecGenerationConfig.draft_graphs='on' cannot apply: " + "; ".join(blockers)
                         + ". Change that, or set draft_graphs='auto' / 'off'.")
    return "off" if blockers else "on"

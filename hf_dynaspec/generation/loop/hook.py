"""Routes `target.generate(..., assistant_model=<DynaSpecDrafter>)` to DynaSpec's tree decoding.

transformers looks the decoding method up by name on the model's class at every call
(`GENERATION_MODES_MAPPING[mode]` -> `_assisted_decoding`), and hands it the prepared processors, stopping
criteria, cache, streamer and assistant. We wrap three methods of `GenerationMixin`, once, idempotently:
- `_assisted_decoding`: when the assistant is a `DynaSpecDrafter`, run `speculative_decode`; otherwise call
  transformers' own method unchanged.
- `_validate_generation_mode`: a DynaSpec drafter with beam search (which transformers would silently ignore)
  is refused, and so are DynaSpec settings without a DynaSpec drafter; transformers' own assisted-generation
  settings are mapped onto DynaSpec's or refused (`hf_dynaspec.assisted_settings`); `num_return_sequences` > 1, which
  transformers refuses for assisted generation, is let through (its rows are decoded as a batch).
- `_prepare_generation_config`: DynaSpec settings passed as generate() keyword arguments land on the call's
  generation config (plain or DynaSpec), where the decoding loop reads them.
A drafter may also be named: `generate(assistant_model="<folder or Hub id>")` and `pipeline(...,
assistant_model="<folder or Hub id>")` (transformers' `pipelines.base.load_assistant_model`, wrapped too) load a
DynaSpec drafter or an EAGLE-3 checkpoint trained elsewhere (`hf_dynaspec.checkpoints`) once per target and
process, bound to the target (`assistant_for`).
At install the wrapped methods' signatures are checked against what the wrappers call (`EXPECTED`): a
transformers release that renamed or reordered them fails at `import hf_dynaspec` with an error naming the
supported range, not in the middle of a generation.
Why not `custom_generate=`? A callable `custom_generate` does not receive `assistant_model` or `streamer`,
and unknown generate() kwargs are rejected (checked on transformers 5.24); this hook keeps the plain
`assistant_model=drafter` contract that `pipeline(..., assistant_model=drafter)` also uses.

    python -c "import hf_dynaspec; from transformers import GenerationMixin as G; print(G._assisted_decoding)"
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import weakref
from importlib import metadata

import transformers
from transformers.generation.utils import GenerationMixin, GenerationMode
from transformers.pipelines import base as pipelines_base

from ...assisted_settings import USER_SET, apply_assisted_settings, user_set_fields
from ...generation_config import (
    IMPLEMENTATION_FIELDS,
    REMOVED_FIELDS,
    SPEC_FIELDS,
    implementation_dict,
    speculative_fields_of,
)
from ...modeling import DynaSpecDrafter, names_a_drafter
from .decoding import speculative_decode

_MARK = "__hf_dynaspec_hook__"
# The leading parameters each wrapped method must have, and keyword arguments it must accept.
EXPECTED = {
    "_assisted_decoding": (
        ("self", "input_ids", "logits_processor", "stopping_criteria", "generation_config"),
        ("assistant_model", "streamer", "synced_gpus"),
    ),
    "_validate_generation_mode": (("self", "generation_mode", "generation_config", "generation_mode_kwargs"), ()),
    "_prepare_generation_config": (("self", "generation_config"), ()),
}


def _is_drafter(model: object) -> bool:
    return isinstance(model, DynaSpecDrafter)


_ASSISTANTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {name: drafter bound to it}


def assistant_for(target, name: str | os.PathLike) -> DynaSpecDrafter:
    """The drafter `name` (a DynaSpec drafter or an EAGLE-3 checkpoint; folder or Hub id) bound to `target`, loaded
    once per target and process."""
    loaded = _ASSISTANTS.setdefault(target, {})
    key = str(name)
    if key not in loaded:
        if not names_a_drafter(key):
            raise ValueError(
                f"assistant_model={key!r} names no DynaSpec drafter or EAGLE-3 checkpoint (its config.json is missing "
                "or of another kind): a named assistant must be one of those; load any other assistant model "
                "yourself (AutoModelForCausalLM.from_pretrained) and pass the model."
            )
        loaded[key] = DynaSpecDrafter.from_pretrained(key, target=target)
    return loaded[key]


def supported_transformers() -> str:
    """The transformers requirement this package was installed with (from its metadata)."""
    try:
        requirements = metadata.requires("hf-dynaspec") or []
    except metadata.PackageNotFoundError:
        return "the range in hf-dynaspec's pyproject.toml"
    return next((r for r in requirements if r.replace(" ", "").startswith("transformers")), "transformers")


def check_signature(name: str, method: object) -> None:
    """Raise `RuntimeError` when `GenerationMixin.<name>` does not take what the wrapper passes."""
    leading, keywords = EXPECTED[name]
    params = inspect.signature(method).parameters
    names = list(params)
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [k for k in keywords if k not in params and not takes_any_keyword]
    if tuple(names[: len(leading)]) != leading or missing or not hasattr(GenerationMode, "ASSISTED_GENERATION"):
        raise RuntimeError(
            f"hf-dynaspec cannot hook transformers {transformers.__version__}: GenerationMixin.{name} has "
            f"parameters {names}, expected {list(leading)} first and keyword arguments {list(keywords)}. "
            f"Install a supported version: pip install '{supported_transformers()}'."
        )


def _wrap_assisted_decoding(original):
    @functools.wraps(original)
    def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs):
        assistant = kwargs.get("assistant_model")
        if not _is_drafter(assistant):
            return original(self, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs)
        model_kwargs = {k: v for k, v in kwargs.items() if k not in _DECODING_KWARGS}
        return speculative_decode(
            self,
            input_ids,
            assistant,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            streamer=kwargs.get("streamer"),
            model_kwargs=model_kwargs,
        )

    setattr(_assisted_decoding, _MARK, original)
    return _assisted_decoding


def _wrap_validate_generation_mode(original):
    @functools.wraps(original)
    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        assistant = generation_mode_kwargs.get("assistant_model")
        if isinstance(assistant, str | os.PathLike):  # a named drafter: loaded here, passed on as the model
            assistant = generation_mode_kwargs["assistant_model"] = assistant_for(self, assistant)
        if _is_drafter(assistant):
            if generation_mode != GenerationMode.ASSISTED_GENERATION:
                raise ValueError(
                    f"A DynaSpec drafter works with greedy decoding or sampling (num_beams=1), not with "
                    f"{generation_mode.value}; set num_beams=1 or drop `assistant_model`."
                )
            assistant.check_target(self)
            arguments = {name: generation_mode_kwargs.get(name) for name in ("assistant_tokenizer", "synced_gpus")}
            apply_assisted_settings(generation_config, getattr(generation_config, USER_SET, ()), arguments,
                                    {"cache_implementation": (self.generation_config.cache_implementation,)})
            if generation_config.num_return_sequences > 1:  # transformers refuses it for assisted generation;
                # the inputs are already expanded to one row per sequence, which DynaSpec decodes as a batch
                generation_config = copy.copy(generation_config)
                generation_config.num_return_sequences = 1
        elif fields := speculative_fields_of(generation_config):
            raise ValueError(
                f"DynaSpec settings {sorted(fields)} need a DynaSpec drafter: pass "
                "`assistant_model=DynaSpecDrafter.from_pretrained(...)`, or drop them."
            )
        return original(self, generation_mode, generation_config, generation_mode_kwargs)

    setattr(_validate_generation_mode, _MARK, original)
    return _validate_generation_mode


def _wrap_prepare_generation_config(original):
    @functools.wraps(original)
    def _prepare_generation_config(self, generation_config, *args, **kwargs):
        """DynaSpec keyword arguments of generate() (tree_policy=..., ...) become attributes of the call's
        config (a copy) instead of unknown model kwargs, so they are honoured, or refused without a drafter. The
        transformers settings the call set itself (before transformers fills in its global defaults) are noted on
        the config (`USER_SET`), for `apply_assisted_settings` to map with a DynaSpec drafter."""
        user_set = user_set_fields(generation_config, self.generation_config, kwargs)
        config, model_kwargs = original(self, generation_config, *args, **kwargs)
        setattr(config, USER_SET, sorted(user_set))
        for name in (*SPEC_FIELDS, *IMPLEMENTATION_FIELDS, *REMOVED_FIELDS):  # a removed one is refused by name
            if name in model_kwargs:
                setattr(config, name, model_kwargs.pop(name))
        if getattr(config, "implementation", None) is not None:  # kept as a dict: the config stays serialisable
            config.implementation = implementation_dict(config.implementation)
        return config, model_kwargs

    setattr(_prepare_generation_config, _MARK, original)
    return _prepare_generation_config


_DECODING_KWARGS = ("assistant_model", "streamer", "synced_gpus", "inputs_tensor", "tokenizer", "assistant_tokenizer")
_WRAPPERS = {
    "_assisted_decoding": _wrap_assisted_decoding,
    "_validate_generation_mode": _wrap_validate_generation_mode,
    "_prepare_generation_config": _wrap_prepare_generation_config,
}


def _wrap_load_assistant_model(original):
    @functools.wraps(original)
    def load_assistant_model(model, assistant_model, assistant_tokenizer):
        """A named DynaSpec drafter or EAGLE-3 checkpoint: loaded with its own loader (transformers would build
        an EAGLE-3 checkpoint as a one-layer LlamaForCausalLM); it shares the target's tokenizer."""
        if isinstance(assistant_model, str) and names_a_drafter(assistant_model):
            return assistant_for(model, assistant_model), None
        return original(model, assistant_model, assistant_tokenizer)

    setattr(load_assistant_model, _MARK, original)
    return load_assistant_model


PIPELINE_LOADER = ("model", "assistant_model", "assistant_tokenizer")  # pipelines.base.load_assistant_model's


def install() -> None:
    """Install the hooks on `GenerationMixin` and the pipelines' assistant loader (idempotent); `RuntimeError` on
    an unsupported transformers."""
    pending = {name: getattr(GenerationMixin, name) for name in _WRAPPERS}
    pending = {name: method for name, method in pending.items() if not hasattr(method, _MARK)}
    for name, method in pending.items():
        check_signature(name, method)  # all checked before any is wrapped
    loader = pipelines_base.load_assistant_model
    if not hasattr(loader, _MARK) and tuple(inspect.signature(loader).parameters) != PIPELINE_LOADER:
        raise RuntimeError(
            f"hf-dynaspec cannot hook transformers {transformers.__version__}: pipelines.base.load_assistant_model "
            f"takes {list(inspect.signature(loader).parameters)}, expected {list(PIPELINE_LOADER)}. Install a "
            f"supported version: pip install '{supported_transformers()}'."
        )
    for name, method in pending.items():
        setattr(GenerationMixin, name, _WRAPPERS[name](method))
    if not hasattr(loader, _MARK):
        pipelines_base.load_assistant_model = _wrap_load_assistant_model(loader)


def uninstall() -> None:
    """Restore transformers' own methods."""
    for name in _WRAPPERS:
        current = getattr(GenerationMixin, name)
        if hasattr(current, _MARK):
            setattr(GenerationMixin, name, getattr(current, _MARK))
    if hasattr(pipelines_base.load_assistant_model, _MARK):
        pipelines_base.load_assistant_model = getattr(pipelines_base.load_assistant_model, _MARK)

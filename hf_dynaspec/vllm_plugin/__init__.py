"""The vLLM plugin: DynaSpec's dynamic head inside vLLM's own EAGLE-3 speculative decoding (docs/vllm-plugin.md).

Installed beside vLLM, it is found through the `vllm.general_plugins` entry point (`dynaspec`), and `register()`
adds the draft model class of "vllm-dynaspec" folders (`hf-dynaspec export DRAFTER OUT --format vllm-dynaspec`).
Nothing here imports vLLM until vLLM calls `register()`, so the package imports where vLLM is absent.

    from vllm import LLM
    llm = LLM(model=TARGET, speculative_config={"method": "eagle3", "model": OUT, "num_speculative_tokens": 3})
"""

from __future__ import annotations

from ..vllm_export import ARCHITECTURE
from .timing import ENV, install_draft_timer

DRAFT_CLASS = "hf_dynaspec.vllm_plugin.draft:DynaSpecEagle3"  # imported by vLLM when a folder names it
# vLLM's Gemma 3 captures no intermediate hidden states: replaced by a subclass that does (gemma3.py)
TARGET_CLASSES = {"Gemma3ForCausalLM": "hf_dynaspec.vllm_plugin.gemma3:Gemma3ForCausalLMEagle3"}


def register() -> None:
    """vLLM's plugin hook: the draft class under the architecture a vllm-dynaspec folder names, targets made
    EAGLE-3-capable, and with `HF_DYNASPEC_DRAFT_TIMES` set, the proposer's draft step timed (timing.py)."""
    import os

    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, DRAFT_CLASS)
    for name, target_class in TARGET_CLASSES.items():
        ModelRegistry.register_model(name, target_class)
    if os.environ.get(ENV):  # draft-step timing (timing.py), any draft model's
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        install_draft_timer(SpecDecodeBaseProposer, os.environ[ENV])

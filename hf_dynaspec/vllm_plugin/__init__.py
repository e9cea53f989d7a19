"""The vLLM plugin: DynaSpec's dynamic head inside vLLM's own EAGLE-3 speculative decoding (docs/vllm-plugin.md).

Installed beside vLLM, it is found through the `vllm.general_plugins` entry point (`dynaspec`), and `register()`
adds the draft model class of "vllm-dynaspec" folders (`hf-dynaspec export DRAFTER OUT --format vllm-dynaspec`).
Nothing here imports vLLM until vLLM calls `register()`, so the package imports where vLLM is absent.

    from vllm import LLM
    llm = LLM(model=TARGET, speculative_config={"method": "eagle3", "model": OUT, "num_speculative_tokens": 3})
"""

from __future__ import annotations

from ..vllm_export import ARCHITECTURE

DRAFT_CLASS = "hf_dynaspec.vllm_plugin.draft:DynaSpecEagle3"  # imported by vLLM when a folder names it


def register() -> None:
    """vLLM's plugin hook: the draft class under the architecture a vllm-dynaspec folder names."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, DRAFT_CLASS)

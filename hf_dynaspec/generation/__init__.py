"""Tree speculative decoding inside transformers' generate(): config, tree, verification, loop, hook."""

from ..generation_config import (
    DraftSettings,
    DynaSpecGenerationConfig,
    ImplementationConfig,
    resolve_draft_settings,
)
from .loop.stats import DynaSpecGenerateOutput, SpeculativeStats

__all__ = [
    "DraftSettings",
    "DynaSpecGenerateOutput",
    "DynaSpecGenerationConfig",
    "ImplementationConfig",
    "SpeculativeStats",
    "resolve_draft_settings",
]

"""hf-dynaspec: lossless speculative decoding for transformers with DynaSpec drafters and dynamic trees.

    import hf_dynaspec                      # installs the generate() hook
    drafter = hf_dynaspec.DynaSpecDrafter.from_pretrained("path/or/repo")
    out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=64)
"""

from . import checkpoints as _checkpoints  # noqa: F401  (lets from_pretrained open EAGLE-3 checkpoints)
from .configuration import DynaSpecConfig
from .cpu import prepare_for_cpu
from .generation import (
    DynaSpecGenerateOutput,
    DynaSpecGenerationConfig,
    ImplementationConfig,
    SpeculativeStats,
)
from .generation.drafting.candidates import DynaSpecCandidateGenerator
from .generation.loop.hook import install as _install_generate_hook
from .generation.planning.calibration import measure_verify_costs
from .modeling import DrafterOutput, DynaSpecDrafter
from .ops import gathered_lm_head

__version__ = "0.1.0"

_install_generate_hook()

__all__ = [
    "DrafterOutput",
    "DynaSpecCandidateGenerator",
    "DynaSpecConfig",
    "DynaSpecDrafter",
    "DynaSpecGenerateOutput",
    "DynaSpecGenerationConfig",
    "ImplementationConfig",
    "SpeculativeStats",
    "gathered_lm_head",
    "measure_verify_costs",
    "prepare_for_cpu",
    "__version__",
]

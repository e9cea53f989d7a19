"""dynaspec_gathered_head: logits for a shortlist of vocabulary rows ("gathered LM head").

    logits = gathered_lm_head_*(hidden_states (N, d), weight (V, d), token_ids (S,))  # (N, S)
    logits[n, s] = sum_k hidden_states[n, k] * weight[token_ids[s], k]   (fp32 accumulation)

A standalone, pure-Python kernel package laid out for the Hugging Face Kernel Hub (see
``kernels/README.md``). It depends on torch only; triton is optional (``HAS_TRITON``).

- ``gathered_lm_head_reference``: the readable PyTorch spec (index_select, fp32 matmul).
- ``gathered_lm_head_triton``: fused gather + GEMM Triton kernel (CUDA, or CPU under
  ``TRITON_INTERPRET=1``).
- ``cluster_lm_head_reference`` / ``cluster_lm_head_triton``: each row's logits over its own clusters, walked
  through the cluster offset table into a fixed (T, K * width) shape, masked lanes -inf (``cluster_head.py``).

Tiny CPU check, from the repository root:

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'kernels/torch-ext'); import torch; \
import dynaspec_gathered_head as k; h, w, i = torch.randn(3, 40), torch.randn(500, 40), torch.arange(0, 500, 7); \
print((k.gathered_lm_head_triton(h, w, i) - k.gathered_lm_head_reference(h, w, i)).abs().max())"
"""

from .cluster_head import (
    check_cluster_inputs,
    cluster_lanes,
    cluster_lm_head_reference,
    cluster_lm_head_triton,
)
from .reference import check_inputs, gathered_lm_head_reference
from .triton_kernel import HAS_TRITON, gathered_lm_head_triton, is_interpreter_mode, launch_plan

__all__ = [
    "HAS_TRITON",
    "check_cluster_inputs",
    "cluster_lanes",
    "cluster_lm_head_reference",
    "cluster_lm_head_triton",
    "check_inputs",
    "gathered_lm_head_reference",
    "gathered_lm_head_triton",
    "is_interpreter_mode",
    "launch_plan",
]

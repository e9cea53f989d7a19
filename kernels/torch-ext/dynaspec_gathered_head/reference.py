"""Readable PyTorch specification of the gathered LM head, plus the shared input checks.

The gathered LM head computes logits for a shortlist of vocabulary rows only:

    logits[n, s] = sum_k hidden_states[n, k] * weight[token_ids[s], k]

accumulated in fp32 and returned in ``hidden_states.dtype``. This file is the spec every other
implementation (the Triton kernel, the dispatcher's CPU fast path) is tested against.

Run it on CPU (from the repository root):

    python -c "import sys; sys.path.insert(0, 'kernels/torch-ext'); import torch; \
from dynaspec_gathered_head import gathered_lm_head_reference as f; \
print(f(torch.randn(2, 8), torch.randn(100, 8), torch.tensor([3, 7, 42])).shape)"
"""

from __future__ import annotations

import torch

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
SUPPORTED_ID_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)


def check_inputs(hidden_states: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the problem when the three inputs do not fit the contract.

    Contract: ``hidden_states`` (N, d) and ``weight`` (V, d) are 2-D floating tensors of one of
    ``SUPPORTED_DTYPES`` sharing d, the dtype and a device; ``token_ids`` is a 1-D int32/int64 tensor on
    that device. Values of ``token_ids`` are not range-checked here (that would force a device
    sync); out-of-range ids are an error in the caller, as for ``torch.index_select``.
    """
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states must be 2-D (N, d), got shape {tuple(hidden_states.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (V, d), got shape {tuple(weight.shape)}")
    if hidden_states.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden size mismatch: hidden_states has d={hidden_states.shape[1]}, weight has d={weight.shape[1]}"
        )
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D (S,), got shape {tuple(token_ids.shape)}")
    if token_ids.dtype not in SUPPORTED_ID_DTYPES:
        raise ValueError(f"token_ids must be int32 or int64, got {token_ids.dtype}")
    for name, tensor in (("hidden_states", hidden_states), ("weight", weight)):
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} dtype must be one of float32/bfloat16/float16, got {tensor.dtype}")
    if hidden_states.dtype != weight.dtype:
        raise ValueError(f"dtype mismatch: hidden_states is {hidden_states.dtype}, weight is {weight.dtype}")
    devices = {hidden_states.device, weight.device, token_ids.device}
    if len(devices) != 1:
        raise ValueError(
            "hidden_states, weight and token_ids must be on the same device, got "
            f"{hidden_states.device}, {weight.device}, {token_ids.device}"
        )


def gathered_lm_head_reference(
    hidden_states: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """Logits of ``hidden_states`` (N, d) against the rows ``weight[token_ids]``: returns (N, S).

    Gathers the rows (materialising an (S, d) copy), upcasts both operands to fp32, multiplies,
    and casts the result back to ``hidden_states.dtype``. Slow but obviously correct.
    """
    check_inputs(hidden_states, weight, token_ids)
    rows = weight.index_select(0, token_ids.long())  # (S, d)
    logits = hidden_states.float() @ rows.float().T  # (N, S) fp32
    return logits.to(hidden_states.dtype)  # (N, S)

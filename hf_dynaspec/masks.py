"""4D additive attention masks, shared by the drafter, tree verification and cost calibration.

transformers models accept a float mask (B, 1, T, K) added to the attention scores: 0 where a query may attend
to a key, the dtype's minimum elsewhere. Tree attention is a boolean "allowed" matrix turned into one.

    python -c "from hf_dynaspec.masks import causal_mask; import torch; print(causal_mask(2, 1, torch.float32, 'cpu'))"
"""

from __future__ import annotations

import torch


def causal_mask(length: int, past: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """4D additive mask (1, 1, T, past + T): query i sees keys 0..past + i."""
    allowed = torch.ones(length, past + length, dtype=torch.bool, device=device).tril(diagonal=past)
    return additive_mask(allowed, dtype)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean (T, K) -> float (1, 1, T, K) with 0 where allowed and the dtype's minimum elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]

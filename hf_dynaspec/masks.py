"""4D additive attention masks, shared by the drafter, tree verification and cost calibration.

transformers models accept a float mask (B, 1, T, K) added to the attention scores: 0 where a query may attend
to a key, the dtype's minimum elsewhere. Tree attention is a boolean "allowed" matrix turned into one. Targets
whose layers mix full and sliding-window attention take one mask per kind (`target_masks`), as transformers'
own mask mapping ({"full_attention": ..., "sliding_attention": ...}).

    python -c "from hf_dynaspec.masks import causal_mask; import torch; print(causal_mask(2, 1, torch.float32, 'cpu'))"
"""

from __future__ import annotations

import torch


def causal_mask(length: int, past: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """4D additive mask (1, 1, T, past + T): query i sees keys 0..past + i."""
    allowed = torch.ones(length, past + length, dtype=torch.bool, device=device).tril(diagonal=past)
    return additive_mask(allowed, dtype)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean (T, K) or (B, T, K) -> float (1, 1, T, K) or (B, 1, T, K) with 0 where allowed and the dtype's
    minimum elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask = mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None] if allowed.ndim == 2 else mask[:, None]


# Attention kinds a target's layers may use (`config.layer_types`); tree verification supports these two.
FULL, SLIDING = "full_attention", "sliding_attention"


def attention_kinds(config) -> tuple[set[str], int | None]:
    """(the attention kinds of the target's layers, its sliding window or None). Models with `layer_types`
    name each layer's kind; older sliding-window models (Mistral) slide on every layer; others attend in full."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        kinds = set(layer_types)
    else:
        kinds = {SLIDING} if window else {FULL}
    unsupported = kinds - {FULL, SLIDING}
    if unsupported:
        raise ValueError(
            f"{text.model_type} layers of kind {sorted(unsupported)} cannot verify a draft tree (only full and "
            "sliding-window attention can mask one); generate without `assistant_model` for this model."
        )
    if SLIDING in kinds and not window:
        raise ValueError(f"{text.model_type} has sliding-attention layers but no `sliding_window` in its config.")
    return kinds, window if SLIDING in kinds else None


def target_masks(
    config,
    allowed: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """4D additive mask(s) for a target forward whose queries may see `allowed` (T, K) keys, or per row of a
    batch (B, T, K): one tensor when all layers share a kind, else one per kind. A sliding layer also drops keys
    at or beyond the window from each query's own position (transformers' rule: key position > query position -
    window), so a tree node sees the window counted from its own depth. Positions: (T,) and (K,), or (B, T) and
    (B, K), on the mask's device."""
    kinds, window = attention_kinds(config)
    masks = {}
    for kind in kinds:
        keep = allowed
        if kind == SLIDING:
            keep = allowed & (key_positions.unsqueeze(-2) > query_positions.unsqueeze(-1) - window)  # (B?, T, K)
        masks[kind] = additive_mask(keep, dtype)
    # one kind: a tensor (every model takes a prepared 4D mask as it is); mixed kinds: transformers' mapping
    return next(iter(masks.values())) if len(masks) == 1 else masks

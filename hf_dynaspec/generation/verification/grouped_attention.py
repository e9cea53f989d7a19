"""Grouped-query attention read in place while a CPU target verifies a tree.

A tree verification attends with a 4D mask over n > 1 queries. transformers' SDPA path then copies each layer's
keys and values once per query group (`repeat_kv`: (B, H_kv, K, d) -> (B, H_kv * g, K, d)), because CUDA's fast
kernels take no mask with grouped heads; a plain decoding step (one query) avoids the copy (`pack_gqa`). On a
CPU, `scaled_dot_product_attention(..., enable_gqa=True)` takes the mask and reads the grouped heads in place,
with the same result bit for bit, so the copy is pure cost: 2 * layers copies of the whole cache per step, a
cost that grows with the context where the plain step it is compared with pays none.

`grouped_attention(configs)` points the target's attention at `sdpa_gqa_attention` for one forward (the
configs `gqa_configs` found: those of attention modules with grouped heads using "sdpa" on a CPU) and puts the
user's setting back after it; every other call (one query, no mask, a position bias or softcap, another device)
goes to transformers' own `sdpa_attention_forward` unchanged. Another thread's forward of the same model in the
meantime would attend through it too, with the same results.

    python -m pytest tests/test_grouped_attention.py -q
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.utils.import_utils import is_torch_greater_or_equal

GQA_SDPA = "hf_dynaspec_sdpa_gqa"


def sdpa_gqa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except that n > 1 masked queries over grouped key / value heads on a CPU read
    them in place. query (B, H, n, d), key / value (B, H_kv, K, d), mask (B, 1, n, K) -> output (B, n, H, d)."""
    groups = getattr(module, "num_key_value_groups", 1)
    in_place = (
        groups > 1 and query.shape[2] > 1 and attention_mask is not None and query.device.type == "cpu"
        and kwargs.get("position_bias") is None and kwargs.get("softcap") is None and not kwargs.get("output_attentions")
    )
    if not in_place:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, H, n, d)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_SDPA, sdpa_gqa_attention)
AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # a model building its own mask builds SDPA's


def gqa_configs(target: torch.nn.Module) -> tuple:
    """The configs that the target's attention modules with grouped key / value heads read their attention
    implementation from, where that is "sdpa" and the target is on a CPU (else none: nothing to change)."""
    if target.device.type != "cpu" or not is_torch_greater_or_equal("2.5"):  # enable_gqa: torch 2.5
        return ()
    found = {}
    for module in target.modules():
        config = getattr(module, "config", None)
        if getattr(module, "num_key_value_groups", 1) > 1 and getattr(config, "_attn_implementation", None) == "sdpa":
            found[id(config)] = config
    return tuple(found.values())


@contextmanager
def grouped_attention(configs: Sequence) -> Iterator[None]:
    """For the forwards inside: `configs` attend through `sdpa_gqa_attention`; their setting is restored after."""
    saved = [config._attn_implementation_internal for config in configs]
    try:
        for config in configs:
            config._attn_implementation_internal = GQA_SDPA  # this config only, not its sub-configs
        yield
    finally:
        for config, implementation in zip(configs, saved):
            config._attn_implementation_internal = implementation

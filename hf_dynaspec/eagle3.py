"""EAGLE-3's drafter layer, the same function vLLM and SGLang serve (their `llama_eagle3.py`).

One Llama decoder layer whose attention reads 2d features: the normed token embedding beside the normed
drafter feature. With e = embed(x_{i+1}) and h the feature of position i (the target's fused layers through `fc`
at the first draft step, the drafter's own pre-norm output deeper):

    a = [input_layernorm(e); hidden_norm(h)]          (B, T, 2d)   q/k/v projections are 2d -> heads
    r = h + self_attn(a)                              (B, T, d)    hidden_norm(h) + ... with norm_before_residual
    out = r + mlp(post_attention_layernorm(r))        (B, T, d)    the pre-norm output, fed to the next step
    logits = lm_head(norm(out))                                    (norm(out) fed on with norm_output)

The variants (`norm_before_residual`, and the drafter's `norm_before_fc`, `fc_norm`, `norm_output`) are those of
checkpoints trained by speculators and SpecForge (`DynaSpecConfig`).

The layer takes `a` already built (`attention_input`), so the router can read the same 2d vector beside it.

    python -c "
    from transformers import LlamaConfig; from hf_dynaspec.eagle3 import Eagle3DecoderLayer
    print(Eagle3DecoderLayer(LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4)))"
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm


class Eagle3DecoderLayer(nn.Module):
    """Parameter names as in EAGLE-3 checkpoints (`midlayer.*`): input_layernorm, hidden_norm, self_attn.{q,k,v,o}
    _proj, post_attention_layernorm, mlp.{gate,up,down}_proj."""

    def __init__(self, config: Any, layer_idx: int = 0, norm_before_residual: bool = False) -> None:
        super().__init__()
        self.norm_before_residual = norm_before_residual  # residual = hidden_norm(h) (speculators' training default)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(d, eps=eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=eps)
        self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, self.self_attn.head_dim
        bias = config.attention_bias
        self.self_attn.q_proj = nn.Linear(2 * d, heads * head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * d, kv_heads * head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * d, kv_heads * head_dim, bias=bias)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=eps)
        self.mlp = LlamaMLP(config)

    def attention_input(self, embeds: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """[input_layernorm(embeds); hidden_norm(hidden_states)]: (B, T, d) x 2 -> (B, T, 2d)."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden_states)], dim=-1)

    def residual(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What the attention output is added to: h, or hidden_norm(h) with `norm_before_residual`."""
        return self.hidden_norm(hidden_states) if self.norm_before_residual else hidden_states

    def forward(
        self,
        attention_input: torch.Tensor,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """attention_input (B, T, 2d), hidden_states (B, T, d) (the residual, `residual(h)`) -> pre-norm output
        (B, T, d)."""
        attn, _ = self.self_attn(
            hidden_states=attention_input,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
        )
        residual = hidden_states + attn  # (B, T, d)
        return residual + self.mlp(self.post_attention_layernorm(residual))

"""Tiny random models shared by the tests (built in code: nothing is downloaded)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_dynaspec  # noqa: F401  (installs the generate() hook)
from hf_dynaspec import DynaSpecDrafter


def tiny_target(vocab_size: int = 128, seed: int = 0, eos_token_id: int | None = None, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    fields.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = None
    return model


def tiny_drafter(target, num_clusters: int = 8, seed: int = 0, **kwargs) -> DynaSpecDrafter:
    torch.manual_seed(seed)
    return DynaSpecDrafter.from_target(target, num_clusters=num_clusters, seed=seed, **kwargs).eval()


def prompt(length: int = 6, vocab_size: int = 128, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (1, length), generator=generator)

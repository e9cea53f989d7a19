"""The user-facing contract: pipeline(), streamers and stop strings behave as in plain transformers."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_drafter, tiny_target
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, TextIteratorStreamer, pipeline

from hf_dynaspec.targets import byte_level_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {f"w{i}": i for i in range(3, 128)}
    vocab.update({"<s>": 0, "[UNK]": 1, "</s>": 2})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")


@pytest.fixture(scope="module")
def models_():
    target = tiny_target()
    return target, tiny_drafter(target)


def test_pipeline_with_assistant_model(tokenizer, models_):
    target, drafter = models_
    text = "w5 w17 w33 w90"
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    assisted = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    kwargs = dict(max_new_tokens=12, do_sample=False)
    assert assisted(text, **kwargs)[0]["generated_text"] == plain(text, **kwargs)[0]["generated_text"]


def test_text_iterator_streamer(tokenizer, models_):
    target, drafter = models_
    ids = tokenizer("w5 w17 w33", return_tensors="pt").input_ids
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=10, do_sample=False, streamer=streamer)
    streamed = "".join(streamer)
    expected = tokenizer.decode(out[0, ids.shape[1]:])
    assert streamed.split() == expected.split()


def test_stop_strings_end_generation_where_plain_does():
    tokenizer = byte_level_tokenizer()
    target = tiny_target(vocab_size=258, seed=3)
    drafter = tiny_drafter(target)
    ids = tokenizer("hello", return_tensors="pt").input_ids
    plain = target.generate(ids, max_new_tokens=20, do_sample=False)
    words = [tokenizer.decode(t) for t in plain[0, ids.shape[1] + 3 :]]
    stop = next(w for w in words if w.isascii() and w.strip())  # a character plain greedy emits mid-way
    kwargs = dict(max_new_tokens=20, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    expected = target.generate(ids, **kwargs)
    got = target.generate(ids, assistant_model=drafter, **kwargs)
    assert torch.equal(got, expected)
    assert got.shape[1] < plain.shape[1]


def test_pipeline_loads_a_drafter_named_by_its_folder(tmp_path, tokenizer, models_):
    """The string form: transformers loads the assistant with its auto classes and AutoTokenizer."""
    target, drafter = models_
    drafter.save_pretrained(tmp_path / "drafter", tokenizer=tokenizer)
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    assisted = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=str(tmp_path / "drafter"))
    kwargs = dict(max_new_tokens=12, do_sample=False)
    text = "w5 w17 w33 w90"
    assert assisted(text, **kwargs)[0]["generated_text"] == plain(text, **kwargs)[0]["generated_text"]
    assert type(assisted.assistant_model).__name__ == "DynaSpecDrafter"

"""Robustness: bad or edge-case inputs, checkpoints from elsewhere, long use, interrupted generation.

Each test compares against plain `generate()` where plain generate defines the behaviour (limits, dtypes,
padding), and otherwise checks that the error is clear (names the file, field or both mismatching values).

    python -m pytest tests/test_robustness.py -q
"""

from __future__ import annotations

import gc
import json
import shutil
import tracemalloc
from collections.abc import Callable

import pytest
import torch
from helpers import greedy, prompt, speculative, tiny_drafter, tiny_target
from transformers import DynamicCache, LlamaConfig, MistralConfig, MistralForCausalLM

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.candidates import DynaSpecCandidateGenerator
from hf_dynaspec.generation.loop.stats import SpeculativeStats

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def outcome(call: Callable[[], torch.Tensor]) -> tuple[str, object]:
    """("ok", output) or ("error", exception type and message) of a generate() call."""
    try:
        return "ok", call().tolist()
    except Exception as err:  # noqa: BLE001 - the exception itself is what is compared
        return "error", (type(err), str(err))


# ---------------------------------------------------------------------------------------------- inputs


def test_empty_prompt_is_a_clear_value_error(target, drafter):
    """An empty prompt is refused before any model runs, with a message saying so."""
    with pytest.raises(ValueError, match="prompt is empty"):
        speculative(target, drafter, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=4)


@pytest.mark.parametrize("length", [15, 16, 20])
def test_prompt_at_or_beyond_max_positions_behaves_like_plain_generate(length):
    """At and beyond max_position_embeddings the outcome (tokens, or error) is plain generate's."""
    short = tiny_target(seed=22, max_position_embeddings=16)
    draft = tiny_drafter(short)
    ids = prompt(length, seed=length)
    assert outcome(lambda: speculative(short, draft, ids, max_new_tokens=6)) == outcome(
        lambda: greedy(short, ids, max_new_tokens=6)
    )


@pytest.mark.parametrize("max_new_tokens", [0, 1])
def test_max_new_tokens_zero_and_one_match_plain_generate(target, drafter, max_new_tokens):
    """max_new_tokens=0 fails exactly as plain generate does; 1 gives plain generate's single token."""
    ids = prompt(5, seed=23)
    mine = outcome(lambda: speculative(target, drafter, ids, max_new_tokens=max_new_tokens))
    theirs = outcome(lambda: greedy(target, ids, max_new_tokens=max_new_tokens))
    assert mine == theirs
    assert mine[0] == ("error" if max_new_tokens == 0 else "ok")


def test_eos_as_first_generated_token(target, drafter):
    """EOS picked by the prefill ends generation after one token, like plain greedy."""
    ids = prompt(6, seed=24)
    eos = int(greedy(target, ids, max_new_tokens=1)[0, -1])
    got = speculative(target, drafter, ids, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(got, greedy(target, ids, max_new_tokens=20, eos_token_id=eos))
    assert got.shape[1] == ids.shape[1] + 1


def test_left_padded_prompt_matches_plain_generate(target, drafter):
    """A left-padded prompt with its mask gives plain generate's output, padding kept in front."""
    ids = prompt(6, seed=25)
    padded = torch.cat([torch.full((1, 4), 5), ids], dim=-1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(ids)], dim=-1)
    got = speculative(target, drafter, padded, attention_mask=mask, max_new_tokens=15)
    assert torch.equal(got, greedy(target, padded, attention_mask=mask, max_new_tokens=15))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_targets_on_cpu(dtype):
    """fp16 / bf16 targets: the fp32-built drafter is converted at bind, and greedy output is exact."""
    target = tiny_target(seed=26)
    draft = tiny_drafter(target)
    target = target.to(dtype)
    ids = prompt(6, seed=26)
    expected = greedy(target, ids, max_new_tokens=12)
    got = speculative(target, draft, ids, max_new_tokens=12)
    assert draft.fc.weight.dtype == dtype
    assert torch.equal(got, expected)


def test_prompt_from_clusters_the_router_never_chooses(target):
    """The router is forced to cluster 0 (one cluster per position); a prompt made only of tokens of other
    clusters still decodes exactly, and every drafted shortlist is cluster 0's tokens."""
    draft = tiny_drafter(target)
    with torch.no_grad():
        draft.router.down.weight.zero_()
        draft.router.down.bias.fill_(-10.0)
        draft.router.down.bias[0] = 10.0
    outside = torch.cat([draft.clusters.tokens([c]) for c in range(1, draft.config.num_clusters)])
    ids = outside[torch.randperm(outside.numel(), generator=torch.Generator().manual_seed(27))[:8]][None]
    config = DynaSpecGenerationConfig(shortlist_k0=1, shortlist_k1=1, max_new_tokens=20,
                                      return_dict_in_generate=True, step_policy="off")  # every step drafts
    out = target.generate(ids, generation_config=config, assistant_model=draft)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=20))
    assert out.speculative_stats.mean_shortlist_size == draft.clusters.tokens([0]).numel()


# ---------------------------------------------------------------------------------------------- checkpoints


def test_config_of_another_model_type_is_refused(tmp_path, drafter):
    """A LlamaConfig saved over the drafter's config.json gives a ValueError naming the model type."""
    drafter.save_pretrained(tmp_path)
    LlamaConfig(vocab_size=128, hidden_size=32).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'llama'.*DynaSpec drafter"):
        DynaSpecDrafter.from_pretrained(tmp_path)


def test_unknown_config_keys_from_a_newer_version_load(tmp_path, target, drafter):
    """Extra keys in config.json are kept as attributes and the loaded drafter decodes exactly."""
    drafter.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config.update(future_knob=3, future_table={"a": [1, 2]})
    path.write_text(json.dumps(config))
    loaded = DynaSpecDrafter.from_pretrained(tmp_path)
    assert loaded.config.future_knob == 3
    ids = prompt(5, seed=28)
    assert torch.equal(speculative(target, loaded, ids, max_new_tokens=10), greedy(target, ids, max_new_tokens=10))


def mistral_target() -> torch.nn.Module:
    config = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2)
    return MistralForCausalLM(config).eval()


@pytest.mark.parametrize(
    ("make_other", "values"),
    [
        (lambda: tiny_target(vocab_size=96), ("128", "96")),
        (lambda: tiny_target(hidden_size=48), ("32", "48")),
        (mistral_target, ("'llama'", "'mistral'")),
    ],
    ids=["vocab", "hidden", "family"],
)
def test_drafter_for_another_target_names_both_values(drafter, make_other, values):
    """generate() with a mismatched target raises ValueError naming the drafter's and the target's value."""
    other = make_other()
    vocab = other.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError) as err:
        speculative(other, drafter, prompt(5, vocab_size=vocab), max_new_tokens=4)
    assert all(value in str(err.value) for value in values)


@pytest.mark.parametrize("keep", [0.5, 0.95])
def test_truncated_safetensors_error_names_the_file(tmp_path, drafter, keep):
    """A safetensors file cut short (header or data) gives an error naming the file."""
    drafter.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(OSError, match="model.safetensors"):
        DynaSpecDrafter.from_pretrained(tmp_path)


def test_no_pickle_is_written_or_loaded(tmp_path, drafter, monkeypatch):
    """Saving writes safetensors only; a directory with only pytorch_model.bin is refused (even when asked
    for use_safetensors=False) and torch.load is never called."""
    drafter.save_pretrained(tmp_path / "saved", safe_serialization=False)
    names = {p.name for p in (tmp_path / "saved").iterdir()}
    assert "model.safetensors" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(tmp_path / "saved" / "config.json", pickled / "config.json")
    torch.save(drafter.state_dict(), pickled / "pytorch_model.bin")

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", refuse)
    for kwargs in ({}, {"use_safetensors": False}):
        with pytest.raises(OSError, match="safetensors"):
            DynaSpecDrafter.from_pretrained(pickled, **kwargs)


# ---------------------------------------------------------------------------------------------- long use


def live_objects(kind: type) -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is kind)


def test_hundred_calls_are_exact_and_leave_no_state(target, drafter):
    """100 generate() calls in a row are exact, and neither caches / generators / stats objects nor traced
    Python memory accumulate across calls (nothing is kept on the drafter between calls)."""
    prompts = [prompt(4 + i, seed=30 + i) for i in range(5)]
    expected = [greedy(target, ids, max_new_tokens=8) for ids in prompts]
    drafter_state = set(vars(drafter))
    counts, traced = [], []
    try:
        for call in range(100):
            ids = prompts[call % 5]
            assert torch.equal(speculative(target, drafter, ids, max_new_tokens=8), expected[call % 5]), call
            if call == 19:  # warmed up: transformers' and torch's one-time caches are filled
                tracemalloc.start()
            if call in (19, 99):
                counts.append([live_objects(k) for k in (DynamicCache, DynaSpecCandidateGenerator, SpeculativeStats)])
                traced.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert counts[1] == counts[0]
    assert counts[1][1] == 0  # no generator outlives its call
    assert traced[1] - traced[0] < 512 * 1024, traced
    assert set(vars(drafter)) == drafter_state


def test_two_thousand_token_generation_is_exact():
    """One 2,000-token greedy generation equals plain greedy token for token (long caches, many steps)."""
    target = tiny_target(seed=31, max_position_embeddings=4096)
    draft = tiny_drafter(target)
    ids = prompt(6, seed=31)
    config = DynaSpecGenerationConfig(tree_policy="chain", draft_depth=3, max_new_tokens=2000, min_new_tokens=2000)
    got = target.generate(ids, generation_config=config, assistant_model=draft)
    expected = greedy(target, ids, max_new_tokens=2000, min_new_tokens=2000)
    assert got.shape[1] == ids.shape[1] + 2000
    assert torch.equal(got, expected)


class InterruptingStreamer:
    """Raises KeyboardInterrupt at the `at`-th put() (the first put is the prompt)."""

    def __init__(self, at: int) -> None:
        self.at, self.puts, self.ended = at, 0, False

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == self.at:
            raise KeyboardInterrupt

    def end(self) -> None:
        self.ended = True


def test_keyboard_interrupt_from_streamer_propagates_and_models_stay_usable(target, drafter):
    """A KeyboardInterrupt raised mid-generation by the streamer reaches the caller, and the next generate()
    with the same target and drafter is still exact."""
    ids = prompt(6, seed=32)
    streamer = InterruptingStreamer(at=3)
    with pytest.raises(KeyboardInterrupt):
        speculative(target, drafter, ids, max_new_tokens=20, streamer=streamer)
    assert streamer.puts == 3 and not streamer.ended
    assert torch.equal(speculative(target, drafter, ids, max_new_tokens=20), greedy(target, ids, max_new_tokens=20))

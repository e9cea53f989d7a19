"""Batches: every row of a left-padded batch decoded by one tree verification per step (`verifier.Verifier`),
each row exact against plain batched greedy, sampling lossless per row, num_return_sequences and pipeline batches,
the cache's per-row layout (`cache.KeyLayout`, `cache.keep_paths`), per-row statistics, and what is refused.
The family grid at B = 2, 3, 8 is in tests/test_families.py.

    python -m pytest tests/test_batch.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import CHI2_999_DF7, VOCAB, chi_square, exact_marginals, prompt, tiny_drafter, tiny_target
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import DynamicCache, PreTrainedTokenizerFast, pipeline
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.verification.cache import KeyLayout, keep_paths

pytestmark = pytest.mark.usefixtures("one_thread")


def batch_of(lengths: list[int], pad: int = 0, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = prompt(length, seed=seed + row)[0]
        mask[row, width - length :] = 1
    return ids, mask


@pytest.mark.parametrize("step_policy", ["off", "auto"])
@pytest.mark.parametrize("head_mode", ["dynamic", "full"])
def test_each_row_equals_plain_batched_greedy(target, drafter, head_mode, step_policy):
    ids, mask = batch_of([9, 4, 13, 6])
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    out = target.generate(ids, assistant_model=drafter, head_mode=head_mode, step_policy=step_policy,
                          lookup_num_tokens=3, return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, target.generate(ids, **kwargs))
    per_row = out.speculative_stats_per_row
    assert len(per_row) == 4 and out.speculative_stats.accepted_tokens == sum(s.accepted_tokens for s in per_row)
    assert all(s.accepted_tokens == 29 for s in per_row)  # 30 new tokens each, the first from the prefill
    if step_policy == "off":
        assert all(s.tree_nodes > 0 for s in per_row)


def test_scores_of_a_row_that_ended_are_the_minimum(target, drafter):
    ids, mask = batch_of([5, 8])
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    eos = int(plain[1, ids.shape[1] + 3])  # row 1 ends at its 4th token (row 0 where it emits it, if it does)
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos,
                  return_dict_in_generate=True, output_scores=True)
    expected = target.generate(ids, **kwargs)
    got = target.generate(ids, assistant_model=drafter, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores)
    end = int((got.sequences[1, ids.shape[1] :] == eos).nonzero()[0]) + 1
    for step, (mine, theirs) in enumerate(zip(got.scores, expected.scores)):
        torch.testing.assert_close(mine[0], theirs[0], rtol=1e-4, atol=1e-4)
        if step < end:
            torch.testing.assert_close(mine[1], theirs[1], rtol=1e-4, atol=1e-4)
        else:
            assert bool((mine[1] == torch.finfo(mine.dtype).min).all())


def test_sampling_stays_lossless_per_row_with_num_return_sequences():
    """Two prompts (one left-padded), num_return_sequences=2: a batch of 4 rows per call, lookup branch on. The
    2nd and 3rd tokens of each row follow that prompt's exact marginals (see tests/test_sampling.py)."""
    target = tiny_target(vocab_size=VOCAB, seed=21)
    drafter = tiny_drafter(target, num_clusters=4, drafter_architecture="eagle1")
    prompts = [[1, 5, 3], [6, 2, 7, 4, 1]]
    ids = torch.tensor([[0, 0] + prompts[0], prompts[1]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    config = DynaSpecGenerationConfig(tree_policy="eagle2", draft_depth=2, draft_top_k=3, num_draft_nodes=6,
                                      head_mode="full", do_sample=True, top_k=0, max_new_tokens=3, pad_token_id=0,
                                      lookup_num_tokens=2, step_policy="off", num_return_sequences=2,
                                      return_dict_in_generate=True)
    torch.manual_seed(99)
    counts = torch.zeros(2, 2, VOCAB)  # prompt, token (2nd / 3rd), vocabulary
    accepted = from_lookup = 0
    for _ in range(600):
        out = target.generate(ids, attention_mask=mask, generation_config=config, assistant_model=drafter)
        assert out.sequences.shape == (4, 8)
        for row in range(4):
            x2, x3 = out.sequences[row, -2:].tolist()
            counts[row // 2, 0, x2] += 1
            counts[row // 2, 1, x3] += 1
        accepted += out.speculative_stats.accepted_tokens - out.speculative_stats.steps
        from_lookup += out.speculative_stats.lookup_tokens
    assert accepted > 120 and from_lookup > 30, "the sampler's draft paths were not exercised"
    for index, text in enumerate(prompts):
        p2, p3 = exact_marginals(target, text, LogitsProcessorList())
        assert chi_square(counts[index, 0], p2) < CHI2_999_DF7
        assert chi_square(counts[index, 1], p3) < CHI2_999_DF7


def test_pipeline_batches(drafter, target):
    vocab = {f"w{i}": i for i in range(3, 128)}
    vocab.update({"<s>": 0, "[UNK]": 1, "</s>": 2})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="[UNK]", pad_token="<s>", padding_side="left")
    texts = ["w5 w17 w33 w90", "w7", "w12 w40 w41", "w99 w3 w8 w8 w8 w6"]
    kwargs = dict(max_new_tokens=12, do_sample=False, batch_size=4)
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)(texts, **kwargs)
    assisted = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)(texts, **kwargs)
    assert [r[0]["generated_text"] for r in assisted] == [r[0]["generated_text"] for r in plain]


def test_key_layout_and_kept_paths_leave_holes_under_the_mask():
    keys = KeyLayout.from_attention_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert keys.valid.tolist() == [[False, True, True], [True, True, True]]
    assert keys.positions.tolist() == [[0, 0, 1], [0, 1, 2]] and keys.lengths.tolist() == [2, 3]
    cache = DynamicCache()
    block = torch.arange(2 * 3 + 2 * 4, dtype=torch.float).reshape(2, 1, 7, 1)  # (B, H, past + N, D): 3 + 4
    cache.update(block.clone(), block.clone(), 0)
    accepted = keep_paths(cache, 3, [[0, 2, 3], [0]])  # row 0 keeps nodes 0, 2, 3; row 1 the root only
    assert accepted == [3, 1]
    kept = cache.layers[0].keys[:, 0, :, 0]
    assert kept[0].tolist() == [0, 1, 2, 3, 5, 6] and kept[1, :4].tolist() == [7, 8, 9, 10]
    keys = keys.appended(accepted)
    assert keys.valid[:, 3:].tolist() == [[True, True, True], [True, False, False]]
    assert keys.positions[:, 3:].tolist() == [[2, 3, 4], [3, 0, 0]] and keys.lengths.tolist() == [5, 4]
    dense = KeyLayout.dense(1, 4, torch.device("cpu")).appended([2])
    assert dense.valid is None and dense.lengths.tolist() == [6]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(cache_implementation="static"), "cache_implementation"),
        (dict(past_key_values=DynamicCache()), "past_key_values"),
        (dict(token_type_ids=torch.zeros(2, 4, dtype=torch.long)), "token_type_ids"),
    ],
)
def test_what_the_loop_would_not_honour_is_refused(target, drafter, kwargs, match):
    ids = torch.cat([prompt(4), prompt(4, seed=2)])
    with pytest.raises(ValueError, match=match):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False, **kwargs)


class BatchStreamer(BaseStreamer):
    """A streamer that takes whatever it is given (transformers' TextStreamer refuses batches itself)."""

    def put(self, value):
        pass

    def end(self):
        pass


def test_a_streamer_of_a_batch_is_refused(target, drafter):
    ids = torch.cat([prompt(4), prompt(4, seed=2)])
    with pytest.raises(ValueError, match="streamer receives one sequence"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, streamer=BatchStreamer())


def test_a_processor_that_reads_the_batch_index_is_refused_for_a_batch(target, drafter):
    ids = torch.cat([prompt(4), prompt(4, seed=2)])
    with pytest.raises(ValueError, match="batch index"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False,
                        prefix_allowed_tokens_fn=lambda batch_id, sent: list(range(128)))

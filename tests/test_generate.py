"""Exactness of tree speculative decoding inside generate(): greedy == plain greedy, token for token."""

from __future__ import annotations

import pytest
import torch
from helpers import OracleCandidateGenerator, greedy, prompt, speculative, tiny_drafter, tiny_target

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.loop import decoding


@pytest.mark.parametrize("policy", ["eagle2", "dyspec", "chain"])
@pytest.mark.parametrize("head_mode", ["dynamic", "full"])
@pytest.mark.parametrize(("nodes", "depth", "top_k"), [(1, 1, 1), (6, 3, 2), (24, 8, 4), (64, 5, 8)])
def test_greedy_matches_plain_greedy(target, drafter, policy, head_mode, nodes, depth, top_k):
    ids = prompt(7)
    config = DynaSpecGenerationConfig(
        tree_policy=policy, num_draft_nodes=nodes, draft_depth=depth, draft_top_k=top_k, head_mode=head_mode,
        max_new_tokens=24, do_sample=False,
    )
    expected = greedy(target, ids, max_new_tokens=24)
    got = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("policy", ["eagle2", "dyspec", "chain"])
@pytest.mark.parametrize("min_draft_prob", [0.02, 0.2, 0.9])
def test_path_probability_floor_keeps_greedy_exact(target, drafter, policy, min_draft_prob):
    ids = prompt(7)
    config = DynaSpecGenerationConfig(tree_policy=policy, num_draft_nodes=12, draft_depth=5, draft_top_k=3,
                                      min_draft_prob=min_draft_prob, max_new_tokens=24, do_sample=False,
                                      return_dict_in_generate=True, step_policy="off")  # trees as drafted
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=24))
    full = target.generate(ids, generation_config=DynaSpecGenerationConfig(
        tree_policy=policy, num_draft_nodes=12, draft_depth=5, draft_top_k=3, max_new_tokens=24, do_sample=False,
        return_dict_in_generate=True, step_policy="off"), assistant_model=drafter)
    # the floor prunes an untrained drafter
    assert out.speculative_stats.mean_tree_size < full.speculative_stats.mean_tree_size


def test_min_draft_prob_is_validated():
    with pytest.raises(ValueError, match="min_draft_prob"):
        DynaSpecGenerationConfig(min_draft_prob=1.0)


def test_drafter_defaults_and_stats(target, drafter):
    ids = prompt(5, seed=3)
    out = speculative(target, drafter, ids, max_new_tokens=16, return_dict_in_generate=True, output_scores=True)
    expected = greedy(target, ids, max_new_tokens=16, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == 16
    for mine, theirs in zip(out.scores, expected.scores):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)  # tree forward vs one-token forward
    stats = out.speculative_stats
    assert stats.accepted_tokens == 16 - 1  # the prefill emits the first token
    drafted = stats.steps - stats.plain_steps - stats.lookup_steps
    assert drafted == stats.recall_checks > 0  # one recall check per drafted step
    # the default budget keeps k0 = k1 = 1 of the 8 clusters: each drafted position scores one cluster's tokens
    assert (drafter.config.shortlist_k0, drafter.config.shortlist_k1) == (1, 1)
    sizes = drafter.clusters.sizes()
    assert stats.shortlist_positions >= stats.steps
    assert int(sizes.min()) <= stats.mean_shortlist_size <= int(sizes.max())


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 9])
def test_max_new_tokens_cuts_inside_an_accepted_path(target, drafter, max_new_tokens, monkeypatch):
    monkeypatch.setattr(decoding, "DynaSpecCandidateGenerator", OracleCandidateGenerator)
    ids = prompt(6, seed=4)
    config = DynaSpecGenerationConfig(draft_depth=6, num_draft_nodes=12, max_new_tokens=max_new_tokens)
    got = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(got, greedy(target, ids, max_new_tokens=max_new_tokens))


@pytest.mark.parametrize("policy", ["eagle2", "dyspec"])
def test_eos_inside_drafts_stops_like_plain_greedy(policy, monkeypatch):
    # Pick as EOS a token that plain greedy emits mid-generation: the oracle drafts it inside accepted paths.
    target = tiny_target(seed=5)
    ids = prompt(6, seed=6)
    plain = greedy(target, ids, max_new_tokens=30)[0, ids.shape[1]:]
    eos = int(plain[7])
    target.generation_config.eos_token_id = eos
    drafter = tiny_drafter(target)
    monkeypatch.setattr(decoding, "DynaSpecCandidateGenerator", OracleCandidateGenerator)
    config = DynaSpecGenerationConfig(tree_policy=policy, draft_depth=5, num_draft_nodes=10, max_new_tokens=30)
    got = target.generate(ids, generation_config=config, assistant_model=drafter)
    expected = greedy(target, ids, max_new_tokens=30)
    assert torch.equal(got, expected)
    assert int(got[0, -1]) == eos


def test_eos_outside_drafts(drafter, target):
    # EOS set but never produced: generation runs to max_new_tokens exactly as plain greedy.
    ids = prompt(5, seed=7)
    target.generation_config.eos_token_id = None
    got = speculative(target, drafter, ids, max_new_tokens=20, eos_token_id=127)
    assert torch.equal(got, greedy(target, ids, max_new_tokens=20, eos_token_id=127))


@pytest.mark.parametrize("policy", ["eagle2", "dyspec", "chain"])
@pytest.mark.parametrize("depth", [1, 3, 6])
def test_oracle_drafter_reaches_depth_plus_one(target, drafter, policy, depth, monkeypatch):
    monkeypatch.setattr(decoding, "DynaSpecCandidateGenerator", OracleCandidateGenerator)
    ids = prompt(5, seed=8)
    steps = 4
    new = 1 + steps * (depth + 1)  # the prefill's token, then `steps` full steps
    config = DynaSpecGenerationConfig(
        tree_policy=policy, draft_depth=depth, num_draft_nodes=2 * depth, draft_top_k=2, max_new_tokens=new,
        return_dict_in_generate=True, step_policy="off",  # every step drafts the whole tree
    )
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=new))
    stats = out.speculative_stats
    assert (stats.steps, stats.accepted_tokens) == (steps, steps * (depth + 1))  # every step: depth + 1


def test_target_cache_holds_prompt_plus_accepted(target, drafter, monkeypatch):
    lengths = []
    original = decoding.speculative_step

    def spy(target_, batch):
        original(target_, batch)
        run = batch.rows[0]
        lengths.append((batch.verifier.cache.get_seq_length(), run.input_ids.shape[1], run.generator.read_length,
                        run.finished))

    monkeypatch.setattr(decoding, "speculative_step", spy)
    ids = prompt(6, seed=9)
    speculative(target, drafter, ids, max_new_tokens=25)
    assert lengths
    for cache_len, seq_len, drafter_len, finished in lengths:
        if not finished:  # cache = prompt + accepted tokens; the newest (bonus) token is the next root
            assert cache_len == seq_len - 1 == drafter_len


def test_streamer_receives_every_token(target, drafter):
    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    ids = prompt(5, seed=10)
    streamer = Collect()
    out = speculative(target, drafter, ids, max_new_tokens=12, streamer=streamer)
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    assert streamer.chunks[0] == ids[0].tolist() and streamer.ended
    assert streamed == out[0, ids.shape[1]:].tolist()


def test_left_padding_is_stripped(target, drafter):
    ids = prompt(5, seed=11)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=-1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], dim=-1)
    got = speculative(target, drafter, padded, attention_mask=mask, max_new_tokens=10)
    assert torch.equal(got[:, :3], padded[:, :3])
    assert torch.equal(got[:, 3:], greedy(target, ids, max_new_tokens=10))


def test_repetition_penalty_is_applied_per_path(target, drafter):
    ids = prompt(6, seed=12)
    kwargs = dict(max_new_tokens=20, repetition_penalty=1.5)
    assert torch.equal(speculative(target, drafter, ids, **kwargs), greedy(target, ids, **kwargs))


def test_other_assistants_still_use_transformers(target):
    ids = prompt(5, seed=13)
    assistant = tiny_target(seed=14)
    got = target.generate(ids, do_sample=False, assistant_model=assistant, max_new_tokens=8)
    assert torch.equal(got, greedy(target, ids, max_new_tokens=8))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_implementations(attn):
    target = tiny_target(seed=15, attn_implementation=attn)
    drafter = tiny_drafter(target)
    ids = prompt(6, seed=16)
    config = DynaSpecGenerationConfig(tree_policy="dyspec", num_draft_nodes=16, draft_depth=4, max_new_tokens=20)
    got = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(got, greedy(target, ids, max_new_tokens=20))


@pytest.mark.parametrize("head_mode", ["context", "union"])
@pytest.mark.parametrize("static", [False, True])
def test_context_heads_keep_greedy_exact(target, head_mode, static):
    """The in-context shortlist (NanoSpec) and its union with the router's clusters, with and without a static
    core: greedy output equals plain greedy."""
    core = torch.arange(3, 40) if static else None
    drafter = tiny_drafter(target, static_token_ids=core)
    ids = prompt(9)
    config = DynaSpecGenerationConfig(head_mode=head_mode, num_draft_nodes=12, draft_depth=4, max_new_tokens=24,
                                      do_sample=False, return_dict_in_generate=True,
                                      step_policy="off")  # every step drafts (the policy's picks are timed)
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=24))
    assert out.speculative_stats.mean_shortlist_size > 0

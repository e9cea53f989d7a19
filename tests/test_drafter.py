"""The drafter: persistence, the shortlisted head against a dense head, binding checks."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import greedy, prompt, tiny_drafter, tiny_target
from transformers import AutoConfig, AutoModel

from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.generation_config import resolve_draft_settings
from hf_dynaspec.masks import causal_mask


@pytest.fixture(scope="module")
def eos_target():
    """conftest's tiny target with EOS id 2 (an always-included shortlist token)."""
    return tiny_target(eos_token_id=2)


@pytest.fixture(scope="module")
def eos_drafter(eos_target):
    return tiny_drafter(eos_target, num_clusters=8)


def draft_once(drafter, head_mode="dynamic", num_clusters=2, return_vocab_logits=False):
    torch.manual_seed(0)
    ids = torch.randint(0, drafter.config.vocab_size, (1, 5))
    hidden = torch.randn(1, 5, drafter.config.hidden_size)
    with torch.no_grad():
        return drafter(
            input_ids=ids, hidden_states=hidden, head_mode=head_mode, num_clusters=num_clusters,
            return_vocab_logits=return_vocab_logits,
        )


def test_auto_classes_resolve_the_drafter(eos_drafter):
    config = AutoConfig.for_model("dynaspec_drafter", vocab_size=128, hidden_size=32, num_clusters=8,
                                  target_config=eos_drafter.config.target_config)
    assert type(config) is DynaSpecConfig
    assert type(AutoModel.from_config(config)) is DynaSpecDrafter


def test_round_trip_gives_identical_outputs(tmp_path, eos_target, eos_drafter):
    eos_drafter.generation_config = DynaSpecGenerationConfig(tree_policy="dyspec", num_draft_nodes=9, draft_depth=3)
    eos_drafter.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert "config.json" in files and "generation_config.json" in files
    assert any(f.endswith(".safetensors") for f in files)
    assert not any(f.endswith((".bin", ".pt", ".pth", ".pkl")) for f in files)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "dynaspec_drafter"

    loaded = DynaSpecDrafter.from_pretrained(tmp_path).eval().bind(eos_target)
    assert loaded.generation_config.tree_policy == "dyspec" and loaded.generation_config.num_draft_nodes == 9
    assert torch.equal(loaded.cluster_permutation, eos_drafter.cluster_permutation)
    for mode in ("dynamic", "full"):
        a, b = draft_once(eos_drafter, mode), draft_once(loaded, mode)
        assert torch.equal(a.hidden_states, b.hidden_states)
        assert torch.equal(a.head.token_ids, b.head.token_ids)
        assert torch.equal(a.head.logits, b.head.logits)
    assert isinstance(AutoModel.from_pretrained(tmp_path), DynaSpecDrafter)


def test_full_shortlist_equals_dense_head(eos_drafter):
    out = draft_once(eos_drafter, head_mode="full")
    dense = eos_drafter.dense_logits(out.hidden_states[0]).float()
    assert torch.equal(out.head.token_ids, torch.arange(eos_drafter.config.vocab_size))
    torch.testing.assert_close(out.head.logits, dense, rtol=0, atol=0)


def test_all_clusters_dynamic_equals_dense_head(eos_drafter):
    # Every cluster selected: the union is the whole vocabulary in cluster order.
    out = draft_once(eos_drafter, head_mode="dynamic", num_clusters=eos_drafter.config.num_clusters, return_vocab_logits=True)
    dense = eos_drafter.dense_logits(out.hidden_states[0]).float()
    # Same products, summed by different GEMM calls (one per cluster run): fp32 rounding only.
    torch.testing.assert_close(out.vocab_logits, dense, rtol=1e-5, atol=1e-5)


def test_dynamic_head_scores_only_the_router_clusters(eos_drafter):
    k = 2
    out = draft_once(eos_drafter, head_mode="dynamic", num_clusters=k, return_vocab_logits=True)
    dense = eos_drafter.dense_logits(out.hidden_states[0]).float()
    clusters = eos_drafter.clusters
    eos = eos_drafter.config.always_include_ids
    for t in range(out.vocab_logits.shape[0]):
        chosen = out.router_logits[0, t].topk(k).indices
        allowed = set(clusters.tokens(chosen).tolist()) | set(eos)
        finite = set(torch.isfinite(out.vocab_logits[t]).nonzero().flatten().tolist())
        assert finite == allowed
        assert int(out.head.shortlist_sizes[t]) == len(allowed)
        idx = torch.tensor(sorted(allowed))
        torch.testing.assert_close(out.vocab_logits[t, idx], dense[t, idx], rtol=1e-5, atol=1e-5)


def test_cuda_union_lays_out_the_columns_as_the_cpu_path(eos_drafter):
    # CUDA builds the union's ids on the device (a mask and one nonzero); the CPU path from host ranges. The
    # columns must come out in the same order, so both devices draft the same tree.
    head = eos_drafter.bound_head
    clusters = len(head.offsets) - 1
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(3, head.weight.shape[1], generator=gen)
    for density in (0.0, 0.2, 0.5, 1.0):
        selected = torch.rand(3, clusters, generator=gen) < density  # (T, M)
        cpu_ids = head.clusters_union(features, selected).token_ids  # union columns, then the extra ids
        device_ids = head._union_ids_on_device(selected)
        assert torch.equal(cpu_ids[: device_ids.numel()], device_ids)
        assert device_ids.numel() == cpu_ids.numel() - head.extra_ids.numel()


def test_eos_always_in_shortlist(eos_drafter):
    assert eos_drafter.config.always_include_ids == [2]
    out = draft_once(eos_drafter, head_mode="dynamic", num_clusters=1, return_vocab_logits=True)
    assert torch.isfinite(out.vocab_logits[:, 2]).all()


def test_static_head(eos_target):
    static = torch.tensor([5, 9, 17, 40, 99])
    drafter = tiny_drafter(eos_target, static_token_ids=static)
    out = draft_once(drafter, head_mode="static", return_vocab_logits=True)
    assert set(out.head.token_ids.tolist()) == {2, 5, 9, 17, 40, 99}
    assert torch.isfinite(out.vocab_logits).sum(dim=-1).eq(6).all()
    with pytest.raises(ValueError, match="static shortlist"):
        draft_once(tiny_drafter(eos_target), head_mode="static")


def test_depth_schedule():
    config = DynaSpecConfig(vocab_size=100, hidden_size=8, num_clusters=16, shortlist_k0=8, shortlist_k1=2)
    assert [config.clusters_at_depth(t, 4) for t in range(4)] == [8, 6, 4, 2]
    assert config.clusters_at_depth(0, 1) == 8
    config.shortlist_schedule = "exponential"
    assert [config.clusters_at_depth(t, 3) for t in range(3)] == [8, 4, 2]


def test_causal_mask_shape():
    mask = causal_mask(3, 2, torch.float32, torch.device("cpu"))
    assert mask.shape == (1, 1, 3, 5)
    assert (mask[0, 0] == 0).sum() == 3 + 4 + 5


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [("vocab_size", 96, "vocabulary size"), ("hidden_size", 48, "hidden size")],
)
def test_bind_refuses_another_target(eos_drafter, field, value, what):
    other = tiny_target(**{field: value, **({"num_attention_heads": 4} if field == "hidden_size" else {})})
    with pytest.raises(ValueError, match=what) as err:
        eos_drafter.bind(other)
    assert str(value) in str(err.value)


def test_bind_refuses_another_family(eos_drafter):
    from transformers import MistralConfig, MistralForCausalLM

    other = MistralForCausalLM(MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="'llama'.*'mistral'|'mistral'.*'llama'"):
        eos_drafter.bind(other)


def test_config_validation():
    with pytest.raises(ValueError, match="num_clusters"):
        DynaSpecConfig(vocab_size=10, hidden_size=8, num_clusters=11)
    with pytest.raises(ValueError, match="shortlist_k0"):
        DynaSpecConfig(vocab_size=100, hidden_size=8, num_clusters=4, shortlist_k0=5)
    with pytest.raises(ValueError, match="always_include_ids"):
        DynaSpecConfig(vocab_size=100, hidden_size=8, num_clusters=4, shortlist_k0=2, shortlist_k1=1,
                       always_include_ids=[100])


def test_missing_and_corrupt_checkpoint_files(tmp_path, eos_drafter):
    eos_drafter.save_pretrained(tmp_path)
    weights = next(p for p in tmp_path.iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(Exception, match=weights.name):
        DynaSpecDrafter.from_pretrained(tmp_path)
    intact = tmp_path / "intact"
    eos_drafter.save_pretrained(intact)
    (intact / "config.json").unlink()
    with pytest.raises(OSError, match="config.json"):
        DynaSpecDrafter.from_pretrained(intact)


def test_set_static_shortlist_round_trip(tmp_path, eos_target):
    drafter = tiny_drafter(eos_target)
    drafter.set_static_shortlist(torch.tensor([7, 3, 3, 50]))
    out = draft_once(drafter, head_mode="static")
    assert set(out.head.token_ids.tolist()) == {2, 3, 7, 50}
    drafter.save_pretrained(tmp_path)
    loaded = DynaSpecDrafter.from_pretrained(tmp_path).bind(eos_target)
    assert loaded.static_token_ids.tolist() == [3, 7, 50]
    with pytest.raises(ValueError, match="static shortlist ids"):
        drafter.set_static_shortlist(torch.tensor([999]))


def test_init_layer_from_target_eagle1(eos_target):
    drafter = tiny_drafter(eos_target, drafter_architecture="eagle1").init_layer_from_target(eos_target)
    for name, value in eos_target.model.layers[-1].state_dict().items():
        assert torch.equal(drafter.layer.state_dict()[name], value)


def test_init_eagle3_layer_from_target_computes_the_target_layer(eos_target):
    """Started from the target's last layer, the EAGLE-3 layer applied to (embedding, h) is that layer applied to
    h, whatever the embedding (its half of q/k/v starts at zero)."""
    drafter = tiny_drafter(eos_target).init_layer_from_target(eos_target)
    source = eos_target.model.layers[-1]
    torch.manual_seed(0)
    d = eos_target.config.hidden_size
    hidden, embeds = torch.randn(1, 5, d), torch.randn(1, 5, d)
    positions = torch.arange(5)[None]
    rotary = drafter.rotary_emb(hidden, positions)
    with torch.no_grad():
        mine = drafter.layer(drafter.layer.attention_input(embeds, hidden), hidden, position_ids=positions,
                             position_embeddings=rotary, attention_mask=causal_mask(5, 0, hidden.dtype, hidden.device))
        theirs = source(hidden, position_ids=positions, position_embeddings=rotary,
                        attention_mask=causal_mask(5, 0, hidden.dtype, hidden.device))
    torch.testing.assert_close(mine, theirs)


def hub_style_cache(tmp_path, drafter, repo_id="me/tiny-drafter", subfolder=None):
    """A cache laid out as huggingface_hub lays it out (models--org--name/snapshots/<commit>, refs/main)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    drafter.save_pretrained(snapshot / subfolder if subfolder else snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return tmp_path / "hub"


@pytest.mark.parametrize("subfolder", [None, "drafters/tiny"])
def test_loading_through_an_offline_hub_cache(tmp_path, eos_target, eos_drafter, subfolder, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    eos_drafter.generation_config = DynaSpecGenerationConfig(tree_policy="dyspec", num_draft_nodes=7)
    cache = hub_style_cache(tmp_path, eos_drafter, subfolder=subfolder)
    extra = {"subfolder": subfolder} if subfolder else {}
    loaded = DynaSpecDrafter.from_pretrained("me/tiny-drafter", cache_dir=cache, local_files_only=True, **extra)
    assert loaded.generation_config.num_draft_nodes == 7  # generation_config.json read from the same place
    loaded.eval().bind(eos_target)
    a, b = draft_once(eos_drafter), draft_once(loaded)
    assert torch.equal(a.head.logits, b.head.logits)
    with pytest.raises(OSError):
        DynaSpecDrafter.from_pretrained("me/tiny-drafter", cache_dir=cache, local_files_only=True,
                                        subfolder="missing")


def test_subfolder_of_a_local_folder(tmp_path, eos_drafter):
    eos_drafter.save_pretrained(tmp_path / "repo" / "drafter")
    loaded = DynaSpecDrafter.from_pretrained(tmp_path / "repo", subfolder="drafter")
    assert torch.equal(loaded.cluster_permutation, eos_drafter.cluster_permutation)
    config = json.loads((tmp_path / "repo" / "drafter" / "config.json").read_text())
    assert config["architectures"][0] == "AutoModelForCausalLM"  # how pipelines find the class of a named assistant


def test_architecture_settings_are_validated(eos_target):
    config = eos_target.config
    with pytest.raises(ValueError, match="drafter_architecture must be one of"):
        DynaSpecConfig.from_target_config(config, num_clusters=8, drafter_architecture="eagle2")
    with pytest.raises(ValueError, match="target_layer_ids is for drafter_architecture='eagle3'"):
        DynaSpecConfig.from_target_config(config, num_clusters=8, drafter_architecture="eagle1", target_layer_ids=[1])
    with pytest.raises(ValueError, match=r"target_layer_ids \[7\]"):
        DynaSpecConfig.from_target_config(config, num_clusters=8, target_layer_ids=[7])
    fused = DynaSpecConfig.from_target_config(config, num_clusters=8, target_layer_ids=[0, 2])
    assert fused.feature_layer_ids == [0, 2] and DynaSpecDrafter(fused).fc.in_features == 2 * config.hidden_size


def test_project_refuses_features_of_the_wrong_width(eos_target):
    drafter = tiny_drafter(eos_target)
    with pytest.raises(ValueError, match="pass `drafter.target_features"):
        drafter.project(torch.zeros(1, 2, eos_target.config.hidden_size))
    with pytest.raises(ValueError, match="output_hidden_states=True"):
        drafter.target_features((torch.zeros(1, 2, eos_target.config.hidden_size),))


def head_of(drafter, out, mode, k, context_ids):
    """The bound head applied to a drafting call's features in `mode`, with the context tokens `context_ids`."""
    head = drafter.bound_head
    context = None
    if context_ids is not None:
        context = head.context_columns(torch.as_tensor(context_ids).flatten().tolist(), mode)
    return head.logits(out.hidden_states[0], mode, out.router_logits[0], k, context)


def test_context_head_core_is_sized_by_static_size(eos_target):
    """"context" with static_size=N reads the N most frequent stored tokens as its core (NanoSpec's small core
    beside a 32k static shortlist stored for FR-Spec), and stays exact."""
    drafter = tiny_drafter(eos_target)
    drafter.set_static_shortlist(torch.tensor([30, 5, 17, 9]), ranked=True)
    drafter.bind(eos_target)
    eos = sorted(drafter.bound_head.extra_ids.tolist())
    assert drafter.bound_head.context_columns([44], "context", 2).token_ids.tolist() == sorted({5, 30, 44, *eos})
    ids = prompt(8)
    out = eos_target.generate(ids, assistant_model=drafter, head_mode="context", static_size=2, max_new_tokens=16,
                              do_sample=False)
    assert torch.equal(out, greedy(eos_target, ids, max_new_tokens=16))


def test_context_head_scores_the_core_and_the_context_tokens(eos_target):
    core = torch.tensor([5, 9, 17])
    drafter = tiny_drafter(eos_target, static_token_ids=core)
    out = draft_once(drafter, head_mode=None)
    context = torch.tensor([9, 44, 120])
    head = head_of(drafter, out, "context", 1, context)
    assert head.token_ids.tolist() == [2, 5, 9, 17, 44, 120]  # core, context and EOS, each once
    dense = drafter.dense_logits(out.hidden_states[0]).float()
    torch.testing.assert_close(head.logits, dense[:, head.token_ids], rtol=1e-5, atol=1e-5)
    assert head.shortlist_sizes.eq(6).all()
    with pytest.raises(ValueError, match="context columns"):
        head_of(drafter, out, "context", 1, None)


def test_union_head_is_the_router_clusters_plus_the_context_each_token_once(eos_drafter):
    out = draft_once(eos_drafter, head_mode=None)
    k, context = 2, torch.tensor([3, 50, 77, 121])
    head = head_of(eos_drafter, out, "union", k, context)
    vocab = head.to_vocab(eos_drafter.config.vocab_size)
    dense = eos_drafter.dense_logits(out.hidden_states[0]).float()
    for t in range(vocab.shape[0]):
        chosen = out.router_logits[0, t].topk(k).indices
        allowed = set(eos_drafter.clusters.tokens(chosen).tolist()) | set(context.tolist()) | {2}
        assert set(torch.isfinite(vocab[t]).nonzero().flatten().tolist()) == allowed
        # one finite column per token: a context token inside a chosen cluster is not counted twice
        live = head.token_ids[torch.isfinite(head.logits[t])]
        assert live.numel() == len(allowed) == int(head.shortlist_sizes[t])
        idx = torch.tensor(sorted(allowed))
        torch.testing.assert_close(vocab[t, idx], dense[t, idx], rtol=1e-5, atol=1e-5)


def test_ranked_static_shortlist_keeps_a_prefix_per_call(tmp_path, eos_target):
    ranked = torch.tensor([40, 7, 99, 7, 5, 17])  # most frequent first (a duplicate is dropped)
    drafter = tiny_drafter(eos_target)
    drafter.set_static_shortlist(ranked, ranked=True)
    assert drafter.static_token_ids.tolist() == [40, 7, 99, 5, 17] and drafter.config.static_shortlist_ranked
    out = draft_once(drafter, head_mode=None)
    head = drafter.bound_head
    top3 = head.logits(out.hidden_states[0], "static", static_size=3)
    assert set(top3.token_ids.tolist()) == {40, 7, 99, 2}  # the 3 most frequent and EOS
    assert set(head.logits(out.hidden_states[0], "static").token_ids.tolist()) == {40, 7, 99, 5, 17, 2}
    drafter.save_pretrained(tmp_path)
    loaded = DynaSpecDrafter.from_pretrained(tmp_path).bind(eos_target)
    assert loaded.static_token_ids.tolist() == [40, 7, 99, 5, 17] and loaded.config.static_shortlist_ranked
    by_id = tiny_drafter(eos_target, static_token_ids=torch.tensor([5, 9, 17]))
    with pytest.raises(ValueError, match="frequency-ranked"):
        by_id.bound_head.logits(out.hidden_states[0], "static", static_size=2)


def test_static_size_keeps_greedy_exact_and_is_validated(eos_target):
    drafter = tiny_drafter(eos_target)
    drafter.set_static_shortlist(torch.arange(3, 100), ranked=True)
    ids = prompt(7)
    out = eos_target.generate(ids, assistant_model=drafter, head_mode="static", static_size=20, max_new_tokens=16,
                              do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy(eos_target, ids, max_new_tokens=16))
    assert out.speculative_stats.mean_shortlist_size <= 21  # 20 tokens and EOS
    with pytest.raises(ValueError, match="static_size=500"):
        eos_target.generate(ids, assistant_model=drafter, head_mode="static", static_size=500, max_new_tokens=4)
    with pytest.raises(ValueError, match="does not read it"):  # never silently ignored
        eos_target.generate(ids, assistant_model=drafter, head_mode="dynamic", static_size=20, max_new_tokens=4)


def test_a_drafter_default_static_size_goes_with_its_head(eos_target):
    """A drafter shipped with head_mode="static" and its list size: a call that picks a head which does not read
    static_size drops the drafter's size with the drafter's head (a size the call sets itself is still refused)."""
    drafter = tiny_drafter(eos_target)
    drafter.set_static_shortlist(torch.arange(3, 100), ranked=True)
    drafter.generation_config.head_mode, drafter.generation_config.static_size = "static", 20
    ids = prompt(7)
    out = eos_target.generate(ids, assistant_model=drafter, head_mode="dynamic", max_new_tokens=16, do_sample=False,
                              return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy(eos_target, ids, max_new_tokens=16))
    resolve = lambda **call: resolve_draft_settings(  # noqa: E731
        DynaSpecGenerationConfig(**call), drafter.generation_config, drafter.config)
    assert (resolve().head_mode, resolve().static_size) == ("static", 20)
    assert (resolve(head_mode="dynamic").head_mode, resolve(head_mode="dynamic").static_size) == ("dynamic", None)
    assert resolve(head_mode="context").static_size == 20  # the context head reads it as its core
    with pytest.raises(ValueError, match="does not read it"):
        resolve(head_mode="dynamic", static_size=10)

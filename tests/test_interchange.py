"""EAGLE-3 export (hf_dynaspec/interchange.py): the exported tensors are the ones vLLM / SGLang load, a forward
written from vLLM's llama_eagle3.py drafts what the drafter drafts, and export -> load round-trips (checkpoints
written elsewhere, and malformed ones: tests/test_checkpoints.py).

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_interchange.py
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import greedy, prompt, tiny_drafter, tiny_target
from safetensors.torch import load_file

from hf_dynaspec.checkpoints import load_eagle3
from hf_dynaspec.interchange import export_eagle3, shortlist_token_counts

EOS = 2
STATIC = torch.arange(3, 60)  # the drafter's static shortlist; with EOS the draft vocabulary has 58 tokens
DRAFT_VOCAB = 58
D, HEADS, KV_HEADS, HEAD_DIM, FFN, V = 32, 4, 2, 8, 64, 128  # tests/helpers.py tiny_target

# What the loaders expect, name -> (shape, dtype). vLLM llama_eagle3.py @ 00bd1493: fc = Linear(3 *
# target_hidden_size, hidden_size, bias=False); qkv_proj = QKVParallelLinear(2 * hidden_size, head_dim, heads, kv_heads)
# fed by q/k/v_proj; lm_head = ParallelLMHead(draft_vocab_size, hidden_size); draft_id_to_target_id (draft_vocab_size,)
# long. speculators core.py @ 033c87f2: t2d (V,) bool. SGLang llama_eagle3.py @ d737979c: the same under `midlayer.`.
EXPECTED = {
    "fc.weight": ((D, 3 * D), torch.float32),
    "midlayer.input_layernorm.weight": ((D,), torch.float32),
    "midlayer.hidden_norm.weight": ((D,), torch.float32),
    "midlayer.self_attn.q_proj.weight": ((HEADS * HEAD_DIM, 2 * D), torch.float32),
    "midlayer.self_attn.k_proj.weight": ((KV_HEADS * HEAD_DIM, 2 * D), torch.float32),
    "midlayer.self_attn.v_proj.weight": ((KV_HEADS * HEAD_DIM, 2 * D), torch.float32),
    "midlayer.self_attn.o_proj.weight": ((D, HEADS * HEAD_DIM), torch.float32),
    "midlayer.post_attention_layernorm.weight": ((D,), torch.float32),
    "midlayer.mlp.gate_proj.weight": ((FFN, D), torch.float32),
    "midlayer.mlp.up_proj.weight": ((FFN, D), torch.float32),
    "midlayer.mlp.down_proj.weight": ((D, FFN), torch.float32),
    "norm.weight": ((D,), torch.float32),
    "lm_head.weight": ((DRAFT_VOCAB, D), torch.float32),
    "d2t": ((DRAFT_VOCAB,), torch.int64),
    "t2d": ((V,), torch.bool),
}
# Parameters of vLLM's Eagle3LlamaForCausalLM (embed_tokens skipped: shared with the target) and of SGLang's
# LlamaForCausalLMEagle3 (embed_tokens replaced by the target's), after their stacking of q/k/v and gate/up.
VLLM_PARAMS = {
    "model.fc.weight", "model.norm.weight", "lm_head.weight", "draft_id_to_target_id",
    *(f"model.layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                             "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                             "mlp.down_proj")),
}  # fmt: skip
SGLANG_PARAMS = {
    "model.fc.weight", "model.norm.weight", "lm_head.weight",
    *(f"model.midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                             "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                             "mlp.down_proj")),
}  # fmt: skip
STACKED = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj", ".gate_proj": ".gate_up_proj",
           ".up_proj": ".gate_up_proj"}  # fmt: skip


# ---------------------------------------------------------------------------------------------- fixtures


def perturbed_drafter(target, layer_ids=None):
    """A drafter whose weights all differ from their init (norms included), with the static shortlist set."""
    kwargs = {"target_layer_ids": layer_ids} if layer_ids else {}
    drafter = tiny_drafter(target, **kwargs)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in drafter.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    drafter.set_static_shortlist(STATIC)
    return drafter


@pytest.fixture(scope="module")
def target():
    """8 layers: the default fused layers (2, L//2, L-3) = (2, 4, 5) are distinct and below the final norm."""
    return tiny_target(eos_token_id=EOS, num_hidden_layers=8)


@pytest.fixture(scope="module")
def drafter(target):
    return perturbed_drafter(target)


@pytest.fixture(scope="module")
def exported(target, drafter, tmp_path_factory):
    return {
        fmt: export_eagle3(drafter, target, tmp_path_factory.mktemp(fmt), format=fmt)
        for fmt in ("eagle3", "speculators")
    }


def features(drafter, target, ids):
    with torch.no_grad():
        return drafter.target_features(target(ids, output_hidden_states=True).hidden_states)  # (1, T, 3d)


# ---------------------------------------------------------------------------------------------- exported files


def vllm_names(names):
    """vLLM's Eagle3LlamaForCausalLM.load_weights renaming (t2d skipped, d2t renamed, `model.` prefix but for
    lm_head, `midlayer.` -> `layers.0.`), then LlamaModel's q/k/v and gate/up stacking."""
    out = set()
    for name in names:
        if "t2d" in name:
            continue
        name = name.replace("d2t", "draft_id_to_target_id") if "d2t" in name else name
        name = name if "lm_head" in name or "draft_id" in name else "model." + name
        name = name.replace("midlayer.", "layers.0.")
        out.add(next((name.replace(a, b) for a, b in STACKED.items() if a in name), name))
    return out


def sglang_names(names):
    """SGLang's LlamaForCausalLMEagle3.load_weights: d2t -> hot tokens, t2d skipped, stacking, then `model.` when the
    bare name is no parameter; names matching no parameter are dropped SILENTLY, hence the equality check."""
    out = set()
    for name in names:
        if name in ("d2t", "t2d"):
            continue
        name = next((name.replace(a, b) for a, b in STACKED.items() if a in name), name)
        out.add(name if name in SGLANG_PARAMS else f"model.{name}")
    return out


def test_exported_tensors_are_what_the_loaders_expect(target, drafter, exported):
    tensors = load_file(exported["eagle3"] / "model.safetensors")
    assert {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} == EXPECTED
    assert vllm_names(tensors) == VLLM_PARAMS and sglang_names(tensors) == SGLANG_PARAMS
    assert sorted(p.name for p in exported["eagle3"].iterdir()) == ["config.json", "model.safetensors"]
    vocab = torch.arange(DRAFT_VOCAB) + tensors["d2t"]  # EAGLE-3: target id = draft index + d2t
    assert vocab.tolist() == [EOS, *STATIC.tolist()]
    assert torch.equal(tensors["t2d"].nonzero().flatten(), vocab)
    assert torch.equal(tensors["lm_head.weight"], target.lm_head.weight[vocab])
    assert torch.equal(tensors["fc.weight"], drafter.fc.weight)  # layers (2, 4, 5) already ascending


def test_exported_config_has_the_keys_the_loaders_read(exported):
    config = json.loads((exported["eagle3"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    expected = dict(
        hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        intermediate_size=FFN, num_hidden_layers=1, vocab_size=V, draft_vocab_size=DRAFT_VOCAB, target_hidden_size=D,
        tie_word_embeddings=False, norm_before_residual=False, rms_norm_eps=1e-6, rope_theta=10000.0,
        eagle_aux_hidden_state_layer_ids=[2, 4, 5],  # vLLM: the hidden state entering layer i
    )  # fmt: skip
    assert {k: config[k] for k in expected} == expected
    sglang_ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert sglang_ids == [1, 3, 4]  # SGLang: the output of layer i, captured before layer i + 1
    assert config["rope_scaling"] is None and config["rope_parameters"]["rope_type"] == "default"


def test_speculators_layout(exported):
    config = json.loads((exported["speculators"] / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert "name_or_path" in config["speculators_config"]["verifier"]
    layer = config["transformer_layer_config"]  # what vLLM builds its LlamaConfig from
    assert (layer["vocab_size"], layer["hidden_size"], layer["model_type"]) == (V, D, "llama")
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    tensors = load_file(exported["speculators"] / "model.safetensors")
    assert {k.replace("layers.0.", "midlayer.") for k in tensors} == set(EXPECTED)
    assert vllm_names(tensors) == VLLM_PARAMS


# ---------------------------------------------------------------------------------------------- vLLM reference
# Written from vllm-project/vllm vllm/model_executor/models/llama_eagle3.py @ 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190
# (LlamaDecoderLayer.forward, LlamaModel.forward, Eagle3LlamaForCausalLM.combine_hidden_states / compute_logits).


def rms_norm(x, weight, eps):
    """vLLM RMSNorm (fp32 statistics)."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def neox_rope(x, positions, theta):
    """vLLM get_rope(..., is_neox_style=True), default scaling: x (H, T, hd) rotated by halves."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * inv_freq[None]  # (T, hd/2)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def eagle3_layer(w, cfg, embeds, hidden):
    """vLLM llama_eagle3.py @ 00bd1493 LlamaDecoderLayer (layer_idx 0, norm_before_residual False) then
    LlamaModel.forward's final fused norm: (T, d) x 2 -> (normed, pre-norm), both (T, d)."""
    eps, hd, p = cfg["rms_norm_eps"], cfg["head_dim"], "midlayer."
    residual = hidden
    x = torch.cat([rms_norm(embeds, w[p + "input_layernorm.weight"], eps),
                   rms_norm(hidden, w[p + "hidden_norm.weight"], eps)], dim=-1)  # (T, 2d)  # fmt: skip
    q, k, v = (x @ w[f"{p}self_attn.{n}_proj.weight"].T for n in "qkv")
    t = torch.arange(x.shape[0])
    heads, kv_heads, theta = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rope_theta"]
    q = neox_rope(q.view(-1, heads, hd).transpose(0, 1), t, theta)  # (H, T, hd)
    k = neox_rope(k.view(-1, kv_heads, hd).transpose(0, 1), t, theta)  # (H_kv, T, hd)
    v = v.view(-1, kv_heads, hd).transpose(0, 1)
    groups = heads // kv_heads
    attn = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0),
                                          is_causal=True)  # fmt: skip
    attn = attn.transpose(0, 1).flatten(1) @ w[p + "self_attn.o_proj.weight"].T  # (T, d)
    residual = attn + residual  # post_attention_layernorm(hidden_states, residual): fused add, then norm
    h = rms_norm(residual, w[p + "post_attention_layernorm.weight"], eps)
    gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T  # (T, ffn)
    h = (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T  # SiluAndMul, down_proj
    prenorm = h + residual  # self.norm(hidden_states, residual)
    return rms_norm(prenorm, w["norm.weight"], eps), prenorm


@torch.no_grad()
def vllm_reference_drafts(folder: Path, target, ids, steps):
    """Chain drafts of an exported folder as vLLM computes them: aux hidden states entering layers
    eagle_aux_hidden_state_layer_ids, combine_hidden_states (fc), the layer, compute_logits (lm_head, then
    draft index + d2t), the next step reading the pre-norm output. Full recompute instead of a KV cache."""
    cfg, w = json.loads((folder / "config.json").read_text()), load_file(folder / "model.safetensors")
    out = target(ids, output_hidden_states=True)
    layers = cfg["eagle_aux_hidden_state_layer_ids"]
    aux = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # (T, 3d)
    hidden = aux @ w["fc.weight"].T  # (T, d)
    tokens = [*ids[0, 1:].tolist(), int(out.logits[0, -1].argmax())]  # each position reads the next token
    drafts, logits = [], []
    for _ in range(steps):
        normed, prenorm = eagle3_layer(w, cfg, target.get_input_embeddings()(torch.tensor(tokens)), hidden)
        # (N,) over the draft vocabulary
        logits.append(normed[-1] @ w["lm_head.weight"].T * cfg.get("logit_scale", 1.0))
        index = int(logits[-1].argmax())
        drafts.append(index + int(w["d2t"][index]))
        tokens.append(drafts[-1])
        hidden = torch.cat([hidden, prenorm[-1:]])
    return drafts, torch.stack(logits)


@torch.no_grad()
def drafter_drafts(drafter, target, ids, steps):
    """The same chain with the drafter's static head."""
    out = target(ids, output_hidden_states=True)
    hidden = drafter.project(drafter.target_features(out.hidden_states))  # (1, T, d)
    tokens = torch.cat([ids[:, 1:], out.logits[:, -1:].argmax(-1)], dim=-1)
    drafts, logits = [], []
    for _ in range(steps):
        step = drafter(input_ids=tokens, hidden_states=hidden, head_mode="static")
        logits.append(step.head.logits[-1])
        drafts.append(int(step.head.token_ids[logits[-1].argmax()]))
        tokens = torch.cat([tokens, torch.tensor([[drafts[-1]]])], dim=-1)
        hidden = torch.cat([hidden, step.next_hidden_states[:, -1:]], dim=1)
    return drafts, torch.stack(logits)


@pytest.mark.parametrize("layer_ids", [None, [5, 2, 4]], ids=["default-layers", "unsorted-layers"])
def test_vllm_reference_forward_drafts_what_the_drafter_drafts(target, tmp_path, layer_ids):
    drafter = perturbed_drafter(target, layer_ids)
    folder = export_eagle3(drafter, target, tmp_path)
    for seed in (1, 2):
        ids = prompt(9, vocab_size=V, seed=seed)
        expected, expected_logits = drafter_drafts(drafter, target, ids, steps=5)
        got, got_logits = vllm_reference_drafts(folder, target, ids, steps=5)
        assert drafter.bound_head.static_ids.tolist() == [EOS, *STATIC.tolist()]  # columns = draft vocabulary
        torch.testing.assert_close(got_logits, expected_logits, rtol=1e-5, atol=1e-5)
        assert got == expected


# ---------------------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_export_load_gives_identical_static_drafts(target, drafter, exported, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the lm_head is the target's rows: no warning
        loaded = load_eagle3(exported[fmt], target, num_clusters=8)
    assert loaded.config.target_layer_ids == [2, 4, 5] and loaded.is_eagle3
    assert torch.equal(loaded.bound_head.static_ids, drafter.bound_head.static_ids)
    ids = prompt(11, vocab_size=V, seed=4)
    feats = features(drafter, target, ids)
    with torch.no_grad():
        a = drafter(input_ids=ids, hidden_states=drafter.project(feats), head_mode="static")
        b = loaded(input_ids=ids, hidden_states=loaded.project(feats), head_mode="static")
    for name in ("hidden_states", "next_hidden_states"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert torch.equal(a.head.token_ids, b.head.token_ids) and torch.equal(a.head.logits, b.head.logits)


def test_loaded_drafter_generates_exactly_plain_greedy(target, exported):
    loaded = load_eagle3(exported["eagle3"], target, num_clusters=8)
    for seed in (1, 5):
        ids = prompt(7, vocab_size=V, seed=seed)
        got = target.generate(
            ids, assistant_model=loaded, head_mode="static", do_sample=False, max_new_tokens=20
        )
        assert torch.equal(got, greedy(target, ids, max_new_tokens=20))


def test_unsorted_layers_round_trip(target, tmp_path):
    drafter = perturbed_drafter(target, [5, 2, 4])
    loaded = load_eagle3(export_eagle3(drafter, target, tmp_path), target, num_clusters=8)
    assert loaded.config.target_layer_ids == [2, 4, 5]
    # the drafter's blocks read layers (5, 2, 4); the export's read (2, 4, 5)
    assert torch.equal(loaded.fc.weight, drafter.fc.weight.unflatten(1, (3, D))[:, [1, 2, 0]].flatten(1))
    ids = prompt(8, vocab_size=V, seed=6)
    assert drafter_drafts(drafter, target, ids, 4)[0] == drafter_drafts(loaded, target, ids, 4)[0]


# ---------------------------------------------------------------------------------------------- draft vocabulary


def test_shortlist_counts_and_vocabulary_by_counts(target, drafter, tmp_path):
    ids = prompt(12, vocab_size=V, seed=7)
    counts = shortlist_token_counts(drafter, features(drafter, target, ids), ids)
    with torch.no_grad():
        out = drafter(input_ids=ids, hidden_states=drafter.project(features(drafter, target, ids)),
                      head_mode="dynamic", return_vocab_logits=True)  # fmt: skip
    # each position's shortlist, counted
    assert torch.equal(counts, torch.isfinite(out.vocab_logits).sum(dim=0))
    assert counts[EOS] == ids.shape[1]
    counts = counts.clone()
    counts[EOS] = 0  # EOS stays in the draft vocabulary whatever its count
    folder = export_eagle3(drafter, target, tmp_path, draft_vocab_size=40, token_counts=counts)
    tensors = load_file(folder / "model.safetensors")
    vocab = (torch.arange(40) + tensors["d2t"]).tolist()
    order = sorted(range(V), key=lambda t: (-int(counts[t]), t))
    assert vocab == sorted({EOS, *[t for t in order if t != EOS][:39]})
    assert json.loads((folder / "config.json").read_text())["draft_vocab_size"] == 40
    assert torch.equal(tensors["lm_head.weight"], target.lm_head.weight[vocab])


def test_export_needs_counts_or_a_static_shortlist(target, tmp_path):
    with pytest.raises(ValueError, match="token_counts"):
        export_eagle3(tiny_drafter(target), target, tmp_path)
    drafter = perturbed_drafter(target)
    ranked = drafter.static_token_ids.tolist()  # most frequent first
    available = len({*ranked, EOS})
    with pytest.raises(ValueError, match=f"holds {available} tokens"):  # a size the shortlist cannot fill
        export_eagle3(drafter, target, tmp_path, draft_vocab_size=available + 1)
    folder = export_eagle3(drafter, target, tmp_path, draft_vocab_size=10)  # its 9 first tokens + EOS
    vocab = (torch.arange(10) + load_file(folder / "model.safetensors")["d2t"]).tolist()
    assert vocab == sorted({EOS, *[t for t in ranked if t != EOS][:9]})
    full = export_eagle3(tiny_drafter(target), target, tmp_path / "full", draft_vocab_size=V)  # the full head
    tensors = load_file(full / "model.safetensors")
    assert "d2t" not in tensors and "t2d" not in tensors  # vLLM refuses maps where the draft vocabulary is V
    assert json.loads((full / "config.json").read_text())["draft_vocab_size"] == V
    assert torch.equal(load_eagle3(full, target, num_clusters=8).static_token_ids.sort().values, torch.arange(V))


def test_layer_id_conventions(target, tmp_path):
    with pytest.raises(ValueError, match="final normed state"):
        export_eagle3(perturbed_drafter(target, [2, 4, 8]), target, tmp_path)
    # SGLang's two readings (before / after PR #25454) differ when the first HF index is not 2
    with pytest.warns(UserWarning, match="PR #25454"):
        folder = export_eagle3(perturbed_drafter(target, [3, 4, 5]), target, tmp_path / "late")
    config = json.loads((folder / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    shallow = tiny_target(eos_token_id=EOS)  # 2 layers: the default ids collapse to [2, 1, 1]
    with pytest.raises(ValueError, match="3 distinct target layers"):
        export_eagle3(perturbed_drafter(shallow), shallow, tmp_path)


def test_cli_export_counts_the_dynamic_shortlists_on_feature_data(tmp_path, monkeypatch):
    """`hf-dynaspec export DRAFTER OUT --data FEATURES`: the draft vocabulary is what the drafter's dynamic
    shortlists held most often on that data (counted by `shortlist_counts_on_data`), EOS included."""
    from hf_dynaspec import cli
    from hf_dynaspec.configuration import eagle3_layer_ids
    from hf_dynaspec.interchange import shortlist_counts_on_data
    from hf_dynaspec.targets import byte_level_tokenizer
    from hf_dynaspec.training.corpus import write_answers
    from hf_dynaspec.training.features import write_features

    tokenizer = byte_level_tokenizer()
    target = tiny_target(num_hidden_layers=8, eos_token_id=EOS, vocab_size=len(tokenizer))
    drafter = tiny_drafter(target)
    write_answers(target, tokenizer, [{"prompt": p} for p in ("ab", "hello", "xyz!")], tmp_path / "c", 6, 3,
                  progress=False)
    write_features(target, tmp_path / "c", tmp_path / "f", eagle3_layer_ids(8), progress=False)
    counts = shortlist_counts_on_data(drafter, [str(tmp_path / "f")])
    assert counts[EOS] == counts.max() > 0 and int((counts > 0).sum()) < len(tokenizer)  # not everything
    drafter.save_pretrained(tmp_path / "d")
    monkeypatch.setattr(cli, "target_from_args", lambda args: (target, tokenizer))
    assert cli.main(["export", str(tmp_path / "d"), str(tmp_path / "e"), "--data", str(tmp_path / "f"),
                     "--draft-vocab-size", "40"]) == 0
    draft_ids = torch.arange(40) + load_file(str(tmp_path / "e" / "model.safetensors"))["d2t"]
    assert draft_ids.tolist() == counts.argsort(descending=True, stable=True)[:40].sort().values.tolist()
    assert EOS in draft_ids.tolist()

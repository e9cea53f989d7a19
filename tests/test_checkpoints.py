"""EAGLE-3 checkpoints trained elsewhere (hf_dynaspec/checkpoints.py): folders written the way speculators,
SpecForge and the EAGLE authors write them open with `DynaSpecDrafter.from_pretrained`, draft exactly what a
forward written from their trainers' code drafts, keep their trained head (greedy output stays plain greedy's
with every head), go back out unchanged, load by name in generate() / pipeline() and from a Hub cache, and
malformed or foreign checkpoints are refused with the file and field named.

    OMP_NUM_THREADS=1 python -m pytest -q tests/test_checkpoints.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import greedy, prompt, tiny_target
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, pipeline

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.checkpoints import checkpoint_format, layer_ids_of
from hf_dynaspec.interchange import export_eagle3

EOS = 2
D, HEADS, KV_HEADS, HEAD_DIM, FFN, V, N = 32, 4, 2, 8, 48, 128, 40  # FFN: the draft's own MLP width
LAYERS = [2, 4, 5]  # HF hidden-state indices (the servers' default for 8 layers)
LAYOUTS = ("speculators", "specforge", "eagle")


@pytest.fixture(scope="module")
def target():
    return tiny_target(eos_token_id=EOS, num_hidden_layers=8)


# ---------------------------------------------------------------------------------------------- writers


def draft_ids(seed: int = 0) -> torch.Tensor:
    """(N,) ascending target ids of a draft vocabulary (as the trainers sort it), EOS in."""
    generator = torch.Generator().manual_seed(seed)
    rest = torch.randperm(V - 3, generator=generator)[: N - 1] + 3
    return torch.cat([rest, torch.tensor([EOS])]).sort().values


def trained_weights(prefix: str, variants: dict[str, bool], embed: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of a one-layer EAGLE-3 draft, as trained (lm_head not the target's rows)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return scale * torch.randn(*shape, generator=generator)

    w = {"fc.weight": rand(D, 3 * D), "norm.weight": 1 + rand(D), "lm_head.weight": rand(N, D, scale=1.0)}
    for name, shape in (("input_layernorm", (D,)), ("hidden_norm", (D,)), ("post_attention_layernorm", (D,))):
        w[f"{prefix}{name}.weight"] = 1 + rand(*shape)
    for name, rows in (("q_proj", HEADS * HEAD_DIM), ("k_proj", KV_HEADS * HEAD_DIM), ("v_proj", KV_HEADS * HEAD_DIM)):
        w[f"{prefix}self_attn.{name}.weight"] = rand(rows, 2 * D)
    w[f"{prefix}self_attn.o_proj.weight"] = rand(D, HEADS * HEAD_DIM)
    w[f"{prefix}mlp.gate_proj.weight"], w[f"{prefix}mlp.up_proj.weight"] = rand(FFN, D), rand(FFN, D)
    w[f"{prefix}mlp.down_proj.weight"] = rand(D, FFN)
    if variants.get("norm_before_fc"):
        w["input_norm.weight"] = 1 + rand(3 * D)
    if variants.get("fc_norm"):
        w |= {f"fc_norm.{i}.weight": 1 + rand(D) for i in range(3)}
    if embed:
        w["embed_tokens.weight"] = rand(V, D, scale=1.0)
    ids = draft_ids(seed)
    w["d2t"] = ids - torch.arange(N)
    w["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, ids, True)
    return w


def layer_config(**extra) -> dict:
    return dict(model_type="llama", vocab_size=V, hidden_size=D, intermediate_size=FFN, num_hidden_layers=1,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_act="silu",
                rms_norm_eps=1e-6, max_position_embeddings=1024, eos_token_id=EOS, **extra)


# (config, weight prefix, variants, own embeddings, weight file) of each trainer's layout
def layout(name: str) -> tuple[dict, str, dict[str, bool], bool, str]:
    if name == "speculators":  # its training CLI's defaults: three variants on, a sliding window, embeddings saved
        variants = dict(norm_before_residual=True, norm_before_fc=True, norm_output=True, fc_norm=False)
        config = dict(
            speculators_model_type="eagle3", architectures=["Eagle3DraftModel"], draft_vocab_size=N,
            transformer_layer_config=layer_config(rope_theta=10000.0, layer_types=["sliding_attention"],
                                                  sliding_window=2048, use_sliding_window=True),
            eagle_aux_hidden_state_layer_ids=LAYERS, target_hidden_size=None, embed_requires_grad=False, **variants,
            speculators_config={"algorithm": "eagle3", "default_proposal_method": "greedy",
                                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}})
        return config, "layers.0.", variants, True, "model.safetensors"
    if name == "specforge":  # flat, SGLang's layer ids ("output of layer i"), EAGLE 3.1's per-layer fc norms
        variants = dict(fc_norm=True)
        config = layer_config(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=N, rope_theta=10000.0,
                              eagle_config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in LAYERS]},
                              fc_norm=True, norm_output=True, tie_word_embeddings=False)
        return config, "midlayer.", variants, False, "model.safetensors"
    # the EAGLE authors': a plain Llama config, no layer ids, no rope_theta (10000), a pickled state dict
    config = layer_config(architectures=["LlamaForCausalLM"], draft_vocab_size=N)
    return config, "midlayer.", {}, False, "pytorch_model.bin"


def write_layout(folder: Path, name: str, seed: int = 0) -> Path:
    config, prefix, variants, embed, file = layout(name)
    folder.mkdir(parents=True, exist_ok=True)
    weights = trained_weights(prefix, variants, embed, seed)
    (folder / "config.json").write_text(json.dumps(config))
    if file.endswith(".bin"):
        torch.save(weights, folder / file)
    else:
        save_file(weights, folder / file)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: write_layout(tmp_path_factory.mktemp(name), name) for name in LAYOUTS}


# ---------------------------------------------------------------------------------------------- reference forward
# Written from the trainers' draft step: speculators src/speculators/models/eagle3/core.py and
# model_definitions.py @ c05b95b3 (variants), SpecForge llama3_eagle.py @ a6b6b023, SafeAILab/EAGLE cnets.py @ cb7e0841.


def rms_norm(x, weight, eps=1e-6):
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def rope(x, positions, theta=10000.0):
    """Neox-style rotation by halves: x (H, T, hd)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * inv_freq[None]  # (T, hd/2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()], dim=-1)


def draft_layer(w, p, v, embeds, hidden):
    """One draft step over all positions: (T, d) x 2 -> (normed output, state fed to the next step)."""
    x = torch.cat([rms_norm(embeds, w[p + "input_layernorm.weight"]), rms_norm(hidden, w[p + "hidden_norm.weight"])], -1)
    residual = rms_norm(hidden, w[p + "hidden_norm.weight"]) if v.get("norm_before_residual") else hidden
    t = torch.arange(x.shape[0])
    q = rope((x @ w[p + "self_attn.q_proj.weight"].T).view(-1, HEADS, HEAD_DIM).transpose(0, 1), t)
    k = rope((x @ w[p + "self_attn.k_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1), t)
    val = (x @ w[p + "self_attn.v_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1)
    g = HEADS // KV_HEADS
    attn = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 0), val.repeat_interleave(g, 0), is_causal=True)
    h = residual + attn.transpose(0, 1).flatten(1) @ w[p + "self_attn.o_proj.weight"].T
    m = rms_norm(h, w[p + "post_attention_layernorm.weight"])
    out = h + (F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)) @ \
        w[p + "mlp.down_proj.weight"].T
    normed = rms_norm(out, w["norm.weight"])
    return normed, normed if v.get("norm_output") else out


@torch.no_grad()
def reference_drafts(name, target, ids, steps, seed=0):
    """A chain of greedy drafts as the layout's trainer computes them (full recompute, no cache): draft token =
    argmax over the draft vocabulary, mapped to target ids through d2t."""
    _, p, v, embed, _ = layout(name)
    w = trained_weights(p, v, embed, seed)
    out = target(ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i][0] for i in LAYERS], dim=-1)  # (T, 3d)
    if v.get("norm_before_fc"):
        aux = rms_norm(aux, w["input_norm.weight"])
    if v.get("fc_norm"):
        aux = torch.cat([rms_norm(c, w[f"fc_norm.{i}.weight"]) for i, c in enumerate(aux.chunk(3, -1))], -1)
    hidden = aux @ w["fc.weight"].T  # (T, d)
    table = w["embed_tokens.weight"] if embed else target.get_input_embeddings().weight
    tokens = [*ids[0, 1:].tolist(), int(out.logits[0, -1].argmax())]
    drafts = []
    for _ in range(steps):
        normed, fed = draft_layer(w, p, v, table[torch.tensor(tokens)], hidden)
        index = int((normed[-1] @ w["lm_head.weight"].T).argmax())
        drafts.append(index + int(w["d2t"][index]))
        tokens.append(drafts[-1])
        hidden = torch.cat([hidden, fed[-1:]])
    return drafts


@torch.no_grad()
def drafter_drafts(drafter, target, ids, steps, head_mode="trained"):
    out = target(ids, output_hidden_states=True)
    hidden = drafter.project(drafter.target_features(out.hidden_states))  # (1, T, d)
    tokens = torch.cat([ids[:, 1:], out.logits[:, -1:].argmax(-1)], dim=-1)
    drafts = []
    for _ in range(steps):
        step = drafter(input_ids=tokens, hidden_states=hidden, head_mode=head_mode)
        drafts.append(int(step.head.token_ids[step.head.logits[-1].argmax()]))
        tokens = torch.cat([tokens, torch.tensor([[drafts[-1]]])], dim=-1)
        hidden = torch.cat([hidden, step.next_hidden_states[:, -1:]], dim=1)
    return drafts


# ---------------------------------------------------------------------------------------------- open as trained


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_opens_and_drafts_what_its_trainer_drafts(target, folders, name):
    drafter = DynaSpecDrafter.from_pretrained(folders[name])  # no target: checked and resolved when bound
    assert drafter.generation_config.head_mode == "trained" and not drafter.config.router_fitted
    assert drafter.config.own_embeddings == (name == "speculators")
    drafter.bind(target)
    assert drafter.config.target_layer_ids == LAYERS  # the EAGLE layout names none: the servers' default
    for seed in (1, 2):
        ids = prompt(9, vocab_size=V, seed=seed)
        assert drafter_drafts(drafter, target, ids, 6) == reference_drafts(name, target, ids, 6)


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_head_of_an_imported_drafter_is_exact(target, folders, name):
    drafter = DynaSpecDrafter.from_pretrained(folders[name], target=target)
    assert torch.equal(drafter.bound_head.static_ids, draft_ids())  # the target's rows of the same vocabulary
    for head_mode in ("trained", "static", "full"):
        for seed in (3, 4):
            ids = prompt(7, vocab_size=V, seed=seed)
            got = target.generate(ids, assistant_model=drafter, head_mode=head_mode, do_sample=False,
                                  max_new_tokens=16)
            assert torch.equal(got, greedy(target, ids, max_new_tokens=16)), head_mode


def test_router_heads_wait_for_router_fit(target, folders):
    drafter = DynaSpecDrafter.from_pretrained(folders["specforge"], target=target)
    ids = prompt(7, vocab_size=V, seed=5)
    for head_mode in ("dynamic", "union"):
        with pytest.raises(ValueError, match="router-fit"):
            target.generate(ids, assistant_model=drafter, head_mode=head_mode, max_new_tokens=4)


@pytest.mark.parametrize("name", ["speculators", "specforge"])
def test_export_gives_the_checkpoint_back_unchanged(target, folders, name, tmp_path):
    drafter = DynaSpecDrafter.from_pretrained(folders[name], target=target)
    fmt = "speculators" if name == "speculators" else "eagle3"
    out = export_eagle3(drafter, target, tmp_path, format=fmt)
    original, written = load_file(folders[name] / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(written) == set(original)
    for key, value in original.items():
        assert torch.equal(written[key], value), key
    config = json.loads((out / "config.json").read_text())
    for key in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        assert bool(config.get(key)) == bool(layout(name)[2].get(key)), key
    again = DynaSpecDrafter.from_pretrained(out, target=target)
    ids = prompt(8, vocab_size=V, seed=6)
    assert drafter_drafts(again, target, ids, 5) == drafter_drafts(drafter, target, ids, 5)


def test_save_pretrained_keeps_the_trained_head(target, folders, tmp_path):
    drafter = DynaSpecDrafter.from_pretrained(folders["speculators"], target=target)
    drafter.save_pretrained(tmp_path)
    again = DynaSpecDrafter.from_pretrained(tmp_path, target=target)
    assert again.config.draft_vocab_size == N and again.config.norm_output and again.config.own_embeddings
    assert torch.equal(again.draft_token_ids, drafter.draft_token_ids)
    ids = prompt(8, vocab_size=V, seed=7)
    assert drafter_drafts(again, target, ids, 5) == drafter_drafts(drafter, target, ids, 5)


# ---------------------------------------------------------------------------------------------- by name


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {f"w{i}": i for i in range(3, V)} | {"<s>": 0, "[UNK]": 1, "</s>": 2}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")


def test_generate_and_pipeline_take_the_checkpoint_by_name(target, folders, tokenizer):
    ids = prompt(7, vocab_size=V, seed=8)
    got = target.generate(ids, assistant_model=str(folders["speculators"]), do_sample=False, max_new_tokens=12,
                          return_dict_in_generate=True)
    assert torch.equal(got.sequences, greedy(target, ids, max_new_tokens=12))
    assert got.speculative_stats.steps > 0  # it ran as a DynaSpec drafter
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    assisted = pipeline("text-generation", model=target, tokenizer=tokenizer,
                        assistant_model=str(folders["specforge"]))
    assert isinstance(assisted.assistant_model, DynaSpecDrafter)
    kwargs = dict(max_new_tokens=10, do_sample=False)
    text = "w5 w17 w33 w90"
    assert assisted(text, **kwargs)[0]["generated_text"] == plain(text, **kwargs)[0]["generated_text"]
    with pytest.raises(ValueError, match="names no DynaSpec drafter"):
        target.generate(ids, assistant_model=str(folders["eagle"] / "nowhere"), max_new_tokens=2)


def test_opens_from_an_offline_hub_cache(target, folders, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--lab--eagle3-tiny"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in folders["eagle"].iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    drafter = DynaSpecDrafter.from_pretrained("lab/eagle3-tiny", cache_dir=tmp_path / "hub", target=target)
    ids = prompt(9, vocab_size=V, seed=1)
    assert drafter_drafts(drafter, target, ids, 4) == reference_drafts("eagle", target, ids, 4)


# ---------------------------------------------------------------------------------------------- refused


def rewritten(src: Path, dst: Path, config=None, layer=None, drop=(), tensors=None) -> Path:
    """A copy of a layout's folder with config keys (or the speculators layer config's) changed or removed (...)
    and tensors dropped or replaced; weights written as safetensors."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    for key, value in (config or {}).items():
        cfg.pop(key) if value is ... else cfg.__setitem__(key, value)
    for key, value in (layer or {}).items():
        cfg["transformer_layer_config"][key] = value
    file = src / "model.safetensors"
    weights = load_file(file) if file.exists() else torch.load(src / "pytorch_model.bin", weights_only=True)
    weights = {k: v for k, v in weights.items() if k not in drop} | (tensors or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(weights, dst / "model.safetensors")
    return dst


REFUSED = {  # layout, change, (where it is refused: "open" or "bind"), the message
    "other-width": ("specforge", dict(config={"hidden_size": 64}), "open", r"config.json: hidden_size=64.*has 32"),
    "other-vocabulary": ("specforge", dict(config={"vocab_size": 100}), "open", r"config.json: vocab_size=100"),
    "layers-out-of-range": ("speculators", dict(config={"eagle_aux_hidden_state_layer_ids": [2, 4, 12]}), "open",
                            r"eagle_aux_hidden_state_layer_ids \[2, 4, 12\]"),
    "layers-out-of-range-at-bind": ("speculators", dict(config={"eagle_aux_hidden_state_layer_ids": [2, 4, 12]}),
                                    "bind", r"hidden states \[2, 4, 12\]"),
    "missing-d2t": ("specforge", dict(drop=("d2t",)), "open", r"model.safetensors: tensor d2t is missing"),
    "bad-d2t": ("specforge", dict(tensors={"d2t": torch.full((N,), 500)}), "open", "d2t maps to ids outside"),
    "bad-t2d": ("specforge", dict(tensors={"t2d": torch.zeros(V, dtype=torch.bool)}), "open", "t2d"),
    "qwen3-layer": ("speculators", dict(layer={"model_type": "qwen3"}), "open", "'qwen3' layer"),
    "two-layers": ("speculators", dict(layer={"num_hidden_layers": 2}), "open", "num_hidden_layers=2"),
    "biases": ("specforge", dict(config={"attention_bias": True}), "open", "attention_bias=true"),
    "unnormed-head": ("specforge", dict(config={"norm_output": False}), "open", "norm_output=false"),
    "missing-tensor": ("specforge", dict(drop=("midlayer.mlp.down_proj.weight",)), "open",
                       r"\['midlayer.mlp.down_proj.weight'\]"),
    "extra-tensor": ("eagle", dict(tensors={"input_norm.weight": torch.ones(3 * D)}), "open", "input_norm.weight"),
    "head-shape": ("specforge", dict(tensors={"lm_head.weight": torch.zeros(10, D)}), "open", "lm_head.weight has"),
    "fc-width": ("specforge", dict(tensors={"fc.weight": torch.zeros(D, 2 * D)}), "open", "fc.weight reads 2"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_foreign_or_malformed_checkpoints_are_refused_naming_the_field(target, folders, tmp_path, case):
    name, change, where, message = REFUSED[case]
    folder = rewritten(folders[name], tmp_path / case, **change)
    if where == "bind":
        drafter = DynaSpecDrafter.from_pretrained(folder)
        with pytest.raises(ValueError, match=message):
            drafter.bind(target)
        return
    with pytest.raises(ValueError, match=message):
        DynaSpecDrafter.from_pretrained(folder, target=target)


def test_a_pickle_with_code_is_refused(folders, tmp_path):
    (tmp_path / "config.json").write_text((folders["eagle"] / "config.json").read_text())
    torch.save({"fc.weight": torch.zeros(1), "payload": Path("x")}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin could not be read as plain tensors"):
        DynaSpecDrafter.from_pretrained(tmp_path)


def test_layouts_and_layer_conventions():
    assert [checkpoint_format(layout(n)[0]) for n in LAYOUTS] == ["speculators", "flat", "flat"]
    assert checkpoint_format({"model_type": "llama", "num_hidden_layers": 16}) is None  # a target, not a draft
    assert layer_ids_of({"eagle_aux_hidden_state_layer_ids": [5, 2, 4]}, {}) == [2, 4, 5]  # vLLM's convention
    assert layer_ids_of({}, {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}) == [2, 4, 5]  # SGLang's, +1
    assert layer_ids_of({}, {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}) == [2, 4, 5]  # after SGLang PR #25454
    assert layer_ids_of({}, {}) is None  # the servers' default, resolved for the target


def test_a_speculators_config_without_norm_before_residual_reads_it_as_vllm_does(folders, tmp_path):
    folder = rewritten(folders["speculators"], tmp_path / "spec", config={"norm_before_residual": ...})
    assert DynaSpecDrafter.from_pretrained(folder).config.norm_before_residual  # vLLM's adapter: absent = true


def test_a_trained_sliding_window_is_reported_when_a_call_reads_past_it(target, folders, tmp_path):
    assert DynaSpecDrafter.from_pretrained(folders["speculators"]).config.layer_sliding_window == 2048
    folder = rewritten(folders["speculators"], tmp_path / "window", layer={"sliding_window": 12})
    drafter = DynaSpecDrafter.from_pretrained(folder, target=target)
    ids = prompt(7, vocab_size=V, seed=2)
    with pytest.warns(UserWarning, match="12-token attention window"):
        got = target.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=8)
    assert torch.equal(got, greedy(target, ids, max_new_tokens=8))


# ---------------------------------------------------------------------------------------------- the docs


def readme_blocks(kind: str) -> list[str]:
    """The ```kind blocks of the docs' section on drafters trained elsewhere."""
    text = (Path(__file__).parents[1] / "docs" / "drafters.md").read_text()
    section = text.split("## Use a drafter trained with speculators, SpecForge or EAGLE")[1].split("\n## ")[0]
    return [block.split("```")[0] for block in section.split(f"```{kind}\n")[1:]]


def test_the_readme_commands_run_on_tiny_checkpoints(target, tokenizer, tmp_path, monkeypatch, capsys):
    """The section's Python and shell blocks as written, with its Hub ids served from an offline Hub cache holding a
    tiny target and a tiny checkpoint in the EAGLE authors' layout (router-fit: 3 steps)."""
    import shlex

    import huggingface_hub

    from hf_dynaspec import cli

    target_id, drafter_id = "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    for repo_id in (target_id, drafter_id):
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
    snapshots = {r: cache / f"models--{r.replace('/', '--')}" / "snapshots" / commit for r in (target_id, drafter_id)}
    target.save_pretrained(snapshots[target_id])
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    tokenizer.save_pretrained(snapshots[target_id])
    write_layout(snapshots[drafter_id], "eagle")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": f"w{i} w{i + 7} w{i + 3}"})
                                                      for i in range(3, 60, 7)))
    (python,) = readme_blocks("python")
    exec(compile(python, "docs/drafters.md", "exec"), {})  # noqa: S102  (the docs' own code)
    assert capsys.readouterr().out.strip()
    (shell,) = readme_blocks("bash")
    for command in shell.replace("\\\n", " ").strip().splitlines():
        args = shlex.split(command)[1:]
        if args[0] == "distill":
            args += ["--max-new-tokens", "12"]
        if args[0] == "router-fit":
            args += ["--steps", "3", "--batch-size", "2", "--seq-len", "8"]
        assert cli.main(args) == 0, command
    fitted = DynaSpecDrafter.from_pretrained(tmp_path / "fitted", target=target)
    assert fitted.config.router_fitted and fitted.config.draft_vocab_size == N
    assert "| The capital of France is | True |" in capsys.readouterr().out  # `generate`: identical to plain

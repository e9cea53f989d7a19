"""Packed training checkpoints (`training/carry.py`): what a fresh machine resumes from (tiny target, seconds).

    .venv/bin/python -m pytest tests/test_carry.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.configuration import eagle3_layer_ids
from hf_dynaspec.targets import load_target
from hf_dynaspec.training import TrainingArguments, train_drafter
from hf_dynaspec.training.carry import CARRY_NAME, checkpoint_step, main, pack, unpack
from hf_dynaspec.training.corpus import write_answers
from hf_dynaspec.training.features import write_features
from hf_dynaspec.training.trainer import OPTIMIZER_NAME, load_checkpoint

PROMPTS = ["hello there", "hi", "what is two plus two?", "write a haiku"]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_target("tiny")


@pytest.fixture(scope="module")
def features(tiny, tmp_path_factory):
    target, tokenizer = tiny
    corpus, out = tmp_path_factory.mktemp("corpus"), tmp_path_factory.mktemp("features")
    write_answers(target, tokenizer, [{"prompt": p} for p in PROMPTS], corpus, 12, 2, per_shard=3, progress=False)
    write_features(target, corpus, out, eagle3_layer_ids(target.config.num_hidden_layers), max_tokens=40,
                   per_shard=3, progress=False)
    return out


def train(target, features, ckpt, steps, drafter=None):
    torch.manual_seed(0)
    drafter = drafter or DynaSpecDrafter.from_target(target, num_clusters=8)
    settings = TrainingArguments(steps=steps, lr=3e-3, batch_size=2, seq_len=16, heldout_fraction=0.25, ckpt_every=4)
    return drafter, train_drafter(drafter, target, features, ckpt, settings, progress=False)


def test_packed_checkpoint_resumes_on_a_fresh_machine(tiny, features, tmp_path):
    target, _ = tiny
    drafter, _ = train(target, features, tmp_path / "ckpt", steps=8)
    assert pack(tmp_path / "ckpt", tmp_path / "carry") == 8
    moments = load_file(str(tmp_path / "carry" / OPTIMIZER_NAME))
    full = load_file(str(tmp_path / "ckpt" / OPTIMIZER_NAME))
    assert moments.keys() == full.keys()
    for key, value in moments.items():
        entry = key.rsplit(".", 1)[-1]
        assert value.dtype == (torch.bfloat16 if entry in ("exp_avg", "exp_avg_sq") else full[key].dtype), key
        torch.testing.assert_close(value.float(), full[key].float(), rtol=2**-8, atol=0)
    assert json.loads((tmp_path / "carry" / CARRY_NAME).read_text())["step"] == 8

    # a fresh machine: no init folder, no checkpoint; the packed folder gives both
    fresh_init, fresh_ckpt = tmp_path / "fresh" / "init", tmp_path / "fresh" / "ckpt"
    assert unpack(tmp_path / "carry", fresh_ckpt, fresh_init)
    assert checkpoint_step(fresh_ckpt) == 8 and not (fresh_ckpt / CARRY_NAME).exists()
    init = DynaSpecDrafter.from_pretrained(fresh_init)
    assert torch.equal(init.cluster_permutation, drafter.cluster_permutation)
    restored = DynaSpecDrafter.from_pretrained(fresh_init)
    optimizer = torch.optim.AdamW(restored.parameters())
    assert load_checkpoint(fresh_ckpt, restored, optimizer)["step"] == 8
    for (name, trained), loaded in zip(drafter.named_parameters(), restored.parameters()):
        assert torch.equal(trained, loaded), name  # the weights are carried exactly
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())  # cast back on loading

    # resumed from the packed copy, training goes on from step 8 as it does from the full checkpoint
    _, resumed = train(target, features, fresh_ckpt, steps=12, drafter=DynaSpecDrafter.from_pretrained(fresh_init))
    _, reference = train(target, features, tmp_path / "ckpt", steps=12)
    assert resumed["start_step"] == reference["start_step"] == 8
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(reference["losses"]), rtol=0.05, atol=0.05)


def test_unpack_leaves_a_checkpoint_that_is_not_behind(tiny, features, tmp_path, capsys):
    target, _ = tiny
    train(target, features, tmp_path / "ckpt", steps=4)
    assert main(["pack", str(tmp_path / "ckpt"), str(tmp_path / "carry")]) == 0
    train(target, features, tmp_path / "ckpt", steps=8)  # the run went on past the packed step
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    assert not unpack(tmp_path / "carry", tmp_path / "ckpt")
    assert main(["unpack", str(tmp_path / "carry"), str(tmp_path / "ckpt")]) == 0
    assert "left as it is" in capsys.readouterr().out
    assert checkpoint_step(tmp_path / "ckpt") == 8 and (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before


def test_pack_and_unpack_refuse_folders_without_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="train first"):
        pack(tmp_path, tmp_path / "carry")
    with pytest.raises(FileNotFoundError, match="pack one"):
        unpack(tmp_path, tmp_path / "ckpt")

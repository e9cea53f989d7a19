"""Self-distillation data and drafter training on a tiny random target (CPU, a few seconds).

    .venv/bin/python -m pytest tests/test_training.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.targets import load_target
from hf_dynaspec.training import generate_dataset, load_dataset, load_prompts, train_drafter
from hf_dynaspec.training.trainer import load_checkpoint

PROMPTS = ["hello there", "hi", "what is two plus two?", "write a haiku"]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_target("tiny")


@pytest.fixture(scope="module")
def dataset(tiny, tmp_path_factory):
    target, tokenizer = tiny
    out = tmp_path_factory.mktemp("data")
    generate_dataset(target, tokenizer, PROMPTS, out, max_new_tokens=12, batch_size=2, prompts_per_shard=2,
                     progress=False)
    return out


def test_dataset_layout_and_features(tiny, dataset):
    target, tokenizer = tiny
    index = json.loads((dataset / "index.json").read_text())
    assert [s["file"] for s in index["shards"]] == ["shard_00000.safetensors", "shard_00001.safetensors"]
    convs = load_dataset(dataset)
    assert len(convs) == 4
    for conv in convs:
        length = conv.input_ids.numel()
        assert conv.hidden.shape == (length - 1, target.config.hidden_size)
        assert conv.hidden.dtype == torch.float16
        assert int(conv.loss_mask.sum()) == 12  # no EOS from this target in 12 tokens
        prompt_len = conv.prompt_length
        # the stored features reproduce the greedy answer through the LM head
        with torch.no_grad():
            greedy = target.lm_head(conv.hidden[prompt_len - 1:].float()).argmax(-1)
        assert torch.equal(greedy, conv.input_ids[prompt_len:])


def test_dataset_resume_skips_done_prompts(tiny, dataset):
    target, tokenizer = tiny
    index = generate_dataset(target, tokenizer, PROMPTS + ["one more"], dataset, max_new_tokens=12,
                             batch_size=2, progress=False)
    assert len(index["shards"]) == 3 and index["shards"][-1]["num_conversations"] == 1
    assert len(load_dataset(dataset)) == 5


def test_load_prompts_fields_and_spec_bench_refused(tmp_path):
    rows = [{"turns": ["a", "b"]}, {"prompt": "p"}, {"question": "q"}, {"instruction": "i", "input": "x"},
            {"other": 1}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "p.json").write_text(json.dumps([{"instruction": "j", "input": ""}]))
    assert load_prompts([tmp_path / "p.jsonl", tmp_path / "p.json"]) == ["a", "p", "q", "i\n\nx", "j"]
    bad = tmp_path / "spec_bench"
    bad.mkdir()
    (bad / "question.jsonl").write_text(json.dumps({"turns": ["x"]}))
    with pytest.raises(ValueError, match="Spec-Bench"):
        load_prompts(bad / "question.jsonl")


def test_training_loss_decreases_and_resumes(tiny, dataset, tmp_path):
    target, _ = tiny
    torch.manual_seed(0)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)
    kwargs = dict(lr=3e-3, batch_size=4, seq_len=24, ckpt_dir=tmp_path / "ckpt", heldout_fraction=0.2,
                  ckpt_every=10, progress=False)
    first = train_drafter(drafter, target, dataset, steps=30, **kwargs)
    losses = first["losses"]
    assert first["start_step"] == 0 and first["step"] == 30 and len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert set(first["eval"]["router_recall"]) == {1, 2, 4, 8}
    assert first["eval"]["router_recall"][8] == 1.0 and 0.0 <= first["eval"]["top1"] <= 1.0
    state = json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())
    assert state["step"] == 30

    fresh = DynaSpecDrafter.from_target(target, num_clusters=8)
    second = train_drafter(fresh, target, dataset, steps=36, **kwargs)
    assert second["start_step"] == 30 and len(second["losses"]) == 6
    # resumed weights continue from the trained ones: the loss stays near where the first run ended
    assert sum(second["losses"]) / 6 < sum(losses[:5]) / 5
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())["step"] == 36
    assert all(p.requires_grad for p in target.parameters())  # target flags restored

    # the checkpoint restores the drafter exactly, and the AdamW moments of every parameter
    restored = DynaSpecDrafter.from_target(target, num_clusters=8)
    optimizer = torch.optim.AdamW(restored.parameters())
    assert load_checkpoint(tmp_path / "ckpt", restored, optimizer)["step"] == 36
    for (name, trained), loaded in zip(fresh.named_parameters(), restored.parameters()):
        assert torch.equal(trained, loaded), name
    assert len(optimizer.state) == len(list(restored.parameters()))


def test_cli_distill_and_train(tmp_path, capsys):
    from hf_dynaspec.cli import main

    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS))
    data, drafter, ckpt = tmp_path / "data", tmp_path / "drafter", tmp_path / "ckpt"
    assert main(["distill", "--target", "tiny", "--prompts", str(tmp_path / "p.jsonl"), "--out", str(data),
                 "--max-new-tokens", "8", "--batch-size", "4"]) == 0
    assert "4 conversations" in capsys.readouterr().out
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(drafter)]) == 0
    assert main(["train", "--target", "tiny", "--drafter", str(drafter), "--data", str(data), "--ckpt-dir",
                 str(ckpt), "--steps", "3", "--batch-size", "2", "--seq-len", "16"]) == 0
    assert "trained to step 3" in capsys.readouterr().out
    assert main(["distill", "--target", "tiny", "--prompts", str(tmp_path / "spec_bench.jsonl"),
                 "--out", str(data)]) == 1
    assert "Spec-Bench" in capsys.readouterr().err


def test_frequent_tokens_counts_answers_only(tiny, dataset):
    from hf_dynaspec.training import frequent_tokens, load_dataset

    target, _ = tiny
    vocab = target.config.vocab_size
    top = frequent_tokens(dataset, 5, vocab)
    counts = torch.zeros(vocab, dtype=torch.long)
    for conv in load_dataset(dataset):
        counts += torch.bincount(conv.input_ids[conv.loss_mask], minlength=vocab)
    assert top.numel() == 5 and bool((top[1:] > top[:-1]).all())  # sorted, distinct
    assert counts[top].min() >= counts.sort(descending=True).values[4]

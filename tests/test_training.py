"""Self-distillation data and drafter training on a tiny random target (CPU, a few seconds).

    .venv/bin/python -m pytest tests/test_training.py -q
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.configuration import eagle3_layer_ids
from hf_dynaspec.targets import load_target
from hf_dynaspec.training import (
    TrainingArguments,
    generate_dataset,
    load_dataset,
    load_prompts,
    train_drafter,
)
from hf_dynaspec.training.corpus import (
    answer_batch,
    answers_until_loop,
    eos_token_ids,
    load_corpus,
    loop_end,
    pad_token_id,
    write_answers,
)
from hf_dynaspec.training.features import write_features
from hf_dynaspec.training.losses import DenseHead
from hf_dynaspec.training.trainer import evaluate_drafter, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.fixture(scope="module")
def eagle3_dataset(tiny, tmp_path_factory):
    """The EAGLE-3 path: token ids (corpus.py), then the target's features in batched passes (features.py)."""
    target, tokenizer = tiny
    corpus, out = tmp_path_factory.mktemp("corpus"), tmp_path_factory.mktemp("features")
    write_answers(target, tokenizer, [{"prompt": p} for p in PROMPTS], corpus, 12, 2, per_shard=3, progress=False)
    write_features(target, corpus, out, eagle3_layer_ids(target.config.num_hidden_layers), max_tokens=40,
                   per_shard=3, progress=False)
    return out


@pytest.fixture(params=["eagle1", "eagle3"])
def arch_data(request):
    """(drafter architecture, a dataset folder holding the features it reads)."""
    name = "dataset" if request.param == "eagle1" else "eagle3_dataset"
    return request.param, request.getfixturevalue(name)


def test_features_equal_a_forward_of_each_conversation_alone(tiny, eagle3_dataset):
    """Batched, right-padded feature passes give each conversation's own hidden states (fp16 rounding only);
    the final ones reproduce the greedy answer through the LM head."""
    target, _ = tiny
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    convs = load_dataset(eagle3_dataset)
    assert len(convs) == len(PROMPTS) and all(c.layer_ids == tuple(layers) for c in convs)
    for conv in convs:
        with torch.no_grad():
            out = target(conv.input_ids[None, :-1], output_hidden_states=True)
        alone = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)
        torch.testing.assert_close(conv.aux.float(), alone, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(conv.hidden.float(), out.hidden_states[-1][0], rtol=2e-3, atol=2e-3)
        answer = conv.loss_mask.nonzero()[0, 0]
        assert torch.equal(out.logits[0, answer - 1 :].argmax(-1), conv.input_ids[answer:])


def test_corpus_resumes_and_features_resume(tiny, tmp_path):
    target, tokenizer = tiny
    records = [{"prompt": p, "source": "s"} for p in PROMPTS]
    first = write_answers(target, tokenizer, records[:2], tmp_path / "c", 6, 2, per_shard=1, progress=False)
    again = write_answers(target, tokenizer, records, tmp_path / "c", 6, 2, per_shard=1, progress=False)
    assert len(first["shards"]) == 2 and len(again["shards"]) == 4 and len(load_corpus(tmp_path / "c")) == 4
    assert again["shards"][0]["tokens_per_source"]["s"] == again["shards"][0]["num_tokens"]
    index = write_features(target, tmp_path / "c", tmp_path / "f", [1], per_shard=2, progress=False)
    assert len(index["shards"]) == 2
    assert len(write_features(target, tmp_path / "c", tmp_path / "f", [1], progress=False)["shards"]) == 2
    with pytest.raises(ValueError, match="layers"):
        write_features(target, tmp_path / "c", tmp_path / "f", [2], progress=False)


def test_corpus_keeps_each_conversations_source(tiny, tmp_path):
    target, tokenizer = tiny
    records = [{"prompt": p, "source": f"src-{i % 2}"} for i, p in enumerate(PROMPTS)]
    write_answers(target, tokenizer, records, tmp_path / "c", 4, 2, per_shard=8, progress=False)
    by_prompt = {tokenizer.decode(c.input_ids[: c.prompt_length], skip_special_tokens=True): c.source
                 for c in load_corpus(tmp_path / "c")}
    assert by_prompt == {r["prompt"]: r["source"] for r in records}
    # a shard written before sources were stored: its one source, or "" when it mixed several
    shard = tmp_path / "c" / "answers_00000.npz"
    with np.load(shard) as data:
        np.savez_compressed(shard, **{k: data[k] for k in data.files if k != "sources"})
    assert {c.source for c in load_corpus(tmp_path / "c")} == {""}


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
    (tmp_path / "code_slice.jsonl").write_text(json.dumps({"prompt": "def f():"}))
    with pytest.raises(ValueError, match="code slice"):
        load_prompts(tmp_path / "code_slice.jsonl")
    with pytest.raises(ValueError, match="tree-tuning"):
        load_prompts(ROOT / "data" / "tuning_prompts.jsonl")


def test_tuning_prompts_are_held_out_of_every_other_set():
    # the default tree is tuned on these: none may come from Spec-Bench or a training mix, two per category
    tuning = [json.loads(line) for line in (ROOT / "data/tuning_prompts.jsonl").read_text().splitlines()]
    spec_bench = [json.loads(line) for line in (ROOT / "data/spec_bench/question.jsonl").read_text().splitlines()]
    assert Counter(r["category"] for r in tuning) == Counter({c: 2 for c in {r["category"] for r in spec_bench}})
    others = "\n".join(t for r in spec_bench for t in r["turns"])
    for name in ("train_prompts.jsonl", "train_prompts_round2.jsonl", "corpus/smollm2/questions.jsonl"):
        records = [json.loads(line) for line in (ROOT / "data" / name).read_text().splitlines()]
        others += "\n" + "\n".join(r.get("prompt") or r["question"] for r in records)
    for record in tuning:
        text = record["turns"][0]  # its start and its middle (the templates share their ends)
        assert text[:80] not in others and text[len(text) // 2 :][:80] not in others, record["question_id"]


def test_training_loss_decreases_and_resumes(tiny, arch_data, tmp_path):
    target, _ = tiny
    arch, dataset = arch_data
    torch.manual_seed(0)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture=arch)
    settings = dict(lr=3e-3, batch_size=4, seq_len=24, heldout_fraction=0.2, ckpt_every=10)
    first = train_drafter(drafter, target, dataset, tmp_path / "ckpt", TrainingArguments(steps=30, **settings),
                          progress=False)
    losses = first["losses"]
    assert first["start_step"] == 0 and first["step"] == 30 and len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert set(first["eval"]["router_recall"]) == {1, 2, 4, 8}
    assert first["eval"]["router_recall"][8] == 1.0 and 0.0 <= first["eval"]["top1"] <= 1.0
    state = json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())
    assert state["step"] == 30

    fresh = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture=arch)
    second = train_drafter(fresh, target, dataset, tmp_path / "ckpt", TrainingArguments(steps=36, **settings),
                           progress=False)
    assert second["start_step"] == 30 and len(second["losses"]) == 6
    # resumed weights continue from the trained ones: the loss stays near where the first run ended
    assert sum(second["losses"]) / 6 < sum(losses[:5]) / 5
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())["step"] == 36
    assert all(p.requires_grad for p in target.parameters())  # target flags restored

    # the checkpoint restores the drafter exactly, and the AdamW moments of every parameter
    restored = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture=arch)
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
                 str(ckpt), "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--data", str(data),
                 "--unroll", "2"]) == 0
    out = capsys.readouterr().out
    assert "trained to step 3" in out and "at draft depth 1..3" in out
    saved = json.loads((ckpt / "heldout_eval.json").read_text())
    assert saved["step"] == 3 and len(saved["eval"]["top1_at_depth"]) == 3 and saved["settings"]["unroll"] == 2
    train = ["train", "--target", "tiny", "--drafter", str(drafter), "--data", str(data), "--data", str(data),
             "--ckpt-dir", str(ckpt), "--batch-size", "2", "--seq-len", "16", "--unroll", "2"]
    record = (ckpt / "heldout_eval.json").read_text()
    assert main([*train, "--steps", "3"]) == 0  # a rerun of the finished recipe keeps its record as it was
    assert "nothing to do" in capsys.readouterr().out and (ckpt / "heldout_eval.json").read_text() == record
    assert main([*train, "--steps", "4"]) == 0  # more steps: trains on from the checkpoint
    assert "trained to step 4" in capsys.readouterr().out
    assert json.loads((ckpt / "heldout_eval.json").read_text())["step"] == 4
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
    assert top.numel() == 5 and top.unique().numel() == 5
    assert bool((counts[top][:-1] >= counts[top][1:]).all())  # most frequent first
    assert counts[top].min() >= counts.sort(descending=True).values[4]


def test_training_refuses_data_without_the_drafters_layers(tiny, dataset, tmp_path):
    target, _ = tiny
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)  # EAGLE-3: reads layers the data lacks
    with pytest.raises(ValueError, match="hf-dynaspec features"):
        train_drafter(drafter, target, dataset, tmp_path, TrainingArguments(steps=1, lr=1e-3, batch_size=1, seq_len=8),
                      progress=False)


@pytest.mark.parametrize("depth", [2, 3])
def test_unrolled_steps_match_step_by_step_drafting(tiny, arch_data, depth):
    """Step s of the unrolled window equals drafting for real: the drafter's cache filled from the target's
    true features up to j - s + 1, then its own features fed back one position at a time."""
    from transformers import DynamicCache

    from hf_dynaspec.training.losses import unrolled_steps
    from hf_dynaspec.training.trainer import collate, window

    target, _ = tiny
    arch, dataset = arch_data
    torch.manual_seed(1)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture=arch).bind(target).eval()
    conv = max(load_dataset(dataset), key=lambda c: c.hidden.shape[0])
    length = conv.hidden.shape[0] - 1
    batch = collate([window(conv, 0, length)])
    with torch.no_grad():
        steps = unrolled_steps(drafter, batch, depth)
        for j in range(depth - 1, length):
            first = j - depth + 1  # last position computed from the target's true features
            cache = DynamicCache()
            hidden = drafter.project(batch.features[:, : first + 1].float())  # (1, first + 1, d), stored in fp16
            out = drafter(batch.input_ids[:, : first + 1], hidden, cache=cache, head_mode=None)
            feature = out.next_hidden_states[:, -1:]  # (1, 1, d)
            for pos in range(first + 1, j + 1):
                out = drafter(batch.input_ids[:, pos : pos + 1], feature, position_ids=torch.tensor([[pos]]),
                              cache=cache, head_mode=None)
                feature = out.next_hidden_states
            torch.testing.assert_close(steps[depth - 1][0][:, j], out.hidden_states[:, 0], rtol=1e-4, atol=1e-5)
    assert not steps[depth - 1][2][:, : depth - 1].any()  # positions without a previous feature do not count


def test_unrolled_training_learns_and_reports_depths(tiny, eagle3_dataset, tmp_path):
    target, _ = tiny
    dataset = eagle3_dataset
    torch.manual_seed(0)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)
    settings = TrainingArguments(steps=20, lr=3e-3, batch_size=4, seq_len=24, heldout_fraction=0.25, unroll=3)
    result = train_drafter(drafter, target, [dataset, dataset], tmp_path / "ckpt", settings, progress=False)
    assert sum(result["losses"][-4:]) < sum(result["losses"][:4])
    assert len(result["eval"]["top1_at_depth"]) == 3
    assert result["eval"]["top1_at_depth"][0] == result["eval"]["top1"]
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())["unroll"] == 3
    with pytest.raises(ValueError, match="unroll"):
        TrainingArguments(steps=1, lr=1e-3, batch_size=1, seq_len=8, unroll=0)


def test_features_keep_the_sources_asked_for(tiny, tmp_path):
    target, tokenizer = tiny
    records = [{"prompt": p, "source": "code-c" if i % 2 else "qa-de"} for i, p in enumerate(PROMPTS)]
    write_answers(target, tokenizer, records, tmp_path / "c", 4, 2, progress=False)
    index = write_features(target, tmp_path / "c", tmp_path / "f", [1], sources="code-.*", progress=False)
    assert sum(s["num_conversations"] for s in index["shards"]) == 2 and index["sources"] == "code-.*"
    with pytest.raises(ValueError, match="sources"):  # a folder holds one selection
        write_features(target, tmp_path / "c", tmp_path / "f", [1], sources="qa-de", progress=False)
    with pytest.raises(ValueError, match="No conversation"):
        write_features(target, tmp_path / "c", tmp_path / "g", [1], sources="plain-.*", progress=False)


def test_learning_curve_reports_each_data_folder(tiny, eagle3_dataset, tmp_path):
    target, _ = tiny
    other = tmp_path / "copy"
    shutil.copytree(eagle3_dataset, other)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)
    settings = TrainingArguments(steps=2, lr=1e-3, batch_size=2, seq_len=16, heldout_fraction=0.25, eval_every=2)
    result = train_drafter(drafter, target, [eagle3_dataset, other], tmp_path / "ckpt", settings, progress=False)
    groups = result["curve"][-1]["by_group"]
    assert set(groups) == {eagle3_dataset.name, "copy"}
    assert groups["copy"] == groups[eagle3_dataset.name]  # the same conversations, split alike
    assert all(len(g["top1_at_depth"]) == 3 and g["heldout_positions"] > 0 for g in groups.values())
    overall = result["curve"][-1]  # the groups' position-weighted mean: here twice the same group
    assert overall["top1_at_depth"] == groups["copy"]["top1_at_depth"]
    assert overall["heldout_positions"] == 2 * groups["copy"]["heldout_positions"]


def test_split_per_folder_is_stable_when_folders_are_added(dataset):
    from hf_dynaspec.training.trainer import load_split

    train_one, held_one, sizes_one = load_split(dataset, 0.25, seed=0)
    train_two, held_two, sizes_two = load_split([dataset, dataset], 0.25, seed=0)
    key = [tuple(c.input_ids.tolist()) for c in held_one]
    assert [tuple(c.input_ids.tolist()) for c in held_two[: len(held_one)]] == key
    assert len(train_two) == 2 * len(train_one)
    assert sizes_two == 2 * sizes_one == [len(train_one) + len(held_one)] * 2


def test_resuming_on_a_grown_folder_is_refused(tiny, eagle3_dataset, tmp_path):
    """A folder that changed under a checkpoint would move the held-out split onto trained conversations."""
    import shutil

    target, _ = tiny
    ckpt = tmp_path / "ckpt"

    def steps(n):
        return TrainingArguments(steps=n, lr=1e-3, batch_size=1, seq_len=8, heldout_fraction=0.25)

    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)
    train_drafter(drafter, target, eagle3_dataset, ckpt, steps(1), progress=False)
    train_drafter(drafter, target, [eagle3_dataset, eagle3_dataset], ckpt, steps(2), progress=False)  # added: fine
    grown = tmp_path / "grown"
    shutil.copytree(eagle3_dataset, grown)
    index = json.loads((grown / "index.json").read_text())
    index["shards"] = index["shards"] * 2  # the same folder with more conversations
    (grown / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="another --data folder"):
        train_drafter(drafter, target, [grown, eagle3_dataset], ckpt, steps(3), progress=False)


def test_bf16_autocast_training_records_a_learning_curve_across_resumes(tiny, eagle3_dataset, tmp_path):
    target, _ = tiny
    torch.manual_seed(0)
    settings = dict(lr=3e-3, batch_size=2, seq_len=16, heldout_fraction=0.25, unroll=2, autocast_dtype=torch.bfloat16,
                    eval_every=4, ckpt_every=4)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)
    first = train_drafter(drafter, target, eagle3_dataset, tmp_path / "ckpt", TrainingArguments(steps=8, **settings),
                          progress=False)
    assert drafter.fc.weight.dtype == torch.float32  # autocast: the weights stay fp32
    assert [p["step"] for p in first["curve"]] == [4, 8]
    assert all(len(p["top1_at_depth"]) == 3 for p in first["curve"])
    seen = [p["positions_seen"] for p in first["curve"]]
    assert 0 < seen[0] < seen[1]
    resumed = train_drafter(DynaSpecDrafter.from_target(target, num_clusters=8), target, eagle3_dataset,
                            tmp_path / "ckpt", TrainingArguments(steps=12, **settings), progress=False)
    assert [p["step"] for p in resumed["curve"]] == [4, 8, 12] and resumed["curve"][2]["positions_seen"] > seen[1]
    state = json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())
    assert state["curve"] == resumed["curve"]


def test_router_only_training_changes_the_router_alone(tiny, eagle3_dataset, tmp_path):
    target, _ = tiny
    torch.manual_seed(0)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8)
    before = {name: p.detach().clone() for name, p in drafter.named_parameters()}
    settings = TrainingArguments(steps=12, lr=1e-2, batch_size=2, seq_len=16, heldout_fraction=0.25, router_only=True)
    result = train_drafter(drafter, target, eagle3_dataset, tmp_path / "ckpt", settings, progress=False)
    for name, p in drafter.named_parameters():
        assert torch.equal(p, before[name]) != name.startswith("router."), name
    assert sum(result["losses"][-3:]) < sum(result["losses"][:3])  # the loss is the router's BCE alone


def test_cli_router_fit(tiny, eagle3_dataset, tmp_path, capsys):
    from hf_dynaspec.cli import main

    drafter = tmp_path / "drafter"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(drafter)]) == 0
    assert main(["router-fit", "--target", "tiny", "--drafter", str(drafter), "--data", str(eagle3_dataset),
                 "--ckpt-dir", str(tmp_path / "fit"), "--steps", "2", "--batch-size", "2", "--seq-len", "8"]) == 0
    assert "trained to step 2" in capsys.readouterr().out


def test_features_captured_while_answering_equal_a_recomputation(tiny, tmp_path):
    """write_answers(capture_layers=..., on_shard=CapturedFeatures(...)) keeps what the target computed as it
    generated (left padding, KV cache): the same conversations and features as a batched recomputation."""
    from hf_dynaspec.training.features import CapturedFeatures

    target, tokenizer = tiny
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    records = [{"prompt": p} for p in PROMPTS]
    captured = CapturedFeatures(tmp_path / "captured", tmp_path / "c", layers, target.config.hidden_size)
    write_answers(target, tokenizer, records, tmp_path / "c", 9, 3, per_shard=3, progress=False,
                  capture_layers=layers, on_shard=captured)
    write_features(target, tmp_path / "c", tmp_path / "recomputed", layers, progress=False)
    mine, theirs = load_dataset(tmp_path / "captured"), load_dataset(tmp_path / "recomputed")
    assert [c.input_ids.tolist() for c in mine] == [c.input_ids.tolist() for c in theirs]
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.aux.float(), b.aux.float(), rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(a.hidden.float(), b.hidden.float(), rtol=2e-3, atol=2e-3)


def test_loop_end_cuts_after_the_first_recurring_span():
    assert loop_end([1, 2, 3, 1, 2, 3, 1], 3) == 6 and loop_end([1, 2, 3, 1, 2], 2) == 5
    assert loop_end([1, 2, 3, 4, 1, 2], 3) is None and loop_end([7, 7], 3) is None


def test_answers_until_loop_are_the_greedy_answers_cut_at_their_loop(tiny, tmp_path):
    """Segments of 5 tokens in batches of 2: unfinished answers are prefilled again beside new prompts, and each
    answer is still the prompt's own greedy answer (computed alone, in one go), cut where it starts to loop."""
    target, tokenizer = tiny
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    pad_id, eos_ids = pad_token_id(tokenizer, target), eos_token_ids(target)
    got = answers_until_loop(target, prompts, 24, 2, pad_id, eos_ids, span=4, segment=5)
    for ids, answer in zip(prompts, got):
        whole = answer_batch(target, [ids], 24, pad_id, eos_ids)[0][0].tolist()
        end = loop_end(whole, 4)
        assert answer.tolist() == whole[: end or len(whole)]
    assert any(loop_end(a.tolist(), 4) for a in got)  # the tiny target loops: the cut is exercised
    assert any(a.numel() > 5 for a in got)  # and answers continue past their first segment
    with pytest.raises(ValueError, match="capture_layers"):
        write_answers(target, tokenizer, [{"prompt": "hi"}], tmp_path / "c", 6, 2, stop_repeats=4, capture_layers=[1])


def test_an_engine_continuing_the_queue_writes_the_same_corpus(tiny, tmp_path):
    """`continue_batch` (how vLLM generates the corpus, `recipes/gemma3/vllm_engine.py`) given the whole queue at
    once: here transformers' own greedy continuation one context at a time, so the shards must hold exactly the
    answers of the batched default path."""
    target, tokenizer = tiny
    pad_id, eos_ids = pad_token_id(tokenizer, target), eos_token_ids(target)
    records = [{"prompt": p, "source": f"s{i}"} for i, p in enumerate(PROMPTS)]
    calls = []

    def continue_batch(contexts, steps):
        calls.append(len(contexts))
        return [answer_batch(target, [ids], steps, pad_id, eos_ids)[0][0] for ids in contexts]

    write_answers(target, tokenizer, records, tmp_path / "default", 24, 2, stop_repeats=4, segment=5,
                  progress=False)
    write_answers(None, tokenizer, records, tmp_path / "engine", 24, len(PROMPTS), stop_repeats=4, segment=5,
                  progress=False, continue_batch=continue_batch, eos_ids=eos_ids)
    assert [c.input_ids.tolist() for c in load_corpus(tmp_path / "engine")] == \
        [c.input_ids.tolist() for c in load_corpus(tmp_path / "default")]
    assert calls[0] == len(PROMPTS) and len(calls) > 1  # the whole queue per call, then what is unfinished
    with pytest.raises(ValueError, match="stop_repeats and eos_ids"):
        write_answers(None, tokenizer, records, tmp_path / "x", 6, 2, continue_batch=continue_batch)


def test_bfloat16_features_hold_states_beyond_float16(tiny, tmp_path):
    """Gemma's residual stream exceeds float16: float16 storage refuses it and says what to do, bfloat16 storage
    keeps it (float32's range, bfloat16 rounding) and loads back as bfloat16 tensors."""
    target, tokenizer = tiny
    write_answers(target, tokenizer, [{"prompt": p} for p in PROMPTS[:2]], tmp_path / "c", 6, 2, progress=False)
    big = type(target.model.norm)(target.config.hidden_size)  # a final norm whose output exceeds float16
    with torch.no_grad():
        big.weight.fill_(1e5)
    original, target.model.norm = target.model.norm, big
    try:
        with pytest.raises(ValueError, match="--feature-dtype bfloat16"):
            write_features(target, tmp_path / "c", tmp_path / "f16", [1], progress=False)
        write_features(target, tmp_path / "c", tmp_path / "bf16", [1], progress=False, dtype="bfloat16")
        convs = load_dataset(tmp_path / "bf16")
        with torch.no_grad():
            out = target(convs[0].input_ids[None, :-1], output_hidden_states=True)
    finally:
        target.model.norm = original
    assert convs[0].hidden.dtype == torch.bfloat16 and convs[0].hidden.float().abs().max() > 7e4
    torch.testing.assert_close(convs[0].hidden.float(), out.hidden_states[-1][0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(convs[0].aux.float(), out.hidden_states[1][0], rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="bfloat16 features"):
        write_features(target, tmp_path / "c", tmp_path / "bf16", [1], progress=False)


def test_batches_pad_to_their_longest_window_and_padding_changes_no_loss(tiny, eagle3_dataset):
    """`collate` pads to the longest window, not to seq_len: the padding it leaves out is never read by a loss
    (right padding, causal attention), so the losses equal those of a batch padded to the full window."""
    from dataclasses import replace

    from hf_dynaspec.training.losses import drafter_losses
    from hf_dynaspec.training.trainer import length_grouped_batches

    target, _ = tiny
    convs = load_dataset(eagle3_dataset)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3").bind(target).eval()
    batch = next(length_grouped_batches(convs, 3, 64, torch.Generator().manual_seed(0), pool=1))
    assert batch.input_ids.shape[1] < 64
    assert bool((batch.position_ids[:, -1] > 0).any())  # the longest window fills the last column

    def pad(t: torch.Tensor) -> torch.Tensor:  # (B, T, ...) -> (B, 64, ...)
        return torch.cat([t, t.new_zeros((t.shape[0], 64 - t.shape[1], *t.shape[2:]))], dim=1)

    padded = replace(batch, **{k: pad(getattr(batch, k)) for k in ("input_ids", "features", "target_hidden",
                                                                   "position_ids", "valid")})
    with torch.no_grad():
        short, full = (drafter_losses(drafter, b, 16, 4, True, torch.Generator().manual_seed(1), unroll=3)
                       for b in (batch, padded))
    for key in ("regression", "ce", "router", "top1"):
        torch.testing.assert_close(short[key], full[key], rtol=1e-4, atol=1e-5)


def test_length_grouped_batches_keep_the_drawn_windows_and_group_them_by_length(eagle3_dataset):
    """A pool of batches is the same windows as drawing them one by one, cut into batches by length."""
    from hf_dynaspec.training.trainer import length_grouped_batches, random_window

    convs = load_dataset(eagle3_dataset)
    pool, size = 4, 3
    stream = length_grouped_batches(convs, size, 64, torch.Generator().manual_seed(3), pool=pool)
    batches = [next(stream) for _ in range(pool)]
    generator = torch.Generator().manual_seed(3)
    drawn = [random_window(convs, 64, generator) for _ in range(pool * size)]

    def lengths(batch):
        return sorted(int(n) for n in (batch.position_ids > 0).sum(-1) + 1)  # each window starts at position 0

    assert sorted(n for b in batches for n in lengths(b)) == sorted(p["input_ids"].shape[0] for p in drawn)
    spans = sorted((min(lengths(b)), max(lengths(b))) for b in batches)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))  # no batch straddles another's lengths
    with pytest.raises(ValueError, match="length_pool"):
        TrainingArguments(steps=1, lr=1e-3, batch_size=2, seq_len=16, length_pool=0)


def test_the_targets_head_runs_once_per_batch_whatever_the_unroll(tiny, eagle3_dataset):
    """The target's distribution at the scored positions is shared by every unrolled step: unroll + 1 head
    calls per batch (one per step for the drafter, one for the target), not 2 x unroll."""
    from hf_dynaspec.training.losses import drafter_losses
    from hf_dynaspec.training.trainer import length_grouped_batches

    target, _ = tiny
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3").bind(target)
    batch = next(length_grouped_batches(load_dataset(eagle3_dataset), 2, 64, torch.Generator().manual_seed(0), pool=1))
    calls, head = [], DenseHead.of(drafter)
    parts = drafter_losses(drafter, batch, 8, 4, True, torch.Generator().manual_seed(1), unroll=3,
                           dense=lambda h: calls.append(h.shape[0]) or head(h))
    assert len(calls) == 4 and len(set(calls)) == 1  # the same scored positions at every step
    assert all(torch.isfinite(parts[k]) for k in ("ce", "router", "regression"))


def test_a_head_cast_once_scores_as_autocast_casting_it_per_call(tiny, eagle3_dataset):
    """Training under bf16 autocast casts the frozen V x d head once (`DenseHead.of(drafter, dtype)`), which
    must give the very losses and gradients of autocast casting it on every call."""
    from hf_dynaspec.training.losses import drafter_losses
    from hf_dynaspec.training.trainer import length_grouped_batches

    target, _ = tiny
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3").bind(target)
    batch = next(length_grouped_batches(load_dataset(eagle3_dataset), 2, 64, torch.Generator().manual_seed(0), pool=1))
    once = DenseHead.of(drafter, torch.bfloat16)
    assert once.weight.dtype == torch.bfloat16 and drafter.bound_head.weight.dtype == torch.float32
    results = []
    for dense in (drafter.dense_logits, once):
        drafter.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            parts = drafter_losses(drafter, batch, 8, 4, True, torch.Generator().manual_seed(1), unroll=2,
                                   dense=dense)
        (parts["ce"] + parts["router"]).backward()
        results.append((parts, drafter.fc.weight.grad.clone()))
    (per_call, grad_per_call), (cast_once, grad_once) = results
    assert all(torch.equal(per_call[k], cast_once[k]) for k in ("ce", "router", "regression", "top1"))
    assert torch.equal(grad_per_call, grad_once)


def test_a_batch_no_unrolled_step_can_score_is_refused(tiny, eagle3_dataset):
    from dataclasses import replace

    from hf_dynaspec.training.losses import drafter_losses
    from hf_dynaspec.training.trainer import length_grouped_batches

    target, _ = tiny
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3").bind(target)
    batch = next(length_grouped_batches(load_dataset(eagle3_dataset), 2, 64, torch.Generator().manual_seed(0), pool=1))
    early = torch.zeros_like(batch.valid)
    early[:, 0] = True  # only position 0 counts: step 2 cannot score it
    with pytest.raises(ValueError, match="smaller --unroll"):
        drafter_losses(drafter, replace(batch, valid=early), 8, 4, True, torch.Generator().manual_seed(1), unroll=2)


def test_router_labels_mark_the_clusters_of_the_top_tokens_and_of_the_target_token():
    from hf_dynaspec.training.losses import router_labels

    cluster_of_token = torch.tensor([0, 0, 1, 2, 3, 3])  # (V,) 4 clusters
    top = torch.tensor([[0, 2], [5, 4]])  # (k, L) the drafter's best tokens
    labels = router_labels(cluster_of_token, top, torch.tensor([3, 1]), torch.float32)
    assert labels.tolist() == [[1, 1, 1, 0], [1, 0, 0, 1]]


def test_candidates_covering_the_vocabulary_score_as_the_full_head(tiny, eagle3_dataset):
    """The candidate CE over every id is the full-vocabulary CE: same losses, same top-1."""
    from hf_dynaspec.training.losses import Candidates, drafter_losses
    from hf_dynaspec.training.trainer import length_grouped_batches

    target, _ = tiny
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3").bind(target)
    batch = next(length_grouped_batches(load_dataset(eagle3_dataset), 2, 64, torch.Generator().manual_seed(0), pool=1))
    every_id = Candidates(torch.arange(drafter.config.vocab_size), top=4)
    full, candidate = (drafter_losses(drafter, batch, 8, 4, True, torch.Generator().manual_seed(1), unroll=2,
                                      candidates=c) for c in (None, every_id))
    for key in ("ce", "router", "regression", "top1"):
        torch.testing.assert_close(candidate[key], full[key], msg=key)


def test_candidate_columns_hold_the_frequent_ids_and_each_positions_likeliest():
    from hf_dynaspec.training.losses import Candidates, DenseHead, head_targets

    torch.manual_seed(0)
    head = DenseHead(torch.randn(50, 8), lambda z: z)  # V = 50
    hidden = torch.randn(3, 8)
    logits = head(hidden)  # (3, 50)
    targets = head_targets(head, hidden, Candidates(torch.tensor([7, 3]), top=4))
    columns = targets.columns.tolist()
    expected = {3, 7} | set(logits.topk(4, dim=-1).indices.flatten().tolist())
    assert columns == sorted(expected)
    assert torch.equal(targets.vocabulary_ids(targets.token), logits.argmax(-1))
    torch.testing.assert_close(targets.probs, logits[:, targets.columns].softmax(-1))
    torch.testing.assert_close(targets.head(hidden), logits[:, targets.columns])


def test_training_over_candidates_records_them(tiny, eagle3_dataset, tmp_path):
    target, _ = tiny
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3")
    sizes = dict(steps=2, lr=1e-3, batch_size=2, seq_len=16)
    settings = TrainingArguments(**sizes, ckpt_every=1, head_vocab=16, head_target_top=2)
    train_drafter(drafter, target, eagle3_dataset, tmp_path, settings, progress=False)
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    assert state["head_vocab"] == 16 and state["head_target_top"] == 2
    with pytest.raises(ValueError, match="head_vocab"):
        TrainingArguments(**sizes, head_vocab=0)
    with pytest.raises(ValueError, match=f"head_vocab must be in 1..{drafter.config.vocab_size}"):
        train_drafter(drafter, target, eagle3_dataset, tmp_path / "x", TrainingArguments(**sizes, head_vocab=10**7))
    assert not (tmp_path / "x").exists()  # refused before anything was written
    with pytest.raises(ValueError, match="head_target_top"):
        TrainingArguments(**sizes, head_vocab=8, head_target_top=0)


def test_evaluation_with_kept_target_tokens_scores_the_same_and_skips_their_head(tiny, eagle3_dataset):
    target, _ = tiny
    torch.manual_seed(0)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3").bind(target).eval()
    convs = load_dataset(eagle3_dataset)[:6]
    plain = evaluate_drafter(drafter, convs, seq_len=16, unroll=3)
    cache: dict = {}
    calls = []
    original = drafter.dense_logits
    drafter.dense_logits = lambda features: calls.append(features.shape[0]) or original(features)
    try:
        first = evaluate_drafter(drafter, convs, seq_len=16, unroll=3, gold_cache=cache)
        per_window = len(calls)
        calls.clear()
        second = evaluate_drafter(drafter, convs, seq_len=16, unroll=3, gold_cache=cache)
    finally:
        del drafter.dense_logits
    assert first == second == plain and len(cache) > 0
    assert len(calls) == per_window - len(cache)  # one head call per window fewer: the target's tokens are kept


@pytest.mark.parametrize("bad, message", [
    ({"steps": 0}, "steps must be >= 1"),
    ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"lr": 0.0}, "lr must be > 0"),
    ({"heldout_fraction": 1.0}, r"heldout_fraction must be in \[0, 1\)"),
    ({"eval_every": -1}, "eval_every must be >= 0"),
    ({"ckpt_every": 0}, "ckpt_every must be >= 1"),
])
def test_training_arguments_refuse_bad_values_when_built(bad, message):
    with pytest.raises(ValueError, match=message):
        TrainingArguments(**({"steps": 1, "lr": 1e-3, "batch_size": 2, "seq_len": 16} | bad))


def test_training_arguments_defaults_follow_the_settings():
    args = TrainingArguments(steps=100, lr=1e-3, batch_size=2, seq_len=16)
    assert args.warmup_steps == 5 and TrainingArguments(steps=10, lr=1e-3, batch_size=2, seq_len=16).warmup_steps == 1
    assert args.loss_weights == args.weights
    router = TrainingArguments(steps=1, lr=1e-3, batch_size=2, seq_len=16, router_only=True, warmup=3)
    assert (router.loss_weights.regression, router.loss_weights.ce, router.loss_weights.router) == (0.0, 0.0, 1.0)
    assert router.warmup_steps == 3

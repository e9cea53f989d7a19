"""Training from a token-id corpus with the target's features computed per batch (training/online.py): the same
windows, states and held-out split as from feature folders, on a tiny random target (CPU, seconds).

    .venv/bin/python -m pytest tests/test_online_features.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.configuration import eagle3_layer_ids
from hf_dynaspec.targets import load_target
from hf_dynaspec.training import TrainingArguments, load_dataset, online, train_drafter
from hf_dynaspec.training.corpus import write_answers
from hf_dynaspec.training.features import write_features
from hf_dynaspec.training.online import TargetFeatures, corpus_groups, forward_autocast, with_features
from hf_dynaspec.training.trainer import length_grouped_batches, load_split_groups

PROMPTS = ["hello there", "hi", "what is two plus two?", "write a haiku", "tell me a story", "count to ten"]
SOURCES = ["qa-de", "code-c", "qa-de", "code-c", "qa-de", "code-c"]
GROUPS = {"de": "qa-de", "code": "code-.*"}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_target("tiny")


@pytest.fixture(scope="module")
def corpus(tiny, tmp_path_factory):
    """A two-source corpus and, for each source, the feature folder `hf-dynaspec features --sources` writes."""
    target, tokenizer = tiny
    root = tmp_path_factory.mktemp("online")
    records = [{"prompt": p, "source": s} for p, s in zip(PROMPTS, SOURCES)]
    write_answers(target, tokenizer, records, root / "corpus", 20, 3, per_shard=4, progress=False)
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    for name, pattern in GROUPS.items():
        write_features(target, root / "corpus", root / name, layers, max_tokens=64, sources=pattern, progress=False,
                       dtype="bfloat16")
    return root


def test_computed_states_equal_the_stored_ones_and_any_prefix_of_them(tiny, corpus):
    target, _ = tiny
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    stored = load_dataset(corpus / "de")
    ids_only = corpus_groups(corpus / "corpus", {"de": GROUPS["de"]}, layers)["de"]
    assert [c.input_ids.tolist() for c in ids_only] == [c.input_ids.tolist() for c in stored]
    assert all(c.hidden is None and c.num_states == s.num_states for c, s in zip(ids_only, stored))
    featurize = TargetFeatures(target, layers)
    whole = featurize([(c, c.num_states) for c in ids_only])  # one padded batch of unequal lengths
    for conv, ref in zip(whole, stored):
        torch.testing.assert_close(conv.hidden, ref.hidden.float(), rtol=1e-2, atol=1e-2)  # bf16 storage
        torch.testing.assert_close(conv.aux, ref.aux.float(), rtol=1e-2, atol=1e-2)
        assert torch.equal(conv.loss_mask, ref.loss_mask)
    prefix = featurize([(ids_only[0], 3)])[0]  # causal: the first states of a prefix are the whole's
    assert prefix.hidden.shape[0] == 3
    torch.testing.assert_close(prefix.hidden, whole[0].hidden[:3], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="never fed back"):
        featurize([(ids_only[0], ids_only[0].input_ids.numel())])


def test_batches_from_the_corpus_are_the_batches_from_feature_folders(tiny, corpus):
    """Same seed, same conversations: the same windows, with the states computed per batch."""
    target, _ = tiny
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    folders, _, sizes = load_split_groups([corpus / name for name in GROUPS], 0.25, 0)
    ids_only, _, ids_sizes = load_split_groups(corpus_groups(corpus / "corpus", GROUPS, layers), 0.25, 0)
    assert sizes == ids_sizes
    assert [c.input_ids.tolist() for c in folders] == [c.input_ids.tolist() for c in ids_only]
    stored = length_grouped_batches(folders, 2, 8, torch.Generator().manual_seed(1), pool=2)
    computed = length_grouped_batches(ids_only, 2, 8, torch.Generator().manual_seed(1), pool=2,
                                      featurize=TargetFeatures(target, layers))
    for _ in range(4):
        a, b = next(stored), next(computed)
        for key in ("input_ids", "position_ids", "valid"):
            assert torch.equal(getattr(a, key), getattr(b, key)), key
        torch.testing.assert_close(b.features, a.features.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(b.target_hidden, a.target_hidden.float(), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="token ids only"):
        next(length_grouped_batches(ids_only, 2, 8, torch.Generator().manual_seed(1)))


def test_training_from_the_corpus_reports_each_group_on_the_folders_split(tiny, corpus, tmp_path):
    target, _ = tiny
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    runs = {}
    for label, data, featurize in (
        ("folders", [corpus / name for name in GROUPS], None),
        ("corpus", corpus_groups(corpus / "corpus", GROUPS, layers), TargetFeatures(target, layers)),
    ):
        drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3")
        settings = TrainingArguments(steps=4, lr=1e-3, batch_size=2, seq_len=16, heldout_fraction=0.25, eval_every=2)
        runs[label] = train_drafter(drafter, target, data, tmp_path / label, settings, featurize=featurize,
                                    progress=False)
    state = {label: json.loads((tmp_path / label / "trainer_state.json").read_text()) for label in runs}
    assert state["corpus"]["data_conversations"] == state["folders"]["data_conversations"]
    for label, run in runs.items():
        assert [p["step"] for p in run["curve"]] == [2, 4]
        assert set(run["curve"][-1]["by_group"]) == set(GROUPS), label
    held = {label: {g: v["heldout_positions"] for g, v in run["curve"][-1]["by_group"].items()}
            for label, run in runs.items()}
    assert held["corpus"] == held["folders"]  # the same held-out conversations scored
    assert runs["corpus"]["eval"]["positions"] == runs["folders"]["eval"]["positions"] > 0


def test_cli_trains_from_a_corpus_and_refuses_unclear_groups(tiny, corpus, tmp_path, capsys):
    from hf_dynaspec.cli import main

    drafter, ckpt = tmp_path / "drafter", tmp_path / "ckpt"
    assert main(["init", "--target", "tiny", "--num-clusters", "8", "--architecture", "eagle3", "--out",
                 str(drafter)]) == 0
    common = ["train", "--target", "tiny", "--drafter", str(drafter), "--ckpt-dir", str(ckpt), "--steps", "2",
              "--batch-size", "2", "--seq-len", "16", "--feature-forward", "float32"]
    assert main([*common, "--corpus", str(corpus / "corpus"), "--group", "de=qa-de", "--group", "code=code-.*",
                 "--eval-every", "2"]) == 0
    assert "trained to step 2" in capsys.readouterr().out
    saved = json.loads((ckpt / "heldout_eval.json").read_text())
    assert saved["settings"]["groups"] == GROUPS and saved["settings"]["corpus"] == str(corpus / "corpus")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert set(state["curve"][-1]["by_group"]) == set(GROUPS)
    for extra, message in ((["--data", str(corpus / "de"), "--group", "de=qa-de"], "drop --group"),
                           (["--corpus", str(corpus / "corpus"), "--group", "a=qa-de", "--group", "a=code-.*"],
                            "must differ"),
                           (["--corpus", str(corpus / "corpus"), "--group", "x=plain-.*"], "No conversation")):
        assert main([*common, *extra]) != 0
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*common, "--corpus", str(corpus / "corpus"), "--group", "no-pattern"])


def test_forward_dtype_follows_the_machine_unless_named(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(online, "has_bf16_matrix_units", lambda: False)
    assert forward_autocast("auto", cpu) is None
    monkeypatch.setattr(online, "has_bf16_matrix_units", lambda: True)
    assert forward_autocast("auto", cpu) is torch.bfloat16
    assert forward_autocast("float32", cpu) is None and forward_autocast("bfloat16", cpu) is torch.bfloat16
    with pytest.raises(ValueError, match="one of"):
        forward_autocast("float16", cpu)


def test_held_out_states_are_filled_for_the_positions_an_evaluation_reads(tiny, corpus):
    target, _ = tiny
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    convs = corpus_groups(corpus / "corpus", {"all": ".*"}, layers)["all"]
    with pytest.raises(ValueError, match="token ids only"):
        with_features(convs, None)
    first = int(convs[0].loss_mask[2:].sum())
    some = with_features(convs, TargetFeatures(target, layers), max_positions=first)
    assert len(some) == 1 and some[0].hidden.shape[0] == convs[0].num_states
    filled = with_features(convs, TargetFeatures(target, layers), batch_size=4)
    assert len(filled) == len(convs) and all(c.hidden is not None for c in filled)
    assert with_features(filled, None) == filled  # nothing left to compute: no target needed


def test_cli_static_counts_a_corpus_as_its_feature_folders(corpus, tmp_path):
    """FR-Spec's list from the token ids alone: the same ranking as counting the feature folders' answers."""
    from hf_dynaspec.cli import main

    lists = {}
    for label, source in (("corpus", ["--corpus", str(corpus / "corpus")]),
                          ("folders", [arg for name in GROUPS for arg in ("--data", str(corpus / name))])):
        drafter = tmp_path / label
        assert main(["init", "--target", "tiny", "--num-clusters", "8", "--out", str(drafter)]) == 0
        assert main(["static", "--drafter", str(drafter), "--size", "24", *source]) == 0
        lists[label] = DynaSpecDrafter.from_pretrained(drafter).static_token_ids.tolist()
    assert len(lists["corpus"]) == 24 and lists["corpus"] == lists["folders"]

"""A training run asked to stop (SIGINT / SIGTERM) finishes its step, checkpoints it and resumes from it.

    .venv/bin/python -m pytest tests/test_training_stop.py -q
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.configuration import eagle3_layer_ids
from hf_dynaspec.targets import load_target
from hf_dynaspec.training import TrainingArguments, train_drafter, trainer
from hf_dynaspec.training.corpus import write_answers
from hf_dynaspec.training.online import TargetFeatures, corpus_groups
from hf_dynaspec.training.trainer import TrainingStopped


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    torch.set_num_threads(1)
    target, tokenizer = load_target("tiny")
    out = tmp_path_factory.mktemp("corpus")
    write_answers(target, tokenizer, [{"prompt": p} for p in ("hi", "hello there", "a haiku", "count")], out, 12, 2,
                  progress=False)
    return target, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_the_finished_step_and_the_run_resumes_from_it(tiny_corpus, tmp_path, monkeypatch, sig):
    target, corpus = tiny_corpus
    layers = eagle3_layer_ids(target.config.num_hidden_layers)
    calls = {"n": 0}
    losses = trainer.drafter_losses

    def signalled(*args, **kwargs):  # the signal arrives in the middle of step 3
        calls["n"] += 1
        if calls["n"] == 3:
            signal.raise_signal(sig)
        return losses(*args, **kwargs)

    monkeypatch.setattr(trainer, "drafter_losses", signalled)
    handler = signal.getsignal(sig)

    def run():
        drafter = DynaSpecDrafter.from_target(target, num_clusters=8, drafter_architecture="eagle3")
        settings = TrainingArguments(steps=5, lr=1e-3, batch_size=2, seq_len=16, heldout_fraction=0.25, ckpt_every=100)
        return train_drafter(drafter, target, corpus_groups(corpus, {"all": ".*"}, layers), tmp_path, settings,
                             featurize=TargetFeatures(target, layers), progress=False)

    with pytest.raises(TrainingStopped, match=f"{sig.name} after step 3 of 5"):
        run()
    assert signal.getsignal(sig) == handler  # the handlers are put back
    assert json.loads((tmp_path / "trainer_state.json").read_text())["step"] == 3
    result = run()
    assert result["start_step"] == 3 and result["step"] == 5 and len(result["losses"]) == 2

"""A drafter folder saved for sharing: a model card with validated metadata and no invented links, a
custom_generate/ folder that transformers' own `generate(custom_generate=<dir>)` runs (loading the drafter
once), and `push` uploading only the drafter's files.

    python -m pytest tests/test_sharing.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import greedy, prompt, tiny_drafter, tiny_target
from huggingface_hub import ModelCard

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.cli import main
from hf_dynaspec.sharing import (
    REPO_PLACEHOLDER,
    TREE_TUNING,
    nested,
    publish_files,
    save_for_sharing,
    shared_files,
    step_policy_section,
)
from hf_dynaspec.targets import byte_level_tokenizer


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    target = tiny_target(vocab_size=258, seed=2)
    target.config._name_or_path = "org/tiny-target"
    drafter = tiny_drafter(target)
    folder = save_for_sharing(drafter, tmp_path_factory.mktemp("share") / "drafter", byte_level_tokenizer(),
                              target_weights="a tiny random Llama built in code", sections=[("Training", "None.")])
    return target, folder


def test_card_metadata_is_validated_and_links_are_not_invented(shared):
    _, folder = shared
    card = ModelCard.load(folder / "README.md")
    data = card.data.to_dict()
    assert data["base_model"] == "org/tiny-target" and data["base_model_relation"] == "adapter"
    assert data["library_name"] == "hf-dynaspec" and "speculative-decoding" in data["tags"]
    assert "github.com" not in card.text and REPO_PLACEHOLDER in card.text
    assert "a tiny random Llama built in code" in card.text and "## Training" in card.text


def test_custom_generate_runs_through_transformers_and_loads_the_drafter_once(shared, monkeypatch):
    target, folder = shared
    loads = []
    original = DynaSpecDrafter.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(args[0])
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(DynaSpecDrafter, "from_pretrained", classmethod(counting))
    ids = prompt(6, vocab_size=258)
    for _ in range(2):
        got = target.generate(ids, custom_generate=str(folder), trust_remote_code=True, max_new_tokens=12,
                              do_sample=False)
        assert torch.equal(got, greedy(target, ids, max_new_tokens=12))
    assert loads == [str(folder.resolve())]  # once, from the saved folder


def test_push_uploads_only_drafter_files(shared, tmp_path, capsys):
    _, folder = shared
    (folder / "optimizer.pt").write_bytes(b"0")
    (folder / TREE_TUNING).write_text("{}")  # the default tree's evidence travels with the drafter
    (folder / "checkpoints" / "step-100").mkdir(parents=True)
    (folder / "checkpoints" / "step-100" / "model.safetensors").write_bytes(b"0")
    assert main(["push", str(folder), "me/tiny-drafter", "--dry-run"]) == 0
    listed = capsys.readouterr().out.split(": ", 1)[1].strip().split(", ")
    assert listed == shared_files(folder)
    assert "model.safetensors" in listed and "custom_generate/generate.py" in listed and "tokenizer.json" in listed
    assert TREE_TUNING in listed
    assert not any("optimizer" in f or f.startswith("checkpoints/") for f in listed)


def test_publishing_fills_the_repo_id(shared, tmp_path):
    import shutil

    _, folder = shared
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    publish_files(copy, "me/tiny-drafter")
    assert REPO_PLACEHOLDER not in (copy / "README.md").read_text()
    assert 'DynaSpecDrafter.from_pretrained("me/tiny-drafter")' in (copy / "README.md").read_text()
    assert "DRAFTER = 'me/tiny-drafter'" in (copy / "custom_generate" / "generate.py").read_text()


def test_a_card_holds_each_runs_step_policy_report_under_its_own_section(tmp_path):
    runs = []
    for name in ("newer", "older"):
        (tmp_path / name / "step-policy").mkdir(parents=True)
        (tmp_path / name / "step-policy" / "results.md").write_text(
            f"# Per-prompt speedups\n\nrun {name}\n\n## detail\n\n```\n# not a title\n```\n")
        runs.append(tmp_path / name)
    title, text = step_policy_section(runs)
    assert title == "Step policy"
    assert text.index("run newer") < text.index("run older")
    assert "# Per-prompt speedups" not in text and text.count("### detail") == 2 and "# not a title" in text
    assert nested("# a\n\n## b\nc") == "### b\nc"
    with pytest.raises(FileNotFoundError, match="step_policy.py --bench"):
        step_policy_section([tmp_path / "missing"])

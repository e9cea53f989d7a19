"""The generate() hook: installed once, checked against transformers' signatures at install, removable.

    python -m pytest tests/test_hook.py -q
"""

from __future__ import annotations

import pytest
from transformers.generation.utils import GenerationMixin

from hf_dynaspec.generation.loop import hook


def test_install_is_idempotent_and_uninstall_restores_transformers():
    hook.install()
    wrapped = GenerationMixin._assisted_decoding
    hook.install()
    assert GenerationMixin._assisted_decoding is wrapped  # not wrapped twice
    original = getattr(wrapped, hook._MARK)
    try:
        hook.uninstall()
        assert GenerationMixin._assisted_decoding is original
        assert not hasattr(GenerationMixin._validate_generation_mode, hook._MARK)
    finally:
        hook.install()
    assert hasattr(GenerationMixin._assisted_decoding, hook._MARK)


@pytest.mark.parametrize("name", ["_assisted_decoding", "_validate_generation_mode"])
def test_a_changed_transformers_signature_fails_at_install(name, monkeypatch):
    def renamed(self, inputs, processors, criteria, config):  # what a future transformers might do
        raise AssertionError("never called")

    hook.uninstall()
    monkeypatch.setattr(GenerationMixin, name, renamed)
    try:
        with pytest.raises(RuntimeError, match=rf"GenerationMixin.{name}.*pip install 'transformers"):
            hook.install()
        # nothing was wrapped: the check runs before any method is replaced
        assert not any(hasattr(getattr(GenerationMixin, n), hook._MARK) for n in hook.EXPECTED)
    finally:
        monkeypatch.undo()
        hook.install()
    assert hasattr(GenerationMixin._assisted_decoding, hook._MARK)


def test_missing_keyword_is_reported():
    def no_assistant(self, input_ids, logits_processor, stopping_criteria, generation_config, streamer=None):
        raise AssertionError("never called")

    with pytest.raises(RuntimeError, match="assistant_model"):
        hook.check_signature("_assisted_decoding", no_assistant)
    hook.check_signature("_assisted_decoding", getattr(GenerationMixin._assisted_decoding, hook._MARK))

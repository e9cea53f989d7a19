"""Head modes plug in at one place: a toy mode registered from this module alone decodes exactly.

    python -m pytest tests/test_head_modes.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import greedy, prompt, speculative

from hf_dynaspec.head_modes import HEADS, HeadMode, HeadOutput, head_modes, register_head


class FirstTokens(HeadMode):
    """A toy mode: the first `n` token ids of the vocabulary, whatever the context."""

    name = "first-n"

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def logits(self, head, features, request):
        self.calls += 1
        ids = torch.arange(self.n, device=features.device)  # (S,)
        return HeadOutput.dense(ids, head.transform(F.linear(features, head.weight[: self.n]).float()))  # (T, S)


@pytest.fixture
def first_tokens():
    mode = register_head(FirstTokens(64))
    yield mode
    HEADS.pop(mode.name)


def test_a_registered_mode_decodes_exactly(target, drafter, first_tokens):
    ids = prompt(8, seed=3)
    out = speculative(target, drafter, ids, max_new_tokens=16, head_mode="first-n", step_policy="off")
    assert torch.equal(out, greedy(target, ids, max_new_tokens=16))
    assert first_tokens.calls > 0  # the mode drafted


def test_a_registered_mode_decodes_a_batch_exactly(target, drafter, first_tokens):
    ids = torch.cat([prompt(6, seed=4), prompt(6, seed=5)])
    out = speculative(target, drafter, ids, max_new_tokens=10, head_mode="first-n", step_policy="off")
    assert torch.equal(out, greedy(target, ids, max_new_tokens=10))


def test_an_unregistered_mode_is_refused_naming_the_modes(target, drafter):
    assert "first-n" not in head_modes()
    with pytest.raises(ValueError, match="Unknown head_mode 'first-n': choose one of .*'dynamic'"):
        speculative(target, drafter, prompt(), max_new_tokens=4, head_mode="first-n")


def test_register_head_takes_a_named_mode():
    class Unnamed(FirstTokens):
        name = ""

    with pytest.raises(ValueError, match="named HeadMode"):
        register_head(Unnamed(4))

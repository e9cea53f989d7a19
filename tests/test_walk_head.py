"""Each LM-head layout of the walk (`walk_head.LAYOUTS`) is a `WalkHead` giving the model's own greedy picks, and
its logits where it makes logits, both applied to hidden states and read from a verification pass."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt

from hf_dynaspec.generation.verification.walk_head import HEADS, LAYOUTS, WalkHead, head_class


def own_pass(target, ids):
    """The model's own logits (L, V) and final hidden states (L, d) over `ids` (1, L)."""
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return out.logits[0].float(), out.hidden_states[-1][0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_gives_the_model_s_picks_and_logits(target, layout):
    ids = prompt(9, seed=3)
    logits, hidden = own_pass(target, ids)  # (L, V), (L, d)
    head = WalkHead.of(target, rows=3, layout=layout)
    assert type(head) is HEADS[layout] and head.layout == layout and head.rows == 3
    assert head.greedy_only == (layout == "prefilter")
    with torch.no_grad():
        assert head.argmax(hidden).tolist() == logits.argmax(dim=-1).tolist()
        made = head.apply(hidden)
        known, picks = head.split(list(range(len(hidden))), made)
        if head.greedy_only:  # picks, no logits
            assert known == {} and list(picks.values()) == logits.argmax(dim=-1).tolist()
        else:
            torch.testing.assert_close(made, logits, rtol=1e-5, atol=1e-5)
            assert picks == {} and torch.equal(torch.cat(list(known.values())), made)
        assert head.reproduces(hidden[-1:], logits[-1:])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_reads_its_walk_from_a_verification_pass(target, layout):
    """The pass asked with the head's `logits_to_keep` holds what its `walk` needs for those rows."""
    ids = prompt(9, seed=4)
    logits, _ = own_pass(target, ids)
    head = WalkHead.of(target, rows=3, layout=layout)
    rows = [0, 4, 8]
    with torch.no_grad():
        out = target(ids, output_hidden_states=True, logits_to_keep=head.logits_to_keep(rows, ids.device))
        known, picks = head.walk(out, rows)
    if head.greedy_only:
        assert known == {} and picks == {r: int(logits[r].argmax()) for r in rows}
    else:
        assert sorted(known) == rows and picks == {}
        torch.testing.assert_close(torch.cat([known[r] for r in rows]), logits[rows], rtol=1e-5, atol=1e-5)


def test_unknown_layout_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"layout must be one of \('rows', 'columns', 'prefilter'\), got 'diag"):
        head_class("diagonal")
    with pytest.raises(ValueError, match="layout must be one of"):
        WalkHead.of(torch.nn.Module(), layout="full")  # "full" is no walk head: verification keeps every row


def test_only_the_greedy_layout_needs_greedy_calls(target):
    assert [name for name in LAYOUTS if head_class(name).blocker(target, greedy_only=False)] == ["prefilter"]
    assert all(head_class(name).blocker(target, greedy_only=True) is None for name in LAYOUTS)


@pytest.mark.parametrize("verify_head", ["full", *LAYOUTS])
def test_a_batch_in_each_layout_is_plain_batched_greedy(target, drafter, verify_head):
    """A batch applies the head once over every row's gathered walk rows, then splits them per row."""
    ids = torch.cat([prompt(7, seed=8), prompt(7, seed=9)])  # (2, 7)
    kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    out = target.generate(ids, assistant_model=drafter, implementation={"verify_head": verify_head}, **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))

"""Property tests: exactness and structural invariants over random targets, settings, trees and prompts.

- End to end: greedy speculative output == plain greedy output, token for token, for random tiny targets
  (vocab 32..160), tree policies, budgets, depths, widths, head modes, EOS ids and lengths; along the way every
  accepted path is a root path of its tree and the target / drafter caches hold exactly the committed tokens
  minus the newest. Some cases draft with the oracle generator (the target's own greedy continuation) so that
  long accepted paths and EOS inside accepted paths are exercised.
- `verify.walk_tree` on random trees and logits: the accepted path is a root path, each emitted token is the
  argmax at its node, and the walk stops exactly when the argmax drafts no child.

The case grid and `check_case` live in `tests/helpers.py`, shared with `tests/soak.py`.

    python -m pytest tests/test_properties.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import HEAD_MODES, POLICIES, Case, check_case, plain_greedy, random_trees, root_path_problems
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import LogitsProcessorList

from hf_dynaspec.generation.drafting.tree import VerifyTree
from hf_dynaspec.generation.verification.verify import walk_tree
from hf_dynaspec.generation_config import DraftSettings

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@st.composite
def cases(draw: st.DrawFn, oracle: bool | None = None) -> Case:
    """Random cases; `oracle=None` lets hypothesis choose the drafter."""
    vocab_size = draw(st.integers(32, 160))
    return Case(
        vocab_size=vocab_size,
        model_seed=draw(st.integers(0, 3)),
        prompt_seed=draw(st.integers(0, 10_000)),
        prompt_length=draw(st.integers(1, 12)),
        policy=draw(st.sampled_from(POLICIES)),
        nodes=draw(st.integers(1, 64)),
        depth=draw(st.integers(1, 8)),
        top_k=draw(st.integers(1, 8)),
        head_mode=draw(st.sampled_from(HEAD_MODES)),
        min_draft_prob=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        lookup_num_tokens=draw(st.sampled_from([0, 0, 1, 4])),
        lookup_min_ngram=draw(st.integers(1, 3)),
        eos=draw(st.none() | st.integers(0, vocab_size - 1)),
        max_new_tokens=draw(st.integers(1, 30)),
        oracle=draw(st.booleans()) if oracle is None else oracle,
    )


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_greedy_speculative_equals_plain_greedy(case: Case) -> None:
    """Token-for-token exactness, root-path walks and cache lengths over random cases."""
    assert check_case(case) == []


@settings(max_examples=40, deadline=None)
@given(case=cases(oracle=True), eos_index=st.integers(0, 29))
def test_eos_emitted_inside_oracle_paths(case: Case, eos_index: int) -> None:
    """EOS chosen among the tokens plain greedy emits: the oracle drafts it inside accepted paths, and
    speculative decoding stops exactly where plain greedy stops."""
    free = Case(**{**case.__dict__, "eos": None, "max_new_tokens": 30})
    emitted = plain_greedy(free)[0, case.prompt_length:].tolist()
    eos_case = Case(**{**case.__dict__, "eos": emitted[eos_index % len(emitted)], "max_new_tokens": 30})
    assert check_case(eos_case) == []


# ---------------------------------------------------------------------------------------------- trees


@settings(max_examples=300, deadline=None)
@given(drawn=random_trees(), logits_seed=st.integers(0, 2**31), agree=st.floats(0, 1))
def test_walk_accepts_a_root_path_of_argmaxes(
    drawn: tuple[VerifyTree, DraftSettings, int], logits_seed: int, agree: float
) -> None:
    """On random logits (biased towards a drafted child with probability `agree`, so long paths happen), the
    walk's path is a root path, every emitted token is the argmax at its node, and the walk ends at the first
    node whose argmax drafts no child."""
    tree = drawn[0]
    generator = torch.Generator().manual_seed(logits_seed)
    logits = torch.randn(tree.num_nodes, 40, generator=generator)
    for node, children in enumerate(tree.children):
        if children and float(torch.rand((), generator=generator)) < agree:
            pick = children[int(torch.randint(len(children), (), generator=generator))]
            logits[node, int(tree.tokens[pick])] = 10.0
    result = walk_tree(tree, logits, torch.tensor([[int(tree.tokens[0])]]), LogitsProcessorList(), False)
    assert root_path_problems(tree, result) == []
    assert result.new_tokens == [int(logits[node].argmax()) for node in result.path]
    last_children = [int(tree.tokens[c]) for c in tree.children[result.path[-1]]]
    assert result.new_tokens[-1] not in last_children

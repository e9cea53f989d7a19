"""Property tests: exactness and structural invariants over random targets, settings, trees and prompts.

- End to end: greedy speculative output == plain greedy output, token for token, for random tiny targets
  (vocab 32..160), tree policies, budgets, depths, widths, head modes, EOS ids and lengths; along the way every
  accepted path is a root path of its tree and the target / drafter caches hold exactly the committed tokens
  minus the newest. Some cases draft with the oracle generator (the target's own greedy continuation) so that
  long accepted paths and EOS inside accepted paths are exercised.
- `tree.grow_tree` with a random expand function: parents before children, ancestor matrix = parent closure,
  node count <= budget + 1, depths <= draft depth.
- `verify.walk_tree` on random trees and logits: the accepted path is a root path, each emitted token is the
  argmax at its node, and the walk stops exactly when the argmax drafts no child.

`check_case` is shared with `benchmarks/soak.py`.

    python -m pytest tests/test_properties.py -q
"""

from __future__ import annotations

import functools
import math
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
from helpers import prompt, tiny_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st
from test_generate import OracleCandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation import decoding
from hf_dynaspec.generation.config import DraftSettings, resolve_draft_settings
from hf_dynaspec.generation.tree import DraftTree, Expand, VerifyTree, grow_tree
from hf_dynaspec.generation.verify import WalkResult, walk_tree

POLICIES = ("eagle2", "dyspec", "chain")
HEAD_MODES = ("dynamic", "full")
NUM_CLUSTERS = 8


@dataclass(frozen=True)
class Case:
    """One random end-to-end generation case."""

    vocab_size: int
    model_seed: int
    prompt_seed: int
    prompt_length: int
    policy: str
    nodes: int
    depth: int
    top_k: int
    head_mode: str
    min_draft_prob: float
    lookup_num_tokens: int
    lookup_min_ngram: int
    eos: int | None
    max_new_tokens: int
    oracle: bool


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@functools.lru_cache(maxsize=32)
def models(vocab_size: int, seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny random target and a fresh drafter bound to it (cached: building them dominates small cases)."""
    target = tiny_target(vocab_size=vocab_size, seed=seed)
    return target, tiny_drafter(target, num_clusters=NUM_CLUSTERS, seed=seed)


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


def case_prompt(case: Case) -> torch.Tensor:
    return prompt(case.prompt_length, vocab_size=case.vocab_size, seed=case.prompt_seed)


def plain_greedy(case: Case) -> torch.Tensor:
    target, _ = models(case.vocab_size, case.model_seed)
    return target.generate(
        case_prompt(case), do_sample=False, max_new_tokens=case.max_new_tokens, eos_token_id=case.eos
    )


def speculative_greedy(case: Case) -> tuple[torch.Tensor, list[str]]:
    """Speculative output of `case`, and the invariant violations seen at each step (cache, walk)."""
    target, drafter = models(case.vocab_size, case.model_seed)
    problems: list[str] = []
    original_step, original_walk = decoding.speculative_step, decoding.walk_tree

    def step_spy(target_, generator, run) -> None:
        original_step(target_, generator, run)
        cache_len, seq_len = run.cache.get_seq_length(), run.input_ids.shape[1]
        if not run.finished and not cache_len == seq_len - 1 == generator.committed:
            problems.append(f"cache lengths target={cache_len} drafter={generator.committed} sequence={seq_len}")

    def walk_spy(tree, *args, **kwargs) -> WalkResult:
        result = original_walk(tree, *args, **kwargs)
        problems.extend(root_path_problems(tree, result))
        return result

    config = DynaSpecGenerationConfig(
        tree_policy=case.policy, num_draft_nodes=case.nodes, draft_depth=case.depth, draft_top_k=case.top_k,
        head_mode=case.head_mode, max_new_tokens=case.max_new_tokens, eos_token_id=case.eos, do_sample=False,
        min_draft_prob=case.min_draft_prob, lookup_num_tokens=case.lookup_num_tokens,
        lookup_min_ngram=case.lookup_min_ngram,
    )
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(decoding, "speculative_step", step_spy))
        stack.enter_context(mock.patch.object(decoding, "walk_tree", walk_spy))
        if case.oracle:
            stack.enter_context(mock.patch.object(decoding, "DynaSpecCandidateGenerator", OracleCandidateGenerator))
        out = target.generate(case_prompt(case), generation_config=config, assistant_model=drafter)
    return out, problems


def root_path_problems(tree: VerifyTree, result: WalkResult) -> list[str]:
    """Violations of: the path starts at the root, each node's parent is the previous node, and the emitted
    tokens are the path's drafted tokens followed by one bonus token."""
    path = result.path
    problems = []
    if not path or path[0] != 0:
        problems.append(f"path {path} does not start at the root")
    for previous, node in zip(path, path[1:]):
        if int(tree.parents[node]) != previous:
            problems.append(f"path {path}: parent of {node} is {int(tree.parents[node])}, not {previous}")
    if len(result.new_tokens) != len(path) or result.new_tokens[:-1] != tree.tokens[path[1:]].tolist():
        problems.append(f"tokens {result.new_tokens} do not match path {path}")
    return problems


def check_case(case: Case) -> list[str]:
    """Every violation of exactness and the step invariants in one case (empty: the case passes)."""
    expected = plain_greedy(case)
    got, problems = speculative_greedy(case)
    if not torch.equal(got, expected):
        problems.append(f"output {got.tolist()} != plain greedy {expected.tolist()}")
    return problems


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


def random_expand(seed: int, vocab_size: int, top_k: int, p_impossible: float) -> Expand:
    """An expand function proposing `top_k` distinct random tokens per node with log q <= 0 (ties and 0
    included), some of them impossible (-inf), as a shortlisted head does."""
    generator = torch.Generator().manual_seed(seed)

    def expand(nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.stack([torch.randperm(vocab_size, generator=generator)[:top_k] for _ in nodes])
        logq = -torch.randint(0, 4, (len(nodes), top_k), generator=generator).float() / 2  # ties on purpose
        impossible = torch.rand(len(nodes), top_k, generator=generator) < p_impossible
        return tokens, logq.masked_fill(impossible, float("-inf"))

    return expand


def draft_settings(policy: str, nodes: int, depth: int, top_k: int, min_prob: float = 0.0) -> DraftSettings:
    call = DynaSpecGenerationConfig(tree_policy=policy, num_draft_nodes=nodes, draft_depth=depth, draft_top_k=top_k,
                                    min_draft_prob=min_prob)
    return resolve_draft_settings(call, None, NUM_CLUSTERS)


@st.composite
def random_trees(draw: st.DrawFn) -> tuple[VerifyTree, DraftSettings, int]:
    """(tree, settings, max_depth) from grow_tree with a random expand function and a random lookup chain
    (grafted; its tokens often collide with the drafts, as vocabulary 40 is small)."""
    settings_ = draft_settings(
        draw(st.sampled_from(POLICIES)), draw(st.integers(1, 64)), draw(st.integers(1, 8)), draw(st.integers(1, 8)),
        draw(st.sampled_from([0.0, 0.01, 0.2, 0.6])),
    )
    max_depth = draw(st.integers(0, 10))
    expand = random_expand(draw(st.integers(0, 2**31)), 40, settings_.draft_top_k, draw(st.sampled_from([0, 0.3])))
    lookup = draw(st.lists(st.integers(0, 39), max_size=6))
    tree = grow_tree(DraftTree(root_token=draw(st.integers(0, 39))), expand, settings_, max_depth, lookup)
    assert int(tree.grafted.sum()) <= min(len(lookup), max_depth)
    assert lookup_on_a_path(tree, lookup[:max_depth])
    return tree, settings_, max_depth


def lookup_on_a_path(tree: VerifyTree, lookup: list[int]) -> bool:
    """The grafted chain is a root path of the tree."""
    node = 0
    for token in lookup:
        children = [c for c in tree.children[node] if int(tree.tokens[c]) == token]
        if not children:
            return False
        node = children[0]
    return True


@settings(max_examples=300, deadline=None)
@given(drawn=random_trees())
def test_grown_tree_is_well_formed(drawn: tuple[VerifyTree, DraftSettings, int]) -> None:
    """Parents precede children, depths follow parents, the ancestor matrix is exactly the parent closure,
    children lists match parents, and the budget and depth limits hold."""
    tree, settings_, max_depth = drawn
    n = tree.num_nodes
    assert int(tree.parents[0]) == -1 and int(tree.depths[0]) == 0
    drafted = tree.depths[~tree.grafted]
    assert n - int(tree.grafted.sum()) <= settings_.num_draft_nodes + 1
    assert int(drafted.max()) <= min(settings_.draft_depth, max_depth)
    assert int(tree.depths.max()) <= max_depth
    for i in range(1, n):
        parent = int(tree.parents[i])
        assert 0 <= parent < i
        assert int(tree.depths[i]) == int(tree.depths[parent]) + 1
    for i in range(n):
        expected = torch.zeros(n, dtype=torch.bool)
        expected[tree.path_to(i)] = True
        assert torch.equal(tree.ancestor[i], expected)
        assert tree.children[i] == [c for c in range(n) if int(tree.parents[c]) == i]
        siblings = tree.tokens[tree.children[i]].tolist()
        assert len(set(siblings)) == len(siblings)  # lookup drafts merge into equal drafted siblings
    if settings_.tree_policy == "chain":
        assert all(len(c) <= 1 + bool(tree.grafted[c].any()) for c in tree.children)
    if settings_.min_draft_prob > 0:  # no verified draft is less likely than the floor
        assert bool((tree.log_q[1:] >= math.log(settings_.min_draft_prob)).all())


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

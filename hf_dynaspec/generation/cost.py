"""Verification-cost-aware tree size: each step, keep the draft nodes that maximise expected tokens per unit
of target time (`verify_costs` in `DynaSpecGenerationConfig`; off by default).

A target forward over n tokens costs c(n) decoding steps. On GPUs c is flat for small n; on CPUs it rises in
steps (SmolLM2-135M, 2 threads: c(2) = 1.10, c(3) = 1.17, c(4) = 1.42, c(8) = 1.60; `bench_verify.py`), so
a node is worth verifying only if it is accepted often enough to pay for its share of the forward. With a_i
the chance that the walk accepts node i, a step that verifies the root and nodes S emits 1 + sum_{i in S} a_i
tokens on average (the 1: the target's own token after the last accepted one) at cost c(|S| + 1). Ranking
nodes by a_i (a child never ranks above its parent, so every prefix of the ranking is a tree) we keep

    m* = argmax_m  (1 + a_(1) + ... + a_(m)) / c(m + 1)         a_(1) >= a_(2) >= ...   (m = 0: root only)

a_i = a_parent * p_i, where p_i estimates the chance the target picks node i's token once the walk reaches
its parent: min(1, kappa * q_i) for a drafter node (q_i its draft probability given the parent, kappa the
drafter's calibration on this sequence so far: accepted drafts / sum of q over drafts whose parent the walk
reached), and rho for a lookup node (the lookup branch's acceptance rate on this sequence so far). Both are
running estimates with a weak prior (`AcceptanceTracker`), updated after every walk. Verification is
untouched, so output stays exact whatever the estimates.

c comes from `measure_verify_costs` (timed target forwards, memoised per target and setting; with
`verify_costs="auto"` on the first generate() call) or is given as a list c(1), c(2), ... by the user.

    python -c "from hf_dynaspec.generation.cost import VerifyCosts; print(VerifyCosts((1, 1.1, 1.4))(6))"
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..modeling import causal_mask
from .config import DraftSettings, are_positive_costs
from .tree import VerifyTree
from .verify import WALK_ROWS, crop_cache

CALIBRATION_CONTEXT = 128  # cached tokens under the timed forwards (the cost barely moves with context)
CALIBRATION_REPEATS = 3  # median of this many timed forwards per size
MAX_MEASURED = 32  # sizes timed by "auto"; beyond, c grows by its last step
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: costs}


@dataclass(frozen=True)
class VerifyCosts:
    """c(n): the cost of a target forward over n tokens in decoding steps (c(1) = 1 after normalising).
    Beyond the measured sizes c grows by its last step (never shrinks)."""

    costs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not are_positive_costs(self.costs):
            raise ValueError(f"verify_costs must be positive finite numbers c(1), c(2), ..., got {self.costs!r}.")

    def __call__(self, n: int) -> float:
        known = len(self.costs)
        if n <= known:
            return float(self.costs[n - 1])
        slope = max(0.0, self.costs[-1] - self.costs[-2]) if known > 1 else 0.0
        return float(self.costs[-1] + (n - known) * slope)


@dataclass
class AcceptanceTracker:
    """Running estimates of the drafter's calibration kappa and the lookup branch's acceptance rate rho.
    Priors: kappa = 1 (trust the draft probabilities), rho = 1/2, each worth one or two observations."""

    drafted_expected: float = 1.0  # sum of q_i over drafter nodes whose parent the walk accepted (+ prior)
    drafted_accepted: float = 1.0  # how many of them were accepted (+ prior)
    lookup_tested: float = 2.0
    lookup_accepted: float = 1.0

    @property
    def kappa(self) -> float:
        return self.drafted_accepted / self.drafted_expected

    @property
    def rho(self) -> float:
        return self.lookup_accepted / self.lookup_tested

    def update(self, tree: VerifyTree, path: list[int]) -> None:
        """Count the nodes whose parent is on the accepted `path`: each was tested by the target."""
        on_path = set(path)
        q = conditional_draft_probs(tree).tolist()
        parents, grafted = tree.parents.tolist(), tree.grafted.tolist()
        for node in range(1, tree.num_nodes):
            if parents[node] not in on_path:
                continue
            accepted = float(node in on_path)
            if grafted[node]:
                self.lookup_tested += 1.0
                self.lookup_accepted += accepted
            else:
                self.drafted_expected += q[node]
                self.drafted_accepted += accepted


def conditional_draft_probs(tree: VerifyTree) -> torch.Tensor:
    """q_i = q(path to i) / q(path to parent) for every node (n,) (1 at the root and at lookup nodes)."""
    parent_log_q = tree.log_q[tree.parents.clamp(min=0)]  # (n,)
    return torch.exp(tree.log_q - parent_log_q)


def acceptance_estimates(tree: VerifyTree, tracker: AcceptanceTracker) -> list[float]:
    """a_i = a_parent * p_i for every node (a_0 = 1); see the module docstring."""
    q = conditional_draft_probs(tree).tolist()
    grafted = tree.grafted.tolist()
    parents = tree.parents.tolist()
    kappa, rho = tracker.kappa, tracker.rho
    a = [1.0] * tree.num_nodes
    for node in range(1, tree.num_nodes):  # parents precede children
        p = rho if grafted[node] else min(1.0, kappa * q[node])
        a[node] = a[parents[node]] * p
    return a


def trim_to_cost(tree: VerifyTree, costs: VerifyCosts, tracker: AcceptanceTracker) -> VerifyTree:
    """The subtree of the best-ranked m* nodes (module docstring): the most expected tokens per unit of cost."""
    a = acceptance_estimates(tree, tracker)
    depths = tree.depths.tolist()
    ranked = sorted(range(1, tree.num_nodes), key=lambda i: (-a[i], depths[i], i))  # a parent ties first
    best_m, best_rate, expected = 0, 1.0 / costs(1), 1.0
    for m, node in enumerate(ranked, start=1):
        expected += a[node]
        rate = expected / costs(m + 1)  # expected tokens per decoding step of cost
        if rate > best_rate:
            best_m, best_rate = m, rate
    keep = set(ranked[:best_m])
    for node in ranked[:best_m]:  # defensive: ancestors of kept nodes (true by the ranking)
        keep.update(tree.path_to(node)[1:])
    return subtree(tree, sorted(keep | {0}))


def subtree(tree: VerifyTree, keep: Sequence[int]) -> VerifyTree:
    """The nodes `keep` (ascending, root included, closed under ancestors), renumbered in the same order."""
    index = torch.tensor(keep, dtype=torch.long)
    renumber = {old: new for new, old in enumerate(keep)}
    parents = [renumber[int(tree.parents[old])] if old else -1 for old in keep]
    children: list[list[int]] = [[] for _ in keep]
    for old in keep:  # each parent's children stay in their order (best first)
        children[renumber[old]] = [renumber[c] for c in tree.children[old] if c in renumber]
    return VerifyTree(
        tokens=tree.tokens[index],
        parents=torch.tensor(parents, dtype=torch.long),
        depths=tree.depths[index],
        ancestor=tree.ancestor[index][:, index],
        children=children,
        log_q=tree.log_q[index],
        grafted=tree.grafted[index],
    )


@torch.no_grad()
def time_forward(
    target: torch.nn.Module, cache: DynamicCache, context: int, n: int, repeats: int, walk_logits: bool = False
) -> float:
    """Median seconds of a target forward over n new tokens after `context` cached ones, shaped as a
    verification (4D mask, explicit positions, last hidden state; with `walk_logits` logits for the first
    `WALK_ROWS` tokens only, as `verify_forward`). The cache is cropped back after each run."""
    device = target.device
    ids = torch.randint(0, target.config.get_text_config().vocab_size, (1, n), device=device)
    mask = causal_mask(n, context, target.dtype, device)  # (1, 1, n, context + n)
    positions = torch.arange(context, context + n, device=device)[None]
    keep = {"logits_to_keep": torch.arange(min(n, WALK_ROWS), device=device)} if walk_logits else {}
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        target(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
               output_hidden_states=True, **keep)
        _synchronize(device)
        times.append(time.perf_counter() - start)
        crop_cache(cache, context)  # drop the n tokens again
    return statistics.median(times)


def measure_verify_costs(
    target: torch.nn.Module, max_tokens: int = 17, walk_logits: bool | None = None
) -> VerifyCosts:
    """c(1..max_tokens) of `target` as it verifies here (same device, dtype, threads), relative to c(1);
    `walk_logits` as verification computes logits (default: on CPU). Memoised per target and setting: the
    first call costs about 4 * max_tokens forwards. `.costs` is what `verify_costs=[...]` takes."""
    if walk_logits is None:
        walk_logits = target.device.type == "cpu"
    key = (max_tokens, walk_logits, str(target.device), target.dtype, torch.get_num_threads())
    memo = _MEASURED.setdefault(target, {})
    if key not in memo:
        cache = DynamicCache()
        ids = torch.randint(0, target.config.get_text_config().vocab_size, (1, CALIBRATION_CONTEXT))
        with torch.no_grad():
            target(input_ids=ids.to(target.device), cache=cache, use_cache=True)
        time_forward(target, cache, CALIBRATION_CONTEXT, max_tokens, 1, walk_logits)  # warm-up
        seconds = [
            time_forward(target, cache, CALIBRATION_CONTEXT, n, CALIBRATION_REPEATS, walk_logits)
            for n in range(1, max_tokens + 1)
        ]
        # timing noise must not make a bigger forward look cheaper: c is made non-decreasing
        costs = [max(seconds[: n + 1]) / seconds[0] for n in range(len(seconds))]
        memo[key] = VerifyCosts(tuple(costs))
    return memo[key]


def verify_costs_for(settings: DraftSettings, target: torch.nn.Module, walk_logits: bool) -> VerifyCosts | None:
    """The cost model of `settings.verify_costs` ("off": None; "auto": measured here, once per target)."""
    if settings.verify_costs == "off":
        return None
    if settings.verify_costs == "auto":
        largest = 1 + settings.num_draft_nodes + settings.lookup_num_tokens  # root + drafts + lookup branch
        return measure_verify_costs(target, min(largest, MAX_MEASURED), walk_logits)
    return VerifyCosts(settings.verify_costs)  # a tuple: resolve_draft_settings made it one


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)

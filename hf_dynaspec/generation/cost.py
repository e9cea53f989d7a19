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

c comes from `calibration.measure_verify_costs` (timed target forwards, memoised per target and setting;
with `verify_costs="auto"` on the first generate() call) or is given as a list c(1), c(2), ... by the user.

    python -c "from hf_dynaspec.generation.cost import VerifyCosts; print(VerifyCosts((1, 1.1, 1.4))(6))"
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..generation_config import are_positive_costs
from .tree import VerifyTree, close_under_ancestors, subtree


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
        q = conditional_draft_probs(tree)
        parents, grafted = tree.parent_list, tree.grafted_list
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


def conditional_draft_probs(tree: VerifyTree) -> list[float]:
    """q_i = q(path to i) / q(path to parent) for every node (n,) (1 at the root and at lookup nodes), on the
    host."""
    log_q, parents = tree.log_q_list, tree.parent_list
    return [math.exp(log_q[i] - log_q[max(parents[i], 0)]) for i in range(len(log_q))]


def acceptance_estimates(tree: VerifyTree, tracker: AcceptanceTracker) -> list[float]:
    """a_i = a_parent * p_i for every node (a_0 = 1); see the module docstring."""
    q = conditional_draft_probs(tree)
    grafted = tree.grafted_list
    parents = tree.parent_list
    kappa, rho = tracker.kappa, tracker.rho
    a = [1.0] * tree.num_nodes
    for node in range(1, tree.num_nodes):  # parents precede children
        p = rho if grafted[node] else min(1.0, kappa * q[node])
        a[node] = a[parents[node]] * p
    return a


def trim_to_cost(tree: VerifyTree, costs: VerifyCosts, tracker: AcceptanceTracker) -> VerifyTree:
    """The subtree of the best-ranked m* nodes (module docstring): the most expected tokens per unit of cost."""
    a = acceptance_estimates(tree, tracker)
    depths = tree.depth_list
    ranked = sorted(range(1, tree.num_nodes), key=lambda i: (-a[i], depths[i], i))  # a parent ties first
    best_m, best_rate, expected = 0, 1.0 / costs(1), 1.0
    for m, node in enumerate(ranked, start=1):
        expected += a[node]
        rate = expected / costs(m + 1)  # expected tokens per decoding step of cost
        if rate > best_rate:
            best_m, best_rate = m, rate
    keep = close_under_ancestors(tree.parent_list, ranked[:best_m])
    return subtree(tree, [0, *keep])

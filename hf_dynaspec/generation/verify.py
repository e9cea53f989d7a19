"""Exact verification of a draft tree by the target, over the full vocabulary: what one row's walk reads.

The forward itself (a batch of trees in one target pass, the cache's accepted paths) is `verifier.Verifier`.
Here is what each row's walk needs from that pass:
- `NodeLogits`: the target's logits at the tree's nodes. With a `walk_head` (`walk_head.WalkHead`), the pass
  computes logits only for the likeliest walk (`likely_walk`: the root and its chain of best children, r nodes;
  r and the head's weight layout measured on this machine by `calibration.measure_walk_head`: on CPU a few rows
  often cost one, since BLAS streams the head's weights once for them); the same head is applied to any other
  node's final hidden state when the walk reaches it. So a step pays for about one head pass instead of n rows
  (on CPU the head is ~20% of SmolLM2's weights and its cost grows with rows). Plain greedy may take the
  "prefilter" head, which gives each walk row's exact pick without its logits (`prefilter.py`).
- `walk_tree`: from the root, the target picks the next token with the user's logits processors applied to
  its logits at that node (greedy: argmax; sampling: see `_sample_child`), and the walk follows the child
  drafting that token. The last pick is the bonus token. So the output is the target's own choice at every
  position: greedy output equals plain greedy, sampling keeps the target's distribution.

    python -m pytest tests/test_generate.py -q
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import LogitsProcessorList

from .tree import VerifyTree
from .walk_head import WalkHead


@dataclass
class WalkResult:
    """path: verify-tree indices from the root to the last accepted node; new_tokens: the accepted drafts
    then the bonus token (len(path) tokens); scores / logits: processed / raw target logits per new token."""

    path: list[int]
    new_tokens: list[int]
    scores: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


@dataclass
class NodeLogits:
    """Raw target logits at tree nodes, each (1, V) fp32: every row of `full` (n, V) when the verification pass
    computed them all; else precomputed `rows`, the rest made on demand by `head` (the target's output
    embedding, then its logit transform: scaling, soft-capping) from `hidden` (n, d), the final (normed) hidden
    states. `picks`: greedy picks (token ids) known per node, made on demand by `choice` (the "prefilter" head
    makes picks without logits)."""

    hidden: torch.Tensor | None
    head: WalkHead | None
    rows: dict[int, torch.Tensor]

    full: torch.Tensor | None = None  # (n, V) when every row was computed in the verification pass
    picks: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_tensor(cls, logits: torch.Tensor) -> NodeLogits:
        """Every row known: logits (n, V)."""
        return cls(hidden=None, head=None, rows={}, full=logits)

    def argmax_all(self) -> list[int] | None:
        """Every node's argmax, read on the host in one transfer (None when rows are made on demand)."""
        return None if self.full is None else self.full.argmax(dim=-1).tolist()

    def choice(self, node: int) -> int:
        """The target's greedy pick at `node` (argmax of its raw logits)."""
        if node not in self.picks:
            if self.head is not None and self.head.greedy_only:  # picks without logits
                self.picks[node] = int(self.head.argmax(self.hidden[node : node + 1])[0])
            else:
                self.picks[node] = int(self.row(node).argmax())
        return self.picks[node]

    def row(self, node: int) -> torch.Tensor:
        if node not in self.rows:
            if self.full is not None:
                self.rows[node] = self.full[node : node + 1].float()  # (1, V)
            else:
                self.rows[node] = self.head(self.hidden[node : node + 1])  # (1, V)
        return self.rows[node]


def likely_walk(tree: VerifyTree, length: int) -> list[int]:
    """The root and the chain of first children below it (each node's best-scored child), `length` at most."""
    path = [0]
    while len(path) < length and tree.children[path[-1]]:
        path.append(tree.children[path[-1]][0])
    return path


def walk_tree(
    tree: VerifyTree,
    logits: NodeLogits | torch.Tensor,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    keep_scores: bool = False,
) -> WalkResult:
    """Accept the longest root path the target agrees with, plus the target's bonus token.

    logits: raw target logits at the tree nodes (`NodeLogits`, or a tensor (n, V)); input_ids: (1, L + 1) the committed sequence, root last.
    Logits processors see the exact prefix of each position (committed sequence + accepted path), as in
    plain decoding; they run only along the walk (at most depth + 1 times).
    """
    if isinstance(logits, torch.Tensor):
        logits = NodeLogits.from_tensor(logits)
    if not do_sample and not len(logits_processor) and not keep_scores:  # plain greedy: picks, no logits needed
        choices = logits.argmax_all()  # every node's pick in one host read when all rows were computed
        return _greedy_walk(tree, logits.choice if choices is None else choices.__getitem__)
    result = WalkResult(path=[0], new_tokens=[])
    node = 0
    while True:
        path_tokens = torch.tensor([tree.token_list[i] for i in result.path[1:]], dtype=torch.long,
                                   device=input_ids.device)
        prefix = torch.cat([input_ids, path_tokens[None]], dim=-1)  # (1, L + 1 + depth)
        raw = logits.row(node)  # (1, V)
        scores = logits_processor(prefix, raw.clone()) if len(logits_processor) else raw
        if keep_scores:
            result.scores.append(scores)
            result.logits.append(raw)
        children = tree.children[node]
        child_tokens = [tree.token_list[c] for c in children]
        if do_sample:
            token = _sample_child(scores[0], child_tokens)
        else:
            token = int(scores[0].argmax())
        result.new_tokens.append(token)
        if token not in child_tokens:
            return result
        node = children[child_tokens.index(token)]
        result.path.append(node)


def _greedy_walk(tree: VerifyTree, choice: Callable[[int], int]) -> WalkResult:
    """The greedy walk from each node's target argmax `choice(node)`: follow the child drafting it."""
    result = WalkResult(path=[0], new_tokens=[])
    node = 0
    while True:
        token = choice(node)
        result.new_tokens.append(token)
        match = [c for c in tree.children[node] if tree.token_list[c] == token]
        if not match:
            return result
        node = match[0]
        result.path.append(node)


def _sample_child(scores: torch.Tensor, child_tokens: list[int]) -> int:
    """Lossless multi-draft rejection sampling (SpecInfer / Sequoia) for deterministic drafts.

    With target distribution p and children x_1..x_k tried in turn, SpecInfer accepts x_i with probability
    min(1, r(x_i) / q_i(x_i)) and on rejection sets r <- normalise(max(r - q_i, 0)). Our drafts are chosen
    deterministically (the drafter's top-k), so q_i = delta(x_i): accept x_i with probability
    r(x_i) / sum(r), else set r(x_i) = 0; if every child is rejected, sample from r. The result is
    distributed exactly as p: P(x_1) = p(x_1), P(x_2) = (1 - p(x_1)) * p(x_2) / (1 - p(x_1)) = p(x_2), ...
    """
    residual = torch.softmax(scores.float(), dim=-1)  # (V,) unnormalised residual r
    for token in child_tokens:
        mass = residual.sum()
        if float(torch.rand(())) * mass < residual[token]:
            return token
        residual[token] = 0.0
    return int(torch.multinomial(residual, 1))

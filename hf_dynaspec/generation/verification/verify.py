"""Exact verification of a draft tree by the target, over the full vocabulary: what one row's walk reads.

The forward itself (a batch of trees in one target pass, the cache's accepted paths) is `verifier.Verifier`.
Here is what each row's walk needs from that pass:
- `NodeLogits`: the target's logits at the tree's nodes. With a `walk_head` (`walk_head.WalkHead`), the pass
  computes logits only for the likeliest walk (`likely_walk`: the root and its chain of best children, r nodes;
  r and the head's weight layout measured on this machine by `calibration.measure_walk_head`: on CPU a few rows
  often cost one, since BLAS streams the head's weights once for them); the same head is applied to any other
  node's final hidden state when the walk reaches it (`fill_together`: the node and its likely chain below, r
  rows). So a step pays for about one head pass instead of n rows (on CPU the head is ~20% of SmolLM2's weights
  and 63% of Gemma 3 270M's, and its cost grows with rows). Plain greedy may take the "prefilter" head, which
  gives each walk row's exact pick without its logits (`prefilter.py`).
- `walk_steps`: from the root, the target picks the next token with the user's logits processors applied to
  its logits at that node (greedy: argmax; sampling: see `_sample_child`), and the walk follows the child
  drafting that token. The last pick is the bonus token. So the output is the target's own choice at every
  position: greedy output equals plain greedy, sampling keeps the target's distribution. A walk is a generator
  that yields each node it must read and cannot yet; `walk_trees` walks a batch's rows together, so the rows
  that stop at such a node get it from one head application for all of them (B rows cost about one GEMM, not
  B GEMVs one after another); `walk_tree` walks one row.

    python -m pytest tests/test_generate.py -q
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import LogitsProcessorList

from ..drafting.tree import VerifyTree
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

    def known(self, node: int, greedy: bool) -> bool:
        """Whether the walk can read `node` (its logits; `greedy`: its pick) without applying the head."""
        return self.full is not None or node in self.rows or (greedy and node in self.picks)

    def filled(self, nodes: list[int], made) -> None:
        """Keep what the head made (`WalkHead.apply`) of the final hidden states of `nodes`."""
        rows, picks = self.head.split(nodes, made)
        self.rows.update(rows)
        self.picks.update(picks)

    def argmax_all(self) -> list[int] | None:
        """Every node's argmax, read on the host in one transfer (None when rows are made on demand)."""
        return None if self.full is None else self.full.argmax(dim=-1).tolist()

    def choice(self, node: int) -> int:
        """The target's greedy pick at `node`: made by a greedy layout (`filled`), else the argmax of its raw
        logits."""
        if node not in self.picks:
            self.picks[node] = int(self.row(node).argmax())
        return self.picks[node]

    def row(self, node: int) -> torch.Tensor:
        if node not in self.rows:
            if self.full is not None:
                self.rows[node] = self.full[node : node + 1].float()  # (1, V)
            else:
                self.rows[node] = self.head(self.hidden[node : node + 1])  # (1, V)
        return self.rows[node]


def likely_walk(tree: VerifyTree, length: int, start: int = 0) -> list[int]:
    """`start` (the root by default) and the chain of first children below it (each node's best-scored child),
    `length` at most."""
    path = [start]
    while len(path) < length and tree.children[path[-1]]:
        path.append(tree.children[path[-1]][0])
    return path


Walk = Generator[int, None, WalkResult]  # yields the nodes it must read and cannot yet; returns the walk


def walk_tree(
    tree: VerifyTree,
    logits: NodeLogits | torch.Tensor,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    keep_scores: bool = False,
) -> WalkResult:
    """One row's walk (`walk_steps`), its rows made on demand. logits: a `NodeLogits`, or every node's (n, V)."""
    if isinstance(logits, torch.Tensor):
        logits = NodeLogits.from_tensor(logits)
    return walk_trees([tree], [logits], [input_ids], logits_processor, do_sample, keep_scores)[0]


def walk_trees(
    trees: list[VerifyTree],
    logits: list[NodeLogits],
    sequences: list[torch.LongTensor],
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    keep_scores: bool = False,
) -> list[WalkResult]:
    """Every row's walk (`walk_steps`), in rounds: each row walks until it ends or needs a node its
    `NodeLogits` lacks; those nodes are made in one head application for all the rows waiting
    (`fill_together`), and the waiting rows go on, in row order. Sampling draws from the global generator: one
    row draws as it did when rows walked one after another; the rows of a batch interleave their draws, each
    a fresh uniform draw, so each row's distribution is the same (tests/test_batch.py's chi-square)."""
    walks = [walk_steps(t, lg, seq, logits_processor, do_sample, keep_scores)
             for t, lg, seq in zip(trees, logits, sequences)]
    results: list[WalkResult | None] = [None] * len(walks)
    waiting: dict[int, int] = {}
    for b, walk in enumerate(walks):
        _advance(b, walk, None, waiting, results)
    while waiting:
        wanted = {b: likely_walk(trees[b], logits[b].head.rows, start=node) for b, node in waiting.items()}
        fill_together([logits[b] for b in wanted], list(wanted.values()))
        for b in list(wanted):
            _advance(b, walks[b], waiting.pop(b), waiting, results)
    return results


def _advance(b: int, walk: Walk, node: int | None, waiting: dict[int, int], results: list) -> None:
    """Resume row `b`'s walk (first call: start it) until it ends (its result kept) or waits on a node."""
    try:
        waiting[b] = next(walk) if node is None else walk.send(None)
    except StopIteration as done:
        results[b] = done.value


def fill_together(logits: list[NodeLogits], nodes: list[list[int]]) -> None:
    """Make the head's output for `nodes[k]` of row k's `NodeLogits`, for every row in one application of their
    (shared) head to the rows' final hidden states gathered."""
    head = logits[0].head
    gathered = torch.cat([lg.hidden[rows] for lg, rows in zip(logits, nodes)])  # (sum r_k, d)
    made = head.timed(gathered)  # logits (sum r_k, V), or picks in a greedy layout
    start = 0
    for lg, rows in zip(logits, nodes):
        lg.filled(rows, made[start : start + len(rows)])
        start += len(rows)


def walk_steps(
    tree: VerifyTree,
    logits: NodeLogits,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    keep_scores: bool = False,
) -> Walk:
    """Accept the longest root path the target agrees with, plus the target's bonus token.

    logits: raw target logits at the tree nodes; input_ids: (1, L + 1) the committed sequence, root last. Before
    reading a node that `logits` lacks, the walk yields it (the caller makes it known: `fill_together`).
    Logits processors see the exact prefix of each position (committed sequence + accepted path), as in
    plain decoding; they run only along the walk (at most depth + 1 times).
    """
    if not do_sample and not len(logits_processor) and not keep_scores:  # plain greedy: picks, no logits needed
        return (yield from _greedy_walk(tree, logits))
    result = WalkResult(path=[0], new_tokens=[])
    node = 0
    while True:
        path_tokens = torch.tensor([tree.token_list[i] for i in result.path[1:]], dtype=torch.long,
                                   device=input_ids.device)
        prefix = torch.cat([input_ids, path_tokens[None]], dim=-1)  # (1, L + 1 + depth)
        if not logits.known(node, greedy=False):
            yield node
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


def _greedy_walk(tree: VerifyTree, logits: NodeLogits) -> Walk:
    """The greedy walk from each node's target argmax: follow the child drafting it (every node's pick read at
    once when all rows were computed)."""
    choices = logits.argmax_all()
    result = WalkResult(path=[0], new_tokens=[])
    node = 0
    while True:
        if choices is None and not logits.known(node, greedy=True):
            yield node
        token = logits.choice(node) if choices is None else choices[node]
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

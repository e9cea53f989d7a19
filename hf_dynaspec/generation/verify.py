"""Exact verification of a draft tree by the target, over the full vocabulary, in one forward pass.

- `verify_forward`: the target runs once over [root, nodes...] on top of its cache with a 4D tree mask (each
  node sees the committed prefix and its own ancestors; on sliding-window layers only those within the window
  of its own position, `masks.target_masks`) and per-node positions (prefix length + depth).
  With a `walk_head` (`walk_head.WalkHead`), that pass computes logits only for the likeliest walk (the root and
  its chain of best children, r nodes; r and the head's weight layout measured on this machine by
  `calibration.measure_walk_head`: on CPU a few rows often cost one, since BLAS streams the head's weights once
  for them); `NodeLogits` applies the same head to any other node's final hidden state when the walk reaches it. So a step pays for about one head pass instead of n rows (on CPU the head is ~20%
  of SmolLM2's weights and its cost grows with rows). Plain greedy may take the "prefilter" head, which gives
  each walk row's exact pick without its logits (`prefilter.py`).
- `walk_tree`: from the root, the target picks the next token with the user's logits processors applied to
  its logits at that node (greedy: argmax; sampling: see `_sample_child`), and the walk follows the child
  drafting that token. The last pick is the bonus token. So the output is the target's own choice at every
  position: greedy output equals plain greedy, sampling keeps the target's distribution.
- `keep_accepted`: the target cache keeps only the root and the accepted path (gather, no recompute).

    python -m pytest tests/test_generate.py -q
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer
from transformers.generation.logits_process import LogitsProcessorList

from ..masks import target_masks
from ..target_states import hidden_state_request, select_hidden_states
from .tree import VerifyTree
from .walk_head import GREEDY_LAYOUTS, WalkHead


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
            if self.head is not None and self.head.layout in GREEDY_LAYOUTS:  # picks without logits
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


def verify_forward(
    target: torch.nn.Module,
    cache: DynamicCache,
    tree: VerifyTree,
    past_length: int,
    walk_head: WalkHead | None = None,
    feature_layers: list[int] | tuple[int, ...] = (-1,),
) -> tuple[NodeLogits, torch.Tensor]:
    """Target logits at every tree node (all computed, or with a `walk_head` those of `likely_walk` and the
    rest on demand, in its layout) and the drafter's features of every node, root included: the hidden states
    `feature_layers` concatenated (n, k * d)."""
    device = target.device
    n = tree.num_nodes
    rows = likely_walk(tree, walk_head.rows) if walk_head else []
    allowed = torch.cat([torch.ones(n, past_length, dtype=torch.bool), tree.ancestor], dim=1)  # (n, past + n)
    positions = (past_length + tree.depths).to(device)  # (n,) each node at prefix length + depth
    key_positions = torch.cat([torch.arange(past_length, device=device), positions])  # (past + n,)
    mask = target_masks(target.config, allowed.to(device), positions, key_positions, target.dtype)
    out = target(
        input_ids=tree.tokens.to(device)[None],
        attention_mask=mask,  # (1, 1, n, past + n), or one per attention kind
        position_ids=positions[None],
        cache=cache,
        use_cache=True,
        output_hidden_states=hidden_state_request(target.config, feature_layers),
        **({"logits_to_keep": walk_head.logits_to_keep(rows, device)} if walk_head else {}),
    )
    features = select_hidden_states(out.hidden_states, list(feature_layers))[0]  # (n, k * d)
    if walk_head is not None:
        known, picks = walk_head.walk(out, rows)  # each (1, V), or greedy picks ("prefilter")
        return NodeLogits(out.hidden_states[-1][0], walk_head, known, picks=picks), features  # hidden (n, d)
    return NodeLogits.from_tensor(out.logits[0]), features


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


def keep_accepted(cache: DynamicCache, past_length: int, path: list[int]) -> None:
    """Keep cache entries [0, past_length) and the new entries at `path` (indices into the verified nodes).

    The tail is gathered in place: keys[past + j] <- keys[past + path[j]]; safe because path is increasing
    and path[j] >= j, so no entry is overwritten before it is read. Every layer keeps every position (sliding
    layers too: their window is applied by the mask), so rejected nodes never push out a token still in a window.
    """
    index = torch.tensor(path, dtype=torch.long)
    contiguous = path == list(range(len(path)))
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"Tree verification needs a DynamicCache of full-attention layers, got {type(layer).__name__}: "
                "use the default cache (no cache_implementation) with a full-attention target."
            )
        end = past_length + len(path)
        if not contiguous:
            idx = index.to(layer.keys.device) + past_length
            layer.keys[:, :, past_length:end] = layer.keys.index_select(2, idx)
            layer.values[:, :, past_length:end] = layer.values.index_select(2, idx)
        layer.keys = layer.keys[:, :, :end]
        layer.values = layer.values[:, :, :end]


def crop_cache(cache: Cache, length: int) -> None:
    """Drop every entry at or after `length` (explicit slicing: `crop`'s sign convention varies). A static layer
    keeps its tensors (fixed addresses) and moves its write position back, on the device."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(length)
        elif getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]

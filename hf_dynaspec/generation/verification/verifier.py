"""Verification as one object: the target side of tree decoding for a batch of rows.

`Verifier` is built at prefill from the target, its cache, the LM head's layout on the walk (`walk_head_for`),
the logits processors and the sampling mode. Each step:

    walks, features = verifier.verify(trees, sequences)   # one target forward over every row's tree
    verifier.commit([w.path for w in walks])              # each row keeps its accepted path

The LM head's layout is chosen by `calibration.walk_head_for`. `verify` pads the rows' trees to one block of N = max n_b nodes: node tokens (B, N), positions = the row's
length + depth (B, N), and a 4D mask per row (B, 1, N, K + N): a node sees its row's real cached keys
(`cache.KeyLayout`: left padding and earlier steps' holes masked) and its own ancestors; a padding node sees
itself only. On a CPU the LM head is applied along each row's likeliest walk only (`WalkHead`; for a batch, one
head call over every row's walk rows gathered), the rest on demand (`verify.NodeLogits`). The rows are then
walked together (`verify.walk_trees`: the rows a walk reaches past their computed ones are made in one head call for
all the rows waiting), each with its own sequence, so processors and sampling act per row as in plain decoding.
`forward` is the target call alone: calibration times it, so the costs the step policy plans with are those of
this forward (`calibration.time_forward`).

    python -m pytest tests/test_batch.py tests/test_verify.py -q
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import LogitsProcessorList

from ...masks import target_masks
from ...target_states import hidden_state_request, select_hidden_states
from ..drafting.tree import VerifyTree
from .cache import KeyLayout, keep_paths, keep_rows
from .grouped_attention import gqa_configs, grouped_attention
from .head_learner import HeadLearner
from .head_times import HeadTimes, pad_rows
from .verify import NodeLogits, WalkResult, likely_walk, walk_trees
from .walk_head import WalkHead


@dataclass
class Verifier:
    """The target, its cache of the rows still decoding (`keys`: their layout) and how each step is verified."""

    target: torch.nn.Module
    cache: DynamicCache
    keys: KeyLayout
    walk_head: WalkHead | None = None
    feature_layers: tuple[int, ...] = (-1,)
    logits_processor: LogitsProcessorList | None = None
    do_sample: bool = False
    keep_scores: bool = False
    # seconds of the walk head over r gathered rows (`head_times.HeadTimes`): a batch computes every node's logits
    # where that costs no more than its walk rows alone (None: the walk rows)
    head_times: HeadTimes | None = None
    # verify_head="auto": the layout of each step's walk head learned from timed applications (None: `walk_head`
    # throughout); `times_of` gives a batch's head timings for a layout the learner picks (None: no batch timings)
    learner: HeadLearner | None = None
    times_of: Callable[[WalkHead], HeadTimes | None] | None = None
    exploring: bool = False  # the last step applied a layout other than the learner's choice (`use_learned_head`)
    # configs whose attention reads grouped key / value heads in place during the forward (`grouped_attention`)
    attention_configs: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.attention_configs = gqa_configs(self.target)

    @property
    def batch_size(self) -> int:
        return self.keys.lengths.shape[0]

    def forward(self, trees: list[VerifyTree], walk_rows: list[list[int]] | None = None):
        """The target over every row's tree on top of the cache (the new block stays in the cache until `commit`;
        a step of roots alone on a dense cache, a plain step, runs with the target's own masks, as plain decoding
        calls it: no 4D mask over the whole context); `walk_rows`: per row, the nodes whose logits the pass
        computes (one row: through the model's `logits_to_keep` in the "rows" layout; a batch: none, the head is
        applied to the gathered hidden states by `node_logits`). Returns the model output (hidden states of
        `feature_layers` kept)."""
        device = self.target.device
        tokens, depths, ancestor = pad_trees(trees)  # (B, N), (B, N), (B, N, N)
        tokens, depths, ancestor = tokens.to(device), depths.to(device), ancestor.to(device)
        positions = self.keys.lengths[:, None] + depths  # (B, N) each node at its row's length + depth
        batch, n = tokens.shape
        past = self.keys.positions.shape[1]
        masks = {}
        if n > 1 or self.keys.valid is not None:  # else roots alone on a dense cache: plain decoding's own masks
            seen = self.keys.valid_or_all()[:, None, :].expand(batch, n, past)  # (B, N, K)
            allowed = torch.cat([seen, ancestor], dim=2)  # (B, N, K + N)
            key_positions = torch.cat([self.keys.positions, positions], dim=1)  # (B, K + N)
            masks = {"attention_mask": target_masks(self.target.config, allowed, positions, key_positions,
                                                    self.target.dtype)}
        keep = {}
        if self.walk_head is not None:
            rows = walk_rows[0] if walk_rows is not None and batch == 1 else []
            keep = {"logits_to_keep": self.walk_head.logits_to_keep(rows, device)}
        with grouped_attention(self.attention_configs):
            return self.target(
                input_ids=tokens, position_ids=positions, cache=self.cache, use_cache=True, **masks,
                output_hidden_states=hidden_state_request(self.target.config, list(self.feature_layers)), **keep,
            )

    def node_logits(self, out, trees: list[VerifyTree], walk_rows: list[list[int]]) -> list[NodeLogits]:
        """Each row's `NodeLogits` from the forward's output."""
        if self.walk_head is None:
            return [NodeLogits.from_tensor(out.logits[b, : t.num_nodes]) for b, t in enumerate(trees)]
        hidden = out.hidden_states[-1]  # (B, N, d) final, normed
        if len(trees) == 1:
            known, picks = self.walk_head.walk(out, walk_rows[0])
            return [NodeLogits(hidden[0], self.walk_head, known, picks=picks)]
        gathered = torch.cat([hidden[b, rows] for b, rows in enumerate(walk_rows)])  # (R, d), R = sum r_b
        if self.head_times is not None:  # at the row count timed cheapest (zero rows added, then dropped)
            size = self.head_times.padded(gathered.shape[0])
            made = self.walk_head.timed(pad_rows(gathered, size))[: gathered.shape[0]]  # logits (R, V)
        else:
            made = self.walk_head.timed(gathered)  # logits (R, V), or picks (R ids) in a greedy layout
        result, start = [], 0
        for b, rows in enumerate(walk_rows):
            known, picks = self.walk_head.split(rows, made[start : start + len(rows)])
            start += len(rows)
            result.append(NodeLogits(hidden[b], self.walk_head, known, picks=picks))
        return result

    def walk_rows(self, trees: list[VerifyTree]) -> list[list[int]]:
        """Per row, the nodes whose logits the pass computes at once: its likeliest walk (`verify.likely_walk`),
        or, for a batch whose head application over every node costs no more than over those walks
        (`head_times`), every node (no row is then made on demand); none without a walk head (every node's)."""
        if self.walk_head is None:
            return [[] for _ in trees]
        walks = [likely_walk(t, self.walk_head.rows) for t in trees]
        if self.head_times is not None and len(trees) > 1:
            every = sum(t.num_nodes for t in trees)
            if self.head_times(every) <= self.head_times(sum(len(w) for w in walks)):
                return [list(range(t.num_nodes)) for t in trees]
        return walks

    def verify(self, trees: list[VerifyTree], sequences: list[torch.LongTensor]
               ) -> tuple[list[WalkResult], list[torch.Tensor]]:
        """One forward over every row's tree, then each row's walk with its committed sequence (1, L + 1) (root
        last, left padding included: what its processors see). Returns the walks and each row's drafter features
        at its tree's nodes (n_b, k * d)."""
        if self.learner is not None:
            self.use_learned_head(trees)
        walk_rows = self.walk_rows(trees)
        out = self.forward(trees, walk_rows)
        logits = self.node_logits(out, trees, walk_rows)
        features = select_hidden_states(out.hidden_states, list(self.feature_layers))  # (B, N, k * d)
        processors = self.logits_processor if self.logits_processor is not None else LogitsProcessorList()
        walks = walk_trees(trees, logits, sequences, processors, self.do_sample, self.keep_scores)
        if self.learner is not None:
            self.learner.close()  # every head application of this step's walks timed
        return walks, [features[b, : t.num_nodes] for b, t in enumerate(trees)]

    def use_learned_head(self, trees: list[VerifyTree]) -> None:
        """The learner's head for this step's walk rows (every row's likeliest walk, `learner.rows` each, gathered):
        exploring a layout, re-checking one, or its choice (`head_learner.HeadLearner.next_layout`)."""
        rows = sum(len(likely_walk(t, self.learner.rows)) for t in trees)
        head, self.exploring = self.learner.pick(rows)
        if head is not self.walk_head:
            self.walk_head = head
            self.head_times = self.times_of(head) if self.times_of is not None else None

    def commit(self, paths: list[list[int]]) -> None:
        """Each row keeps its accepted path of the last verified block (`cache.keep_paths`)."""
        past = self.keys.positions.shape[1]
        self.keys = self.keys.appended(keep_paths(self.cache, past, paths))

    def keep_rows(self, index: list[int]) -> None:
        """Keep only the rows at `index` (positions in the current batch) in the cache."""
        rows = torch.tensor(index, dtype=torch.long, device=self.keys.lengths.device)
        keep_rows(self.cache, rows)
        self.keys = self.keys.rows(rows)


def pad_trees(trees: list[VerifyTree]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows' trees as one block of N = max n_b nodes: tokens (B, N) (padding: the row's root token), depths (B, N)
    (padding: 0), ancestor (B, N, N) (a padding node is its own only ancestor, so its attention row is never
    empty; no real node sees it)."""
    n = max(t.num_nodes for t in trees)
    if len(trees) == 1:
        t = trees[0]
        return t.tokens[None], t.depths[None], t.ancestor[None]
    tokens = torch.stack([torch.nn.functional.pad(t.tokens, (0, n - t.num_nodes), value=t.token_list[0])
                          for t in trees])
    depths = torch.stack([torch.nn.functional.pad(t.depths, (0, n - t.num_nodes)) for t in trees])
    ancestor = torch.eye(n, dtype=torch.bool).repeat(len(trees), 1, 1)
    for b, t in enumerate(trees):
        ancestor[b, : t.num_nodes, : t.num_nodes] = t.ancestor
    return tokens, depths, ancestor


def verify_forward(
    target: torch.nn.Module,
    cache: DynamicCache,
    tree: VerifyTree,
    past_length: int,
    walk_head: WalkHead | None = None,
    feature_layers: list[int] | tuple[int, ...] = (-1,),
) -> tuple[NodeLogits, torch.Tensor]:
    """One sequence's verification forward (a `Verifier` of one dense row): the target logits at every node of
    `tree` and its drafter features (n, k * d)."""
    verifier = Verifier(target, cache, KeyLayout.dense(1, past_length, target.device), walk_head,
                        tuple(feature_layers))
    walk_rows = verifier.walk_rows([tree])
    out = verifier.forward([tree], walk_rows)
    features = select_hidden_states(out.hidden_states, list(feature_layers))[0]  # (n, k * d)
    return verifier.node_logits(out, [tree], walk_rows)[0], features

"""Drafting the trees of several rows at once: one drafter forward per draft depth for every drafting row.

Drafting a batch row after row costs R times one row's drafting, and on a CPU (as on a GPU at these sizes) a
drafter call costs mostly per call, not per node. Here the rows' trees grow in lockstep (`tree.grow_together`):
each round, every row still growing hands its frontier, and one drafter forward runs all of them, padded to
(R, F) with per-row positions and 4D masks over a cache stacked from the rows' own caches, (R, H, K, D) with
K = max_r K_r, each row right-padded (its padding never attended to):

    row r, frontier node i:   keys j < K_r (its committed positions), its drafted ancestors' columns, itself
    padding queries:          themselves only (their outputs are dropped)

The head then runs once on every real node of the round (the union of their shortlists). Draft entries live in
the stacked cache only and are dropped with it: each row's own cache keeps its committed positions alone, as
between steps. Reading the accepted paths before drafting (`catch_up_together`) is one forward the same way:
each row's new pairs (h_i, x_(i+1)), causal over its own positions, their entries then appended to its own cache
and its root proposal taken from its last one. The drafts are those each row would draft alone, up to floating-point summation order (and
verification never trusts a draft: output stays exact).

Where it applies (`drafts_together`): trees grown on the host, a drafter cache that grows (no draft-step
graphs), a head without per-row context columns (not "context" / "union"). Elsewhere rows draft one by one.

    python -m pytest tests/test_lockstep.py -q
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ...generation_config import DraftSettings
from ...head import HeadOutput
from ...head_modes import head_named
from ...masks import additive_mask
from ..verification.cache import crop_cache
from .candidates import DynaSpecCandidateGenerator, RootProposal
from .tree import Proposals, TreePool, VerifyTree, grow_together, growing, new_pool


def drafts_together(settings: DraftSettings) -> bool:
    """Whether rows with these settings draft in lockstep (module docstring)."""
    return (settings.tree_growth == "host" and settings.draft_graphs != "on"
            and not head_named(settings.head_mode).reads_context)


def draft_together(generators: Sequence[DynaSpecCandidateGenerator], committed: Sequence[list[int]],
                   max_depths: Sequence[int], depths: Sequence[int]) -> list[VerifyTree]:
    """Each row's tree, as `generator.draft(..., max_depth=max_depths[r], committed=committed[r], depth=depths[r])`
    would draft it, grown together: one drafter forward per round for every row. committed[r]: row r's sequence
    on the host, root last. The generators read their pending accepted paths first (`catch_up_together`)."""
    catch_up_together(generators)
    lengths = [generator.committed for generator in generators]
    pools = [new_pool(tokens[-1], generator.settings) for tokens, generator in zip(committed, generators)]
    growths = [growing(pool, generator.root.children, generator.settings, max_depth, generator.lookup(tokens), depth)
               for pool, generator, tokens, max_depth, depth in zip(pools, generators, committed, max_depths, depths)]
    expand = LockstepExpand(generators, pools, stack_caches([g.cache for g in generators], lengths), lengths)
    return grow_together(growths, expand)


def catch_up_together(generators: Sequence[DynaSpecCandidateGenerator]) -> None:
    """Every generator reads its pending accepted paths (as `generator.catch_up()`), in one drafter forward."""
    waiting = [g for g in generators if g.pending]
    if len(waiting) < 2:
        for generator in waiting:
            generator.catch_up()
        return
    lead = waiting[0]
    parts = [generator.take_pending() for generator in waiting]  # (features (T_r, k d), tokens (T_r,)) each
    lengths, news = [g.committed for g in waiting], [len(tokens) for _, tokens in parts]
    width, past = max(news), max(lengths)
    features = parts[0][0].new_zeros(len(waiting), width, parts[0][0].shape[-1])  # (R, T, k d)
    tokens, positions = [[0] * width for _ in waiting], [[0] * width for _ in waiting]
    allowed = torch.zeros(len(waiting), width, past + width, dtype=torch.bool)
    for row, ((row_features, row_tokens), length, new) in enumerate(zip(parts, lengths, news)):
        features[row, :new] = row_features
        tokens[row][:new] = row_tokens
        positions[row][:new] = range(length, length + new)
        allowed[row, :, :length] = True  # its committed positions; then causal over its own new ones
        allowed[row, :, past:] = torch.ones(width, width, dtype=torch.bool).tril()
    cache = stack_caches([g.cache for g in waiting], lengths)
    out = lead.drafter(input_ids=torch.tensor(tokens, device=lead.device), hidden_states=lead.drafter.project(features),
                       position_ids=torch.tensor(positions, device=lead.device),
                       attention_mask=additive_mask(allowed.to(lead.device), lead.drafter.dtype), cache=cache,
                       head_mode=None)
    last = [new - 1 for new in news]
    depth0 = lead.drafter.config.clusters_at_depth(0, lead.settings.draft_depth, lead.settings.shortlist_k0,
                                                   lead.settings.shortlist_k1)
    rows = list(range(len(waiting)))
    head, (children, log_q) = lead.head_children(out.hidden_states[rows, last], out.router_logits[rows, last],
                                                 [depth0] * len(waiting))  # (R, k) each
    for row, (generator, length, new) in enumerate(zip(waiting, lengths, news)):
        crop_cache(generator.cache, length)
        for index, stacked in enumerate(cache.layers):  # the row's new entries appended to its own cache
            generator.cache.update(stacked.keys[row : row + 1, :, past : past + new],
                                   stacked.values[row : row + 1, :, past : past + new], index)
        generator.committed = length + new
        ids = head.token_ids if head.token_ids.dim() == 1 else head.token_ids[row : row + 1]
        row_head = HeadOutput(ids, head.logits[row : row + 1], head.shortlist_sizes[row : row + 1])
        generator.stats.add_shortlist(row_head.shortlist_sizes)
        generator.root = RootProposal(out.next_hidden_states[row, last[row]], row_head,
                                      (children[row : row + 1], log_q[row : row + 1]))


def stack_caches(caches: Sequence[DynamicCache], lengths: Sequence[int]) -> DynamicCache:
    """One cache (R, H, K, D) per layer from R one-row caches, row r's first lengths[r] entries at its front and
    zeros after them (K = max lengths; a row that has read nothing has no layers yet: all zeros)."""
    stacked = DynamicCache()
    width = max(lengths)
    if width == 0:
        return stacked
    template = next(cache for cache, length in zip(caches, lengths) if length > 0)
    for index, like in enumerate(template.layers):
        keys = like.keys.new_zeros(len(caches), like.keys.shape[1], width, like.keys.shape[3])
        values = like.values.new_zeros(len(caches), like.values.shape[1], width, like.values.shape[3])
        for row, (cache, length) in enumerate(zip(caches, lengths)):
            if length > 0:
                keys[row, :, :length] = cache.layers[index].keys[0, :, :length]
                values[row, :, :length] = cache.layers[index].values[0, :, :length]
        stacked.update(keys, values, index)
    return stacked


class LockstepExpand:
    """The drafter's side of `grow_together` for R rows sharing a stacked cache: `self({row: nodes})` runs one
    drafter forward over every row's frontier and returns each row's proposals (F_r, k) each. Node features
    (what their children read) and cache columns are kept per row; round t's nodes take columns
    K + F_1 + ... + F_(t-1) + i of the stacked cache."""

    def __init__(self, generators: Sequence[DynaSpecCandidateGenerator], pools: Sequence[TreePool],
                 cache: DynamicCache, lengths: Sequence[int]) -> None:
        self.generators, self.pools, self.cache, self.lengths = generators, pools, cache, list(lengths)
        self.features = [{0: generator.root.feature} for generator in generators]  # per row: node -> (d,)
        self.slots: list[dict[int, int]] = [{} for _ in generators]  # per row: node -> stacked-cache column
        self.columns = max(lengths)  # columns of the stacked cache in use

    def __call__(self, frontiers: dict[int, list[int]]) -> dict[int, Proposals]:
        lead = self.generators[0]
        drafter, settings = lead.drafter, lead.settings
        width = max(len(nodes) for nodes in frontiers.values())
        tokens, parents, positions, mask = self._inputs(frontiers, width)
        out = drafter(input_ids=tokens, hidden_states=parents, position_ids=positions, attention_mask=mask,
                      cache=self.cache, head_mode=None)
        rows = [row for row in frontiers for _ in frontiers[row]]  # every real query, row-major
        places = [i for row in frontiers for i in range(len(frontiers[row]))]
        for row, i in zip(rows, places):
            node = frontiers[row][i]
            self.slots[row][node] = self.columns + i
            self.features[row][node] = out.next_hidden_states[row, i]
        self.columns += width
        budget = [drafter.config.clusters_at_depth(self.pools[row].host.depths[frontiers[row][i]], settings.draft_depth,
                                                   settings.shortlist_k0, settings.shortlist_k1)
                  for row, i in zip(rows, places)]
        head, (children, log_q) = lead.head_children(out.hidden_states[rows, places],
                                                     out.router_logits[rows, places], budget)  # (N, k) each
        proposals, start = {}, 0
        for row, nodes in frontiers.items():
            end = start + len(nodes)
            self.generators[row].stats.add_shortlist(head.shortlist_sizes[start:end])
            proposals[row] = (children[start:end], log_q[start:end])
            start = end
        return proposals

    def _inputs(self, frontiers: dict[int, list[int]], width: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (R, F), parent features (R, F, d), positions (R, F) and the additive mask (R, 1, F, columns + F)
        of one round; rows without a frontier and the places past a row's frontier are padding."""
        device, dtype = self.generators[0].device, self.generators[0].drafter.dtype
        count = len(self.generators)
        token_ids = [[0] * width for _ in range(count)]
        position_ids = [[0] * width for _ in range(count)]
        parents = self.generators[0].root.feature.new_zeros(count, width, self.generators[0].root.feature.shape[-1])
        allowed = torch.zeros(count, width, self.columns + width, dtype=torch.bool)
        allowed[:, torch.arange(width), self.columns + torch.arange(width)] = True  # every query: itself
        for row, nodes in frontiers.items():
            pool, host, slots = self.pools[row], self.pools[row].host, self.slots[row]
            allowed[row, : len(nodes), : self.lengths[row]] = True  # the row's committed positions
            for i, node in enumerate(nodes):
                token_ids[row][i] = host.tokens[node]
                position_ids[row][i] = self.lengths[row] - 1 + host.depths[node]
                parents[row, i] = self.features[row][host.parents[node]]
                for ancestor in pool.ancestors(node):
                    allowed[row, i, slots[ancestor]] = True
        return (torch.tensor(token_ids, device=device), parents, torch.tensor(position_ids, device=device),
                additive_mask(allowed.to(device), dtype))

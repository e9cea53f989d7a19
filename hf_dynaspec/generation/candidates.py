"""DynaSpecCandidateGenerator: drafts a dynamic token tree with the shortlisted drafter.

Follows transformers' candidate-generator interface (`get_candidates`, `update_candidate_strategy`,
`requires_model_outputs`), with a tree instead of a chain: `get_candidates` returns the committed sequence
followed by the tree's nodes in verification order, and leaves the tree itself in `self.tree`.

The drafter's KV cache is kept across steps. Invariant between steps: the drafter cache holds one entry per
committed position i < L, made from the pair (target hidden state h_i, token x_{i+1}); its last output is the
drafter's estimate of h_L, the root's feature, and its head gives the root's children. Tree nodes are
appended during drafting and cropped away afterwards; `extend` then feeds the newly accepted pairs.

    python -m pytest tests/test_generate.py -q -k oracle
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache
from transformers.generation.candidate_generator import CandidateGenerator

from ..modeling import DynaSpecDrafter, additive_mask, causal_mask
from .config import DraftSettings
from .cost import AcceptanceTracker, VerifyCosts, trim_to_cost
from .lookup import find_continuation
from .stats import SpeculativeStats
from .tree import DraftTree, VerifyTree, grow_tree
from .verify import crop_cache


class DynaSpecCandidateGenerator(CandidateGenerator):
    """Tree drafting with a bound `DynaSpecDrafter`."""

    requires_model_outputs = True

    def __init__(self, drafter: DynaSpecDrafter, settings: DraftSettings, stats: SpeculativeStats) -> None:
        self.drafter = drafter
        self.settings = settings
        self.stats = stats
        self.cache = DynamicCache()
        self.committed = 0
        self.tree: VerifyTree | None = None
        self._root_feature: torch.Tensor | None = None  # (d,)
        self._root_children: tuple[torch.Tensor, torch.Tensor] | None = None  # (1, k), (1, k)
        self._root_shortlist: torch.Tensor | None = None  # (S,) token ids the root's children were drawn from
        self._pool: DraftTree | None = None
        self._features: dict[int, torch.Tensor] = {}  # pool node -> drafter output feature (d,)
        self._slots: dict[int, int] = {}  # pool node -> drafter cache index
        self.costs: VerifyCosts | None = None  # set: trim each tree to what its verification cost pays for
        self.acceptance = AcceptanceTracker()

    # ------------------------------------------------------------------ committed sequence
    @torch.no_grad()
    def extend(self, hidden_states: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Feed accepted pairs (h_i, x_{i+1}): hidden_states (T, d), next_tokens (T,)."""
        crop_cache(self.cache, self.committed)
        length = next_tokens.numel()
        positions = torch.arange(self.committed, self.committed + length, device=hidden_states.device)
        mask = causal_mask(length, self.committed, hidden_states.dtype, hidden_states.device)
        out = self.drafter(
            input_ids=next_tokens[None],
            hidden_states=hidden_states[None].to(self.drafter.dtype),
            position_ids=positions[None],
            attention_mask=mask,
            cache=self.cache,
            head_mode=None,
        )
        self.committed += length
        self._root_feature = out.hidden_states[0, -1]
        self._root_children = self._propose(out.hidden_states[0, -1:], out.router_logits[0, -1:], [0])

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, max_depth: int | None = None, **kwargs):
        """Draft a tree rooted at input_ids[0, -1]; returns (committed ids + tree nodes, None)."""
        start, router_start = time.perf_counter(), self.drafter.router.seconds
        # depth limit for drafts and the lookup branch: decoding passes tokens left to generate - 1
        settings = self.settings
        limit = max(settings.draft_depth, settings.lookup_num_tokens) if max_depth is None else max_depth
        self._pool = DraftTree(root_token=int(input_ids[0, -1]))
        self._features, self._slots = {0: self._root_feature}, {}
        self.tree = grow_tree(self._pool, self.expand, settings, limit, self._lookup(input_ids[0]))
        if self.costs is not None:
            self.tree = trim_to_cost(self.tree, self.costs, self.acceptance)
        crop_cache(self.cache, self.committed)
        self.stats.draft_time += time.perf_counter() - start
        self.stats.router_time += self.drafter.router.seconds - router_start
        nodes = self.tree.tokens[1:].to(input_ids.device)[None]
        return torch.cat([input_ids, nodes], dim=-1), None

    def _lookup(self, input_ids: torch.Tensor) -> list[int]:
        """The lookup branch for the committed sequence (L,), root last ([] when off or no n-gram recurs)."""
        settings = self.settings
        if settings.lookup_num_tokens == 0:
            return []
        return find_continuation(
            input_ids, settings.lookup_max_ngram, settings.lookup_min_ngram, settings.lookup_num_tokens
        )

    def note_walk(self, path: list[int], new_tokens: list[int]) -> None:
        """After verification: shortlist recall (was the target's token after the root in the root's
        shortlist?), how many accepted drafts came from the lookup branch, and (when trimming to cost) the
        acceptance estimates."""
        if self._root_shortlist is not None:
            self.stats.add_recall(bool((self._root_shortlist == new_tokens[0]).any()))
        self.stats.lookup_tokens += int(self.tree.grafted[path].sum())
        if self.costs is not None:
            self.acceptance.update(self.tree, path)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores, num_matches: int) -> None:
        """The tree adapts itself each step; nothing to update."""

    def expand(self, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k children of each pool node: tokens (F, k), log q (F, k)."""
        if nodes == [0]:
            return self._root_children
        pool = self._pool
        device = self._root_feature.device
        tokens = torch.tensor([pool.tokens[n] for n in nodes], device=device)  # (F,)
        parents = torch.stack([self._features[pool.parents[n]] for n in nodes])  # (F, d)
        depths = [pool.depths[n] for n in nodes]
        positions = torch.tensor([self.committed - 1 + d for d in depths], device=device)  # (F,)
        mask = self._tree_mask(nodes, device)
        out = self.drafter(
            input_ids=tokens[None],
            hidden_states=parents[None],
            position_ids=positions[None],
            attention_mask=mask,
            cache=self.cache,
            head_mode=None,
        )
        first_slot = self.committed + len(self._slots)
        for i, node in enumerate(nodes):
            self._slots[node] = first_slot + i
            self._features[node] = out.hidden_states[0, i]
        return self._propose(out.hidden_states[0], out.router_logits[0], depths)

    def _tree_mask(self, nodes: list[int], device: torch.device) -> torch.Tensor:
        """(1, 1, F, cache + F): committed prefix, the node's drafted ancestors, itself."""
        known = len(self._slots)
        allowed = torch.zeros(len(nodes), self.committed + known + len(nodes), dtype=torch.bool)
        allowed[:, : self.committed] = True
        for i, node in enumerate(nodes):
            for ancestor in self._pool.ancestors(node):
                allowed[i, self._slots[ancestor]] = True
            allowed[i, self.committed + known + i] = True
        return additive_mask(allowed.to(device), self._root_feature.dtype)

    def _propose(
        self, features: torch.Tensor, router_logits: torch.Tensor, depths: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shortlisted head on features (F, d) of nodes at `depths` -> top-k (tokens, log q), each (F, k).

        The children of a node at depth t are draft position t, whose cluster budget is k_c(t)."""
        settings, config = self.settings, self.drafter.config
        budget = torch.tensor(
            [
                config.clusters_at_depth(d, settings.draft_depth, settings.shortlist_k0, settings.shortlist_k1)
                for d in depths
            ],
            device=features.device,
        )
        start = time.perf_counter()
        head = self.drafter.bound_head.logits(features, settings.head_mode, router_logits, budget)
        self.stats.head_time += time.perf_counter() - start
        self.stats.add_shortlist(head.shortlist_sizes)
        if depths == [0]:
            self._root_shortlist = head.token_ids[torch.isfinite(head.logits[0])]
        logq = torch.log_softmax(head.logits, dim=-1)  # (F, S), -inf outside each shortlist
        top = logq.topk(min(settings.draft_top_k, logq.shape[-1]), dim=-1)
        return head.token_ids[top.indices], top.values

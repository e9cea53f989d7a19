"""DynaSpecCandidateGenerator: the drafter's side of speculative decoding, behind two interfaces.

1. **transformers' `CandidateGenerator` contract** (a chain of drafts), so transformers' own
   `_assisted_decoding` loop can drive it, as it drives its MTP and DFlash generators:
   `requires_model_outputs = True` and `model_kwargs_overrides` make the loop return the target's hidden
   states; `get_candidates(input_ids, model_outputs=..., is_first_iteration=...)` feeds the newly verified
   positions to the drafter and returns `(committed ids + k chained drafts (1, L + k), draft logits (1, k, V))`
   (-inf outside each position's shortlist); `update_candidate_strategy(input_ids, scores, num_matches)`
   records the step. On the first call the target has not run yet: no drafts (its prefill supplies the
   hidden states). With `do_sample` the chain is sampled from the drafter's distribution, so transformers'
   speculative sampling stays lossless; greedy drafts are its argmax.
2. **Tree drafting**, DynaSpec's own loop (`decoding.py`), everything passed in and returned:
   `extend(hidden_states, next_tokens)` reads newly committed positions; `catch_up()` reads the accepted
   paths not read yet; `root_probs()` gives the root's draft probabilities (what the step policy plans with);
   `draft(input_ids, max_depth, depth=) -> VerifyTree` drafts a tree rooted at the last committed token;
   `accept(tree, walk, hidden_states)` records the step and keeps the accepted path for the next catch-up.

The drafter's KV cache is kept across steps. Invariant between steps: the drafter cache holds one entry per
committed position i < L, made from the pair (target hidden state h_i, token x_{i+1}); its last output is the
drafter's estimate of h_L, the root's feature, whose head gives the root's proposals (`RootProposal`). Drafts
are appended to the cache while drafting and cropped away afterwards.

    python -m pytest tests/test_candidates.py -q
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.cache_utils import Cache, StaticLayer
from transformers.generation.candidate_generator import CandidateGenerator

from ...generation_config import DraftSettings, resolve_draft_settings
from ...head import ContextColumns, HeadOutput
from ...head_modes import head_named
from ...masks import additive_mask, causal_mask
from ..loop.stats import SpeculativeStats
from ..verification.cache import crop_cache
from ..verification.verify import WalkResult
from . import graphs as step_graphs
from .lookup import find_continuation
from .tree import (
    Expand,
    Proposals,
    TreePool,
    VerifyTree,
    depth_limits,
    drive,
    grow_tree,
    growing,
    growth_capacity,
    new_pool,
    pool_capacity,
)

if TYPE_CHECKING:
    from ...modeling import DynaSpecDrafter


@dataclass
class RootProposal:
    """What the drafter proposes after the last committed token: its feature (d,) (what the root's children
    read: the drafter's estimate of the root's state), the shortlisted head there (1 row) and the top-k children (tokens, log q), each (1, k)."""

    feature: torch.Tensor
    head: HeadOutput
    children: Proposals

    def in_shortlist(self, token: int) -> torch.Tensor:
        """0-dim bool on the device (not read: `SpeculativeStats.add_recall` sums it where it is)."""
        return ((self.head.token_ids == token) & torch.isfinite(self.head.logits[0])).any()


class DynaSpecCandidateGenerator(CandidateGenerator):
    """Drafting with a bound `DynaSpecDrafter`; see the module docstring for both interfaces."""

    requires_model_outputs = True
    model_kwargs_overrides: dict[str, Any] = {"output_hidden_states": True}

    def __init__(
        self,
        drafter: DynaSpecDrafter,
        settings: DraftSettings,
        stats: SpeculativeStats | None = None,
        do_sample: bool = False,
        max_length: int | None = None,
    ) -> None:
        """drafter: bound to its target; do_sample / max_length: the chain interface's sampling and length
        limit."""
        drafter.bound_head  # noqa: B018  (raises when the drafter is not bound)
        self.drafter = drafter
        self.settings = settings
        self.stats = stats if stats is not None else SpeculativeStats()
        self.do_sample = do_sample
        self.max_length = max_length
        # draft steps as captured graphs (`graphs`): they need a drafter cache of fixed size and address
        self.graphs = step_graphs.StepGraphs(step_graphs.backend_for(self.device)) \
            if settings.draft_graphs == "on" else None
        self.cache = DynamicCache() if self.graphs is None else self._static_cache(settings, max_length)
        self.committed = 0
        # "context" / "union" heads: the tokens read so far (every committed token after the first)
        self.context_tokens: set[int] = set()
        self.context: ContextColumns | None = None  # the head's columns for them, refreshed by each `extend`
        self.root: RootProposal | None = None
        self.pending: list[tuple[torch.Tensor, list[int]]] = []  # accepted (features, tokens) not read yet
        self._chain_length: int | None = None  # drafts of the last `get_candidates` (None: nothing drafted)

    @classmethod
    def for_generate(
        cls, target: torch.nn.Module, drafter: DynaSpecDrafter, generation_config: GenerationConfig
    ) -> DynaSpecCandidateGenerator:
        """A generator for transformers' assisted loop: settings resolved as `generate()` resolves them, drafter
        bound to `target`."""
        settings = resolve_draft_settings(generation_config, drafter.generation_config, drafter.config,
                                          target.device.type)
        drafter.bind(target)
        stats = SpeculativeStats(synchronize=settings.synchronize_timers)
        return cls(drafter, settings, stats, bool(generation_config.do_sample), generation_config.max_length)

    @property
    def num_drafting_tokens(self) -> int:
        """The most drafts one `get_candidates` returns (the chain's depth). transformers >= 5.25 reads it before
        its assisted loop, to size the recurrent states a hybrid target's cache keeps for rolling back."""
        return self.settings.draft_depth

    @property
    def feature_layers(self) -> list[int]:
        """The target hidden states the drafter reads (`verify_forward` returns them for `accept`)."""
        return self.drafter.config.feature_layer_ids

    @property
    def device(self) -> torch.device:
        return self.drafter.fc.weight.device

    @staticmethod
    def _static_cache(settings: DraftSettings, max_length: int | None) -> Cache:
        """A drafter cache of fixed size: every committed position (`max_length`) plus one tree's expansions."""
        if max_length is None:
            raise ValueError("Draft-step graphs need the generation's max_length to size the drafter cache.")
        return Cache(layers=[StaticLayer(max_length + growth_capacity(settings))])

    def _static_layer(self) -> StaticLayer | None:
        """The drafter cache's layer when the cache is static (draft-step graphs), else None."""
        layer = self.cache.layers[0] if self.cache.layers else None
        return layer if isinstance(layer, StaticLayer) else None

    def _fit(self, mask: torch.Tensor) -> torch.Tensor:
        """A 4D mask (1, 1, T, K) over the drafter cache as it is used, widened to the static cache's size (the
        columns past K masked) when the cache is static."""
        layer = self._static_layer()
        if layer is None:
            return mask
        if mask.shape[-1] > layer.max_cache_len:
            raise ValueError(f"The drafter cache holds {layer.max_cache_len} positions; this call needs "
                             f"{mask.shape[-1]}: raise max_length or set draft_graphs='off'.")
        return torch.nn.functional.pad(mask, (0, layer.max_cache_len - mask.shape[-1]),
                                       value=torch.finfo(mask.dtype).min)

    # ------------------------------------------------------------------ committed sequence
    @torch.no_grad()
    def extend(
        self, target_features: torch.Tensor, next_tokens: torch.Tensor, token_list: list[int] | None = None
    ) -> None:
        """Feed newly committed pairs (h_i, x_{i+1}): target_features (T, k * d) (`drafter.target_features`),
        next_tokens (T,); `token_list`: the same tokens on the host, where the caller has them (the "context" and
        "union" heads read them; else they are read from next_tokens)."""
        with self.stats.timer("extend", self.device):
            crop_cache(self.cache, self.committed)
            if head_named(self.settings.head_mode).reads_context:
                self.context_tokens.update(next_tokens.tolist() if token_list is None else token_list)
                self.context = self.drafter.bound_head.context_columns(self.context_tokens, self.settings.head_mode,
                                                                       self.settings.static_size)
            length = next_tokens.numel()
            positions = torch.arange(self.committed, self.committed + length, device=target_features.device)
            out = self.drafter(
                input_ids=next_tokens[None],
                hidden_states=self.drafter.project(target_features[None]),
                position_ids=positions[None],
                attention_mask=self._fit(causal_mask(length, self.committed, self.drafter.dtype,
                                                     target_features.device)),
                cache=self.cache,
                head_mode=None,
                timer=self.stats.timer,
            )
            self.committed += length
            feature = out.next_hidden_states[0, -1]  # (d,)
            head, children = self._propose(out.hidden_states[0, -1:], out.router_logits[0, -1:], [0])
            self.root = RootProposal(feature, head, children)

    # ------------------------------------------------------------------ tree interface
    @torch.no_grad()
    def draft(
        self, input_ids: torch.LongTensor, max_depth: int | None = None, committed: list[int] | None = None,
        depth: int | None = None,
    ) -> VerifyTree:
        """A draft tree rooted at input_ids[0, -1] (the committed sequence (1, L + 1), root last), no path
        holding more than `max_depth` drafts (None: the settings' depths) and no drafter node deeper than
        `depth` (None: `draft_depth`; the lookup branch keeps its length). `committed`: the same sequence on
        the host, when the caller keeps it (else it is read from input_ids)."""
        self.catch_up()
        with self.stats.timer("draft", self.device):
            if committed is None:
                committed = input_ids[0].tolist()  # (L + 1,) on the host: the root and the lookup read it
            elif len(committed) != input_ids.shape[1]:
                raise ValueError(f"committed holds {len(committed)} tokens, input_ids {input_ids.shape[1]}.")
            if self.settings.tree_growth == "device" and self.settings.tree_policy != "dyspec":
                tree = self._draft_fixed(input_ids[0, -1], committed, max_depth, depth)
            else:
                pool = new_pool(committed[-1], self.settings)
                root_children, expand = self.proposers(input_ids, pool)
                tree = grow_tree(pool, root_children, expand, self.settings, max_depth, self.lookup(committed),
                                 depth)
            crop_cache(self.cache, self.committed)
        return tree

    def accept(
        self, tree: VerifyTree, walk: WalkResult, target_features: torch.Tensor | None, drafted: bool = True
    ) -> None:
        """Record a verified step and keep the accepted path for the drafter: target_features (n, k * d), the
        target's at every tree node (None when generation has ended: nothing more to draft). `drafted=False`:
        a step without drafter nodes (the root alone, or the lookup branch). The drafter reads the path when it next drafts
        (`catch_up`), so plain steps in a row cost it nothing and are read in one batched call."""
        if drafted:
            self.stats.add_recall(self.root.in_shortlist(walk.new_tokens[0]))
        self.stats.add_step(len(walk.new_tokens), tree.num_nodes - 1, sum(tree.grafted_list[i] for i in walk.path))
        if target_features is not None:
            self.defer(target_features[walk.path], list(walk.new_tokens))

    def defer(self, target_features: torch.Tensor, tokens: list[int]) -> None:
        """Committed pairs (h_i, x_{i+1}) (target_features (T, k * d), tokens (T,) on the host) for the drafter to
        read when it next drafts (`catch_up`): a sequence that never drafts never pays for reading them."""
        self.pending.append((target_features, tokens))

    @property
    def read_length(self) -> int:
        """Committed positions the drafter has read or holds to read (`pending`): the target cache's length."""
        return self.committed + sum(len(tokens) for _, tokens in self.pending)

    def catch_up(self) -> None:
        """Extend the drafter with every accepted path not read yet (one call)."""
        if self.pending:
            features, tokens = self.take_pending()
            self.extend(features, torch.tensor(tokens, device=features.device), tokens)

    def take_pending(self) -> tuple[torch.Tensor, list[int]]:
        """The accepted pairs not read yet, features (T, k * d) and tokens (T,) on the host, no longer pending:
        the caller reads them (`catch_up`, or `lockstep.catch_up_together` for several rows in one call)."""
        features = torch.cat([part for part, _ in self.pending])
        tokens = [token for _, part in self.pending for token in part]
        self.pending = []
        return features, tokens

    def root_probs(self) -> list[float] | None:
        """The root's top-k draft probabilities q on the host (one read), or None while accepted paths wait to
        be read (`catch_up`): the root proposal is then stale."""
        if self.pending or self.root is None:
            return None
        return self.root.children[1][0].exp().tolist()

    def proposers(self, input_ids: torch.LongTensor, pool: TreePool) -> tuple[Proposals, Expand]:
        """The root's children and the expand function of one tree (its drafting state lives in the closure)."""
        features = {0: self.root.feature}  # pool node -> what its children read (d,)
        slots: dict[int, int] = {}  # pool node -> drafter cache index

        def expand(nodes: list[int]) -> Proposals:
            """Top-k children of each pool node: tokens (F, k), log q (F, k)."""
            host = pool.host  # the nodes' columns on the host
            tokens = torch.tensor([host.tokens[n] for n in nodes], device=self.device)  # (F,)
            parents = torch.stack([features[host.parents[n]] for n in nodes])  # (F, d)
            depths = [host.depths[n] for n in nodes]
            positions = torch.tensor([self.committed - 1 + d for d in depths], device=self.device)  # (F,)
            out = self.drafter(
                input_ids=tokens[None],
                hidden_states=parents[None],
                position_ids=positions[None],
                attention_mask=self._tree_mask(pool, slots, nodes),
                cache=self.cache,
                head_mode=None,
                timer=self.stats.timer,
            )
            first_slot = self.committed + len(slots)
            for i, node in enumerate(nodes):
                slots[node] = first_slot + i
                features[node] = out.next_hidden_states[0, i]
            return self._propose(out.hidden_states[0], out.router_logits[0], depths)[1]

        return self.root.children, expand

    def _draft_fixed(self, root: torch.Tensor, committed: list[int], max_depth: int | None,
                     depth_limit: int | None = None) -> VerifyTree:
        """An EAGLE-2 tree grown and grafted with the lookup branch on the device (`tree.growing` on a pool without
        host columns: fixed-shape tensor ops), read on the host once; no drafter node deeper than `depth_limit`
        (None: no further limit)."""
        pool = TreePool.empty(root, pool_capacity(self.settings), on_host=False)
        expand = self.fixed_expander()
        growth = growing(pool, self.root.children, self.settings, max_depth, self.lookup(committed), depth_limit)
        return drive(growth, lambda frontier, depth: expand(pool, frontier, depth))

    def fixed_expander(self) -> Callable[[TreePool, torch.Tensor, int], Proposals]:
        """The drafter's side of growth on the device: expand a frontier of pool nodes at one depth, all on the
        device. Expanded nodes take the next drafter-cache slots; their features, row 1 + slot of a table whose
        row 0 is the root's, are what their children read."""
        features = [self.root.feature[None]]  # (1, d), then (F, d) per expansion
        known = 0  # drafter-cache slots used by this tree (a host count)

        def expand(pool: TreePool, frontier: torch.Tensor, depth: int) -> Proposals:
            nonlocal known
            width, device = frontier.numel(), self.device
            parents = torch.cat(features)[pool.slots[pool.parents[frontier]] + 1]  # (F, d): the root is row 0
            positions = torch.full((width,), self.committed - 1 + depth, device=device)  # (F,)
            mask = self._fixed_mask(pool, frontier, depth, known)
            budget = self.drafter.config.clusters_at_depth(depth, self.settings.draft_depth,
                                                           self.settings.shortlist_k0, self.settings.shortlist_k1)
            feature, head, proposals = self._run_step(pool.tokens[frontier], parents, positions, mask, budget)
            self.stats.add_shortlist(head.shortlist_sizes)
            pool.slots[frontier] = known + torch.arange(width, device=device)
            features.append(feature)
            known += width
            return proposals

        return expand

    def draft_step(
        self, tokens: torch.Tensor, parents: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, budget: int
    ) -> tuple[torch.Tensor, HeadOutput, Proposals]:
        """One drafter call for F nodes: layer, router and shortlisted head (`budget` clusters per node: k_c of
        their children's draft position), then each node's top-k children. tokens (F,), parents (F, d) the
        features they read, positions (F,), mask the 4D additive mask over the drafter cache and themselves ->
        (their features (F, d), the head, (tokens, log q) (F, k) each). No timer and no statistics inside: with
        the "lanes" layout nothing here is read on the host, it compiles whole (`fullgraph=True`) and it is
        captured as a graph (`_run_step`)."""
        out = self.drafter(input_ids=tokens[None], hidden_states=parents[None], position_ids=positions[None],
                           attention_mask=mask, cache=self.cache, head_mode=None)
        head, children = self.head_children(out.hidden_states[0], out.router_logits[0], budget)
        return out.next_hidden_states[0], head, children

    def _run_step(
        self, tokens: torch.Tensor, parents: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, budget: int
    ) -> tuple[torch.Tensor, HeadOutput, Proposals]:
        """`draft_step`, through its captured graph when graphs are on (one per frontier width and budget)."""
        if self.graphs is None:
            return self.draft_step(tokens, parents, positions, mask, budget)

        def flat(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            feature, head, (children, log_q) = self.draft_step(*inputs, budget)
            return feature, head.token_ids, head.logits, head.shortlist_sizes, children, log_q

        pointer = self._static_layer().cumulative_length  # the write position the step advances
        feature, ids, logits, sizes, children, log_q = self.graphs(
            (tokens.numel(), budget), flat, (tokens, parents, positions, mask), state=(pointer,))
        return feature, HeadOutput(ids, logits, sizes), (children, log_q)

    def _fixed_mask(self, pool: TreePool, frontier: torch.Tensor, depth: int, known: int) -> torch.Tensor:
        """(1, 1, F, cache + F) for frontier nodes at `depth` (a static cache: its whole size): the committed
        prefix, the slots of their depth - 1 drafted ancestors (every ancestor below the root was expanded),
        themselves. Built on the device."""
        width, committed = frontier.numel(), self.committed
        layer = self._static_layer()
        columns = layer.max_cache_len if layer is not None else committed + known + width
        allowed = torch.zeros(width, columns + 1, dtype=torch.bool, device=self.device)
        allowed[:, :committed] = True
        rows = torch.arange(width, device=self.device)
        allowed[rows, committed + known + rows] = True
        ancestor = pool.parents[frontier]  # (F,)
        for _ in range(depth - 1):
            slot = pool.slots[ancestor]  # (F,) -1 at the root
            column = torch.where(slot >= 0, committed + slot, allowed.shape[1] - 1)  # the spare last column
            allowed[rows, column] = True
            ancestor = pool.parents[ancestor].clamp(min=0)
        return additive_mask(allowed[:, :-1], self.drafter.dtype)

    def _tree_mask(self, pool: TreePool, slots: dict[int, int], nodes: list[int]) -> torch.Tensor:
        """(1, 1, F, cache + F): committed prefix, the node's drafted ancestors, itself."""
        known = len(slots)
        allowed = torch.zeros(len(nodes), self.committed + known + len(nodes), dtype=torch.bool)
        allowed[:, : self.committed] = True
        for i, node in enumerate(nodes):
            for ancestor in pool.ancestors(node):
                allowed[i, slots[ancestor]] = True
            allowed[i, self.committed + known + i] = True
        return self._fit(additive_mask(allowed.to(self.device), self.drafter.dtype))

    def lookup(self, committed: list[int]) -> list[int]:
        """The lookup branch for the committed sequence (L,), root last ([] when off or no n-gram recurs)."""
        settings = self.settings
        if settings.lookup_num_tokens == 0:
            return []
        return find_continuation(
            committed, settings.lookup_max_ngram, settings.lookup_min_ngram, settings.lookup_num_tokens
        )

    def _propose(
        self, features: torch.Tensor, router_logits: torch.Tensor, depths: list[int]
    ) -> tuple[HeadOutput, Proposals]:
        """Shortlisted head on features (F, d) of nodes at `depths` -> (head output, top-k (tokens, log q), each
        (F, k)). The children of a node at depth t are draft position t, whose cluster budget is k_c(t)."""
        settings, config = self.settings, self.drafter.config
        budget = [  # a host list: the head selects clusters without reading a device value
            config.clusters_at_depth(d, settings.draft_depth, settings.shortlist_k0, settings.shortlist_k1)
            for d in depths
        ]
        with self.stats.timer("head", self.device):
            head, children = self.head_children(features, router_logits, budget)
        self.stats.add_shortlist(head.shortlist_sizes)
        return head, children

    def head_children(self, features: torch.Tensor, router_logits: torch.Tensor, budget: list[int]
                  ) -> tuple[HeadOutput, Proposals]:
        """The shortlisted head on features (F, d) with cluster budgets (F,), and each node's top-k children."""
        settings = self.settings
        head = self.drafter.bound_head.logits(features, settings.head_mode, router_logits, budget, self.context,
                                              settings.static_size, settings.shortlist_layout)
        logq = torch.log_softmax(head.logits, dim=-1)  # (F, S), -inf outside each shortlist
        top = logq.topk(min(settings.draft_top_k, logq.shape[-1]), dim=-1)
        return head, (head.ids_at(top.indices), top.values)

    # ------------------------------------------------------------------ transformers' chain interface
    @torch.no_grad()
    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        model_outputs: Any = None,
        is_first_iteration: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """(input_ids (1, L + 1) followed by k drafts, draft logits (1, k, V)); see the module docstring."""
        if is_first_iteration:
            return input_ids, None  # the target's prefill has not run: no hidden states to draft from yet
        hidden = getattr(model_outputs, "hidden_states", None)
        if hidden is None:
            raise ValueError(
                "DynaSpecCandidateGenerator drafts from the target's hidden states: the assisted loop must pass "
                "`model_outputs` with `hidden_states` (it does when `requires_model_outputs` is honoured)."
            )
        new = input_ids.shape[1] - 1 - self.committed  # committed pairs (h_i, x_{i+1}) not read yet
        if not 0 < new <= hidden[-1].shape[1]:
            raise ValueError(f"Expected hidden states for {new} new positions, got {hidden[-1].shape[1]}.")
        self.extend(self.drafter.target_features(hidden)[0, :new], input_ids[0, -new:])
        room = None if self.max_length is None else self.max_length - input_ids.shape[1] - 1  # bonus token
        depth, _ = depth_limits(self.settings, room)
        if depth < 1:
            self._chain_length = 0
            return input_ids, None
        with self.stats.timer("draft", self.device):
            tokens, logits = self.draft_chain(depth)  # (k,), (k, V)
        self._chain_length = tokens.numel()
        return torch.cat([input_ids, tokens[None].to(input_ids.device)], dim=-1), logits[None]

    def draft_chain(self, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`depth` drafts, each the argmax of (or, sampling, a sample from) the drafter's shortlisted
        distribution after the previous one: tokens (k,), logits over the vocabulary (k, V)."""
        vocab_size = self.drafter.config.vocab_size
        head, feature = self.root.head, self.root.feature
        tokens, rows = [], []
        for t in range(depth):
            row = head.to_vocab(vocab_size)[0]  # (V,), -inf outside the shortlist
            token = torch.multinomial(torch.softmax(row, -1), 1) if self.do_sample else row.argmax().view(1)
            tokens.append(token)
            rows.append(row)
            if t == depth - 1:
                break
            past = self.committed + t  # causal over the committed cache and the chain so far
            out = self.drafter(
                input_ids=token.view(1, 1), hidden_states=feature.view(1, 1, -1), cache=self.cache,
                position_ids=torch.full((1, 1), past, device=self.device),
                attention_mask=self._fit(causal_mask(1, past, self.drafter.dtype, self.device)),
                head_mode=None, timer=self.stats.timer,
            )
            feature = out.next_hidden_states[0, -1]
            head, _ = self._propose(out.hidden_states[0, -1:], out.router_logits[0, -1:], [t + 1])
        crop_cache(self.cache, self.committed)
        return torch.cat(tokens), torch.stack(rows)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """transformers' loop after verification: `num_matches` drafts accepted, then its own token."""
        if self._chain_length is None:  # the prefill: nothing was drafted
            return
        first_new = int(input_ids[0, input_ids.shape[1] - num_matches - 1])  # the target's token after the root
        self.stats.add_recall(self.root.in_shortlist(first_new))
        self.stats.add_step(num_matches + 1, self._chain_length, 0)
        self._chain_length = None

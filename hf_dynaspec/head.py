"""The drafter's shortlisted LM head: logits over a few rows of the target's LM head, never all of them.

The head modes ("dynamic", "full", "static", "context", "union", "trained") are objects in `head_modes`, each
over this module's machinery: `ShortlistHead.logits(features, mode, ...)` hands the call to the mode named.
On CPU the "dynamic" rows are read in place from a cluster-sorted copy of the head made once at bind time (one
GEMM per contiguous run of selected clusters, `hf_dynaspec.ops.segmented_lm_head`); on CUDA the fused Triton
kernel gathers them.
The `always_include_ids` (EOS) are always in the target-row shortlists, so the drafter can propose the end of a
reply; the "trained" head scores exactly the vocabulary it was trained on.
A token is in at most one finite column per position (duplicates would count its probability twice).

The router's shortlists come in two layouts (`LAYOUTS`), with the same finite columns per position:
- "union": the union of all positions' clusters, one GEMM over its rows, each position masking the clusters it
  did not choose. The union's size is read on the host (one read per call): the fastest on a CPU.
- "lanes": each position's own clusters in fixed-size lanes (`ops.cluster_lm_head`: K slots of the largest
  cluster's size, masked lanes -inf), token ids per position. Nothing is read on the host and no shape
  depends on values, so a draft step can be captured in a CUDA graph or compiled whole.

    python -m pytest tests/test_drafter.py -q -k head
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .clustering import VocabClusters
from .head_modes import HeadRequest, head_modes, head_named
from .head_output import ContextColumns, HeadOutput
from .ops import cluster_head_impl, gathered_lm_head, load_kernel_package, segmented_lm_head
from .router import UnionLimit, check_max_union_tokens

__all__ = ["ClusterGemm", "ContextColumns", "HeadOutput", "LAYOUTS", "LogitTransform", "ShortlistHead", "TrainedHead"]
ClusterGemm = Callable[[torch.Tensor, list[int]], torch.Tensor]  # (features (T, d), clusters) -> (T, S) logits
LAYOUTS = ("union", "lanes")  # how the router's shortlists are laid out (module docstring)


@dataclass(frozen=True)
class LogitTransform:
    """What a target does to `lm_head(h)` before its logits come out: multiply by `scale` (Granite divides by
    `logits_scaling`, Cohere multiplies by `logit_scale`), then soft-cap, cap * tanh(x / cap) (Gemma 2 / 3).
    Monotone, so drafts keep their order; it matters for the draft probabilities q."""

    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, config) -> LogitTransform:
        text = config.get_text_config()
        scale = 1.0 / getattr(text, "logits_scaling", None) if getattr(text, "logits_scaling", None) else 1.0
        scale *= getattr(text, "logit_scale", None) or 1.0
        return cls(scale=float(scale), softcap=getattr(text, "final_logit_softcapping", None))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


@dataclass(frozen=True)
class TrainedHead:
    """A drafter's own LM head over its draft vocabulary of N target ids (an EAGLE-3 checkpoint's `lm_head`, its
    column i the target id i + d2t[i]): logits = scale * features @ weight.T, as vLLM's EAGLE-3 proposer computes
    them (its `logit_scale`; no soft-cap: the head was trained without one).

    token_ids: (N,) target ids in the checkpoint's order; weight: (N, d); scale: the checkpoint's logit scale."""

    token_ids: torch.Tensor
    weight: torch.Tensor
    scale: float = 1.0

    def __call__(self, features: torch.Tensor) -> HeadOutput:
        logits = F.linear(features, self.weight).float()  # (T, N)
        if self.scale != 1.0:
            logits = logits * self.scale
        return HeadOutput.dense(self.token_ids, logits)


class ShortlistHead:
    """Prepared views of the target's LM head that the head modes score from (built by `DynaSpecDrafter.bind`)."""

    def __init__(
        self,
        weight: torch.Tensor,
        clusters: VocabClusters,
        always_include_ids: list[int],
        static_token_ids: torch.Tensor | None,
        transform: LogitTransform = LogitTransform(),
        static_ranked: bool = False,
        trained: TrainedHead | None = None,
    ) -> None:
        self.weight = weight  # (V, d) the target's LM head, not copied
        self.transform = transform
        self.trained = trained  # the drafter's own head ("trained" mode), or None
        self.clusters = clusters
        self.device = weight.device
        self.cluster_of_token = clusters.cluster_of_token.to(self.device)  # (V,)
        self.permutation = clusters.permutation.to(self.device)  # (V,)
        self.offsets = clusters.offsets.tolist()  # (M + 1,) on the host: the layout slices need no device read
        self.offsets_on_device = clusters.offsets.to(self.device)  # (M + 1,) for the "lanes" layout
        self.lane_width = max(b - a for a, b in zip(self.offsets[:-1], self.offsets[1:]))  # the largest cluster
        self.cluster_sizes = clusters.offsets.diff().to(self.device)  # (M,)
        self._cluster_head = cluster_head_impl(self.device)  # resolved here: the "lanes" path compiles whole
        self._cluster_lanes = load_kernel_package().cluster_lanes
        # CPU path reads rows in place from a cluster-contiguous copy; CUDA gathers from the original.
        self.weight_by_cluster = weight.index_select(0, self.permutation) if not weight.is_cuda else None
        self.cluster_gemm: ClusterGemm | None = None  # another CPU GEMM for the union's clusters (`use_cluster_gemm`)
        self.cluster_of_position = self.cluster_of_token[self.permutation]  # (V,) cluster of each sorted row
        self.extra_id_list = sorted({int(i) for i in always_include_ids})  # host copy: context columns read it
        self.extra_ids = torch.tensor(self.extra_id_list, dtype=torch.long, device=self.device)
        self.extra_weight = weight.index_select(0, self.extra_ids)  # (E, d)
        self.static_ids = None
        self.static_ranked = static_ranked
        self._static_prefixes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._static_host: dict[int, set[int]] = {}
        if static_token_ids is not None and static_token_ids.numel() > 0:
            self.static_ranking = static_token_ids.to(self.device)  # (S0,) as stored (ranked or by id)
            self.static_ids, self.static_weight = self._static_columns(self.static_ranking.numel())

    def static_prefix(self, static_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The static shortlist's first `static_size` tokens (None: all): (S,) ids, (S, d) rows."""
        if self.static_ids is None:
            raise ValueError(
                "head_mode='static' needs a static shortlist: build the drafter with "
                "`static_token_ids=` (e.g. the most frequent tokens) or use head_mode='dynamic'."
            )
        stored = self.static_ranking.numel()
        if static_size is None or static_size == stored:
            return self.static_ids, self.static_weight
        if not self.static_ranked:
            raise ValueError(
                "static_size needs a frequency-ranked static shortlist; this drafter stores its static tokens by id: "
                "store a ranked one with `hf-dynaspec static` (or `set_static_shortlist(ids, ranked=True)`)."
            )
        if not 1 <= static_size <= stored:
            raise ValueError(f"static_size must be in [1, {stored}] (the stored static shortlist), got {static_size}.")
        return self._static_columns(static_size)

    def _static_columns(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `size` stored static tokens with the always-included ids: (S,) ids, (S, d) rows (copied once
        per size)."""
        if size not in self._static_prefixes:
            ids = torch.unique(torch.cat([self.static_ranking[:size], self.extra_ids]))  # (S,)
            self._static_prefixes[size] = ids, self.weight.index_select(0, ids)
        return self._static_prefixes[size]

    def context_columns(self, context_tokens: Iterable[int], mode: str, static_size: int | None = None) -> ContextColumns:
        """The step's extra columns from the tokens read so far (host ids, so nothing is read from the device):
        with the always-included ids, and for a mode that reads it ("context") the static set (its `static_size` most frequent
        tokens) as the frequent core (NanoSpec)."""
        ids = set(context_tokens) | set(self.extra_id_list)
        if head_named(mode).reads_static and self.static_ids is not None:
            ids |= self._static_host_ids(static_size)
        token_ids = torch.tensor(sorted(ids), dtype=torch.long, device=self.device)  # (C,) ascending
        return ContextColumns(token_ids, self.weight.index_select(0, token_ids))

    def _static_host_ids(self, static_size: int | None) -> set[int]:
        """The static prefix's ids on the host (read once per size, then kept)."""
        size = self.static_ranking.numel() if static_size is None else static_size
        if size not in self._static_host:
            self._static_host[size] = set(self.static_prefix(static_size)[0].tolist())
        return self._static_host[size]

    def _union_ids_on_device(self, selected: torch.Tensor) -> torch.Tensor:
        """(S,) the ids of the clusters any of the T positions selected, in the order the CPU path lays them out
        (ascending cluster, then the cluster-sorted rows): a mask over the sorted rows and one nonzero, with no
        per-cluster host work (each small launch costs more than the arithmetic on a GPU)."""
        keep = selected.any(dim=0)[self.cluster_of_position]  # (V,) bool over the cluster-sorted rows
        return self.permutation[keep.nonzero().flatten()]  # (S,)

    @torch.no_grad()
    def logits(
        self,
        features: torch.Tensor,
        mode: str,
        router_logits: torch.Tensor | None = None,
        k: int | list[int] | torch.Tensor = 1,
        context: ContextColumns | None = None,
        static_size: int | None = None,
        layout: str = "union",
        max_union_tokens: int | None = None,
    ) -> HeadOutput:
        """features: (T, d) drafter outputs -> HeadOutput over the mode's shortlist; k: clusters per position;
        context: the step's `context_columns` ("context" and "union" modes); static_size: use only the first N
        of a frequency-ranked static shortlist ("static" mode; None: all of it); layout: of the router's
        shortlists ("dynamic" and "union" modes; `LAYOUTS`); max_union_tokens: the most tokens the union of
        all T positions' clusters may hold (`router.within_union_limit`; "union" layout; None: no limit)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
        request = HeadRequest(router_logits, k, context, static_size, layout,
                              self._union_limit(mode, layout, max_union_tokens))
        return head_named(mode).logits(self, features, request)

    def use_cluster_gemm(self, gemm: ClusterGemm) -> None:
        """Score the "union" layout's clusters on a CPU with `gemm` (features (T, d), the union's clusters ascending)
        -> (T, S) logits, each cluster's rows in the cluster-sorted order of `weight_by_cluster`: a serving engine's
        own prepacked matmul (the vLLM plugin's oneDNN one), in place of `ops.segmented_lm_head`."""
        if self.weight_by_cluster is None:
            raise ValueError("use_cluster_gemm replaces the CPU path's GEMM; this head is on a GPU (the gathered "
                             "kernel scores its clusters).")
        self.cluster_gemm = gemm

    def _union_limit(self, mode: str, layout: str, max_union_tokens: int | None) -> UnionLimit | None:
        """(cluster sizes, max_union_tokens) for `select_clusters`; refused where no union of clusters is scored."""
        if max_union_tokens is None:
            return None
        if not head_named(mode).reads_router or layout != "union":
            readers = " or ".join(repr(name) for name in head_modes() if head_named(name).reads_router)
            raise ValueError(f"max_union_tokens limits the union of the router's clusters: it needs head_mode "
                             f"{readers} with layout='union', got {mode!r} / {layout!r}.")
        check_max_union_tokens(max_union_tokens)
        return self.cluster_sizes, max_union_tokens

    def clusters_union(
        self, features: torch.Tensor, selected: torch.Tensor, context: ContextColumns | None = None
    ) -> HeadOutput:
        # selected: (T, M) bool. The union U of selected clusters is computed once for all T positions, its
        # columns in ascending cluster order (the one device synchronisation of a head call), then each
        # position masks the clusters it did not choose itself.
        if features.is_cuda:
            token_ids = self._union_ids_on_device(selected)  # (S,)
            logits = gathered_lm_head(features, self.weight, token_ids).float()  # (T, S) one fused kernel
        else:
            union = [c for c, chosen in enumerate(selected.any(dim=0).tolist()) if chosen]  # (U,) ascending
            starts = [self.offsets[c] for c in union]  # each cluster's rows in the cluster-sorted layout
            ends = [self.offsets[c + 1] for c in union]
            positions = torch.cat([torch.arange(a, b) for a, b in zip(starts, ends)] or [torch.arange(0)])  # (S,)
            token_ids = self.permutation[positions]  # (S,)
            if self.cluster_gemm is not None:
                logits = self.cluster_gemm(features, union).float()  # (T, S)
            else:  # adjacent clusters' rows are one GEMM: segmented_lm_head merges touching ranges itself
                logits = segmented_lm_head(features, self.weight_by_cluster, starts, ends).float()  # (T, S)
        own = selected[:, self.cluster_of_token[token_ids]]  # (T, S)
        # Always-included ids (EOS) and, in "union" mode, the context's tokens: a column each, live unless the
        # position's own clusters already hold the token.
        extra_ids, extra_weight = self.extra_ids, self.extra_weight
        if context is not None:  # its columns include the always-included ids
            extra_ids, extra_weight = context.token_ids, context.weight  # (E,), (E, d)
        extra_logits = F.linear(features, extra_weight).float()  # (T, E)
        extra_own = ~selected[:, self.cluster_of_token[extra_ids]]  # (T, E)
        logits = self.transform(torch.cat([logits, extra_logits], dim=-1))  # (T, S + E)
        own = torch.cat([own, extra_own], dim=-1)
        logits = logits.masked_fill(~own, float("-inf"))
        return HeadOutput(torch.cat([token_ids, extra_ids]), logits, own.sum(dim=-1))

    def lanes(
        self, features: torch.Tensor, router_logits: torch.Tensor, k: int | list[int] | torch.Tensor,
        context: ContextColumns | None = None,
    ) -> HeadOutput:
        """The "lanes" layout: each of the T positions scores its own top-k clusters in K fixed slots of
        `lane_width` columns (K = the largest budget, known on the host), then the always-included ids (or, in
        "union" mode, the context's tokens), each live where the position's clusters do not hold it already."""
        rows = router_logits.shape[0]
        if isinstance(k, int):
            budgets, slots = None, min(k, router_logits.shape[-1])
        elif isinstance(k, list):
            budgets, slots = torch.tensor(k, device=self.device), min(max(k), router_logits.shape[-1])
        else:
            raise ValueError("The 'lanes' layout takes cluster budgets as an int or a host list (a tensor would "
                             "be read on the host to size the slots).")
        top = router_logits.topk(slots, dim=-1).indices  # (T, K)
        if budgets is not None:  # a position with a smaller budget leaves its last slots unused
            top = top.masked_fill(torch.arange(slots, device=self.device)[None] >= budgets[:, None], -1)
        logits = self._cluster_head(features, self.weight, self.permutation, self.offsets_on_device, top,
                                    self.lane_width)  # (T, K * W), -inf on masked lanes
        token_ids, live = self._cluster_lanes(self.permutation, self.offsets_on_device, top,
                                              self.lane_width)  # (T, K * W) each
        extra_ids, extra_weight = (self.extra_ids, self.extra_weight) if context is None else \
            (context.token_ids, context.weight)  # (E,), (E, d)
        held = (self.cluster_of_token[extra_ids][None, None, :] == top[:, :, None]).any(dim=1)  # (T, E)
        logits = torch.cat([logits.masked_fill(~live, 0.0), F.linear(features, extra_weight).float()], dim=-1)
        live = torch.cat([live, ~held], dim=-1)  # (T, K * W + E)
        # the transform (a soft-cap) would lift -inf to a finite value: mask after it
        logits = self.transform(logits).masked_fill(~live, float("-inf"))
        token_ids = torch.cat([token_ids, extra_ids.expand(rows, -1)], dim=-1)
        return HeadOutput(token_ids, logits, live.sum(dim=-1))

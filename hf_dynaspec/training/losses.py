"""The losses of one training batch of the DynaSpec drafter (`trainer.py` runs the loop).

Drafter position i consumes (h_i, x_{i+1}); its feature f_i is trained to match h_{i+1} (smooth L1) and,
through the target's frozen LM head, the target's distribution for x_{i+2} (cross-entropy against the
softmax, or the argmax, of head(h_{i+1})), at draft depths 1..unroll (`unrolled_steps`). The router learns, by
BCE, a multi-label target: a cluster is positive when it holds one of the top-L tokens of the drafter's own
distribution or the target's next token. The LM head runs on a random subset of the valid positions, over the
whole vocabulary or a candidate set (`Candidates`).

    python -c "
    import torch; from hf_dynaspec.training.losses import Candidates, DenseHead, head_targets
    head = DenseHead(torch.randn(50, 8), lambda z: z); t = head_targets(head, torch.randn(3, 8), Candidates(torch.arange(5), 4))
    print(t.columns, t.probs.shape)"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..masks import additive_mask


@dataclass
class LossWeights:
    regression: float = 1.0
    ce: float = 0.5
    router: float = 0.2

    def total(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.regression * parts["regression"] + self.ce * parts["ce"] + self.router * parts["router"]


@dataclass
class Batch:
    """B windows of T drafter positions (right-padded; `valid` marks the positions that count)."""

    input_ids: torch.Tensor  # (B, T) x_{i+1}
    features: torch.Tensor  # (B, T, k * d) the target's features of position i (EAGLE-1: h_i)
    target_hidden: torch.Tensor  # (B, T, d) h_{i+1}
    position_ids: torch.Tensor  # (B, T) i
    valid: torch.Tensor  # (B, T) bool: x_{i+2} is an answer token


def unroll_mask(length: int, step: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """4D additive mask (1, 1, T, step * T) for draft step `step` >= 2 of an unrolled window.

    When decoding, the drafter's token at depth s (position j) sees the context it computed from the target's
    true features, up to position j - s + 1, then its own earlier drafts at j - s + 2 .. j - 1, one from each
    earlier step, and itself. With the keys of steps 1..s laid side by side in the cache (blocks of T), query
    j of step s may see: block 1 keys k <= j - s + 1; block r (2 <= r <= s) key j - s + r only.
    """
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    blocks = [ones.tril(1 - step)] + [ones.tril(r - step).triu(r - step) for r in range(2, step + 1)]
    return additive_mask(torch.cat(blocks, dim=-1), dtype)  # (1, 1, T, s*T)


def unrolled_steps(drafter, batch: Batch, unroll: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """[(features (B, T, d), router_logits (B, T, M), valid (B, T))] for draft steps 1..unroll.

    Step 1 is teacher-forced: position j reads (project(target features of j), x_{j+1}). Step s >= 2 reads
    (g^{s-1}_{j-1}, x_{j+1}): the drafter's own `next_hidden_states` from the previous step one position back,
    as at depth s when decoding (the draft tokens are the true ones: only accepted prefixes count; this is
    EAGLE-3's training-time test). Every step has the same targets (h_{j+1}, x_{j+2}); position j of step s
    needs j >= s - 1.
    """
    dtype = drafter.fc.weight.dtype
    length = batch.input_ids.shape[1]
    cache = DynamicCache() if unroll > 1 else None
    hidden = drafter.project(batch.features)  # (B, T, d)
    steps = []
    for step in range(1, unroll + 1):
        mask = None if step == 1 else unroll_mask(length, step, dtype, hidden.device)
        out = drafter(batch.input_ids, hidden, position_ids=batch.position_ids, attention_mask=mask, cache=cache,
                      head_mode=None)
        valid = batch.valid.clone()
        valid[:, : step - 1] = False
        steps.append((out.hidden_states, out.router_logits, valid))
        following = out.next_hidden_states  # (B, T, d)
        hidden = torch.cat([torch.zeros_like(following[:, :1]), following[:, :-1]], dim=1)
    return steps


def drafter_losses(
    drafter,
    batch: Batch,
    head_positions: int,
    router_top_l: int,
    soft_targets: bool,
    generator: torch.Generator,
    unroll: int = 1,
    unroll_decay: float = 0.8,
    dense: DenseHead | None = None,
    candidates: Candidates | None = None,
) -> dict[str, torch.Tensor]:
    """Regression, CE and router losses of one batch (0-dim tensors, weighted means over the unrolled steps)
    and the batch's top-1 accuracy (step 1).

    The LM head runs on `head_positions` positions sampled once per batch among those every step can score
    (valid at the deepest step), so the target's distribution there (the same at every step: h_{j+1} ->
    x_{j+2}) is computed once, not once per step: at 262k tokens that head is most of a step's cost. `dense`: the
    full head to score with (`DenseHead.of`; default: the bound head as it is); `candidates`: score the drafter
    over a candidate set only (`Candidates`; the top-1 reported is then within it)."""
    dense = dense or DenseHead.of(drafter)
    steps = unrolled_steps(drafter, batch, unroll)
    scored = steps[-1][2].nonzero(as_tuple=True)  # positions valid at the deepest step
    if scored[0].numel() == 0:
        raise ValueError(
            f"No answer position of this batch can be scored at draft step {len(steps)}: its answers start too "
            "early in their windows for that many unrolled steps. Use a smaller --unroll or longer prompts."
        )
    pick = torch.randperm(scored[0].numel(), generator=generator)[:head_positions]
    sel = (scored[0][pick], scored[1][pick])  # (k,) rows and columns of the scored positions
    targets = head_targets(dense, batch.target_hidden[sel], candidates)
    scale = [unroll_decay**s for s in range(len(steps))]
    parts: dict[str, torch.Tensor] = {}
    for weight, (features, router_logits, valid) in zip(scale, steps):
        step_parts = step_losses(drafter, batch, features, router_logits, valid, sel, targets, router_top_l,
                                 soft_targets)
        parts.setdefault("top1", step_parts.pop("top1"))
        for key, value in step_parts.items():
            parts[key] = parts.get(key, 0) + weight * value / sum(scale)
    return parts


@dataclass(frozen=True)
class DenseHead:
    """The bound target's full LM head as training scores with it: logits = transform(features @ W^T), W (V, d)
    cast once to the training dtype. Autocast keeps no cast of a frozen weight (only of leaves that require
    grad), so under autocast every call would cast all V x d of W again: most of a 262k-token step's copies."""

    weight: torch.Tensor  # (V, d)
    transform: Any  # the target's logit transform (head.LogitTransform)

    @classmethod
    def of(cls, drafter, dtype: torch.dtype | None = None) -> DenseHead:
        head = drafter.bound_head
        return cls(head.weight if dtype is None else head.weight.to(dtype), head.transform)

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        """features (..., d) -> logits (..., V), in the weight's dtype as autocast would compute them."""
        return self.transform(F.linear(features.to(self.weight.dtype), self.weight))

    def rows(self, ids: torch.Tensor) -> DenseHead:
        """The head over vocabulary ids `ids` (S,) only: logits (..., S)."""
        return DenseHead(self.weight.index_select(0, ids.to(self.weight.device)), self.transform)


@dataclass
class HeadTargets:
    """The target's next-token distribution at the scored positions, shared by every unrolled step, over the
    columns the drafter is scored on: the whole vocabulary, or a candidate set (`candidate_targets`)."""

    probs: torch.Tensor  # (k, S) softmax of the target's logits over the columns
    token: torch.Tensor  # (k,) its greedy token, as a column index
    head: DenseHead  # the head restricted to the columns (S rows of W)
    columns: torch.Tensor | None = None  # (S,) ascending vocabulary ids of the columns; None: all V

    def vocabulary_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Column indices -> vocabulary ids."""
        return index if self.columns is None else self.columns[index]


@dataclass(frozen=True)
class Candidates:
    """A cheaper CE (`--head-vocab`): the drafter is scored over `frequent` (the data's most frequent target
    tokens, (N,) ids) and each scored position's `top` most likely tokens under the target, the target's
    distribution renormalised over them. At 262k tokens the full head is most of a step; over a candidate set
    the same step scores many more positions. The drafter's q is normalised over a shortlist when it drafts too."""

    frequent: torch.Tensor  # (N,) vocabulary ids
    top: int = 16


@torch.no_grad()
def head_targets(dense: DenseHead, target_hidden: torch.Tensor, candidates: Candidates | None = None) -> HeadTargets:
    """target_hidden (k, d) = h_{j+1} at the scored positions -> the target's distribution for x_{j+2}, over the
    whole vocabulary or over `candidates` (the frequent ids and every position's top ids: S columns)."""
    logits = dense(target_hidden)  # (k, V)
    if candidates is None:
        return HeadTargets(logits.softmax(-1), logits.argmax(-1), dense)
    top = logits.topk(candidates.top, dim=-1).indices  # (k, top), the greedy token first
    columns = torch.cat([candidates.frequent.to(top.device), top.flatten()]).unique()  # (S,) sorted
    probs = logits[:, columns].float().softmax(-1).to(logits.dtype)  # (k, S)
    token = torch.searchsorted(columns, top[:, 0].contiguous())  # (k,) the greedy token's column
    return HeadTargets(probs, token, dense.rows(columns), columns)


def step_losses(
    drafter,
    batch: Batch,
    features: torch.Tensor,
    router_logits: torch.Tensor,
    valid_mask: torch.Tensor,
    sel: tuple[torch.Tensor, torch.Tensor],
    targets: HeadTargets,
    router_top_l: int,
    soft_targets: bool,
) -> dict[str, torch.Tensor]:
    """Losses of one draft step: features (B, T, d) against h_{j+1} at every valid position, the LM head at
    the scored positions `sel` ((k,) rows, (k,) columns)."""
    valid = valid_mask.nonzero(as_tuple=True)
    feats = features[valid]  # (n, d)
    regression = F.smooth_l1_loss(feats, batch.target_hidden.to(feats.dtype)[valid])
    logits = targets.head(features[sel])  # (k, S): the whole vocabulary or the candidates
    if soft_targets:
        ce = -(targets.probs * logits.log_softmax(-1)).sum(-1).mean()
    else:
        ce = F.cross_entropy(logits, targets.token)
    top = logits.detach().topk(min(router_top_l, logits.shape[-1]), dim=-1).indices  # (k, L), best first
    labels = router_labels(drafter.clusters.cluster_of_token, targets.vocabulary_ids(top),
                           targets.vocabulary_ids(targets.token), logits.dtype)
    router = F.binary_cross_entropy_with_logits(router_logits[sel], labels)
    top1 = (top[:, 0] == targets.token).float().mean()  # the top-L's first: no second pass over the columns
    return {"regression": regression, "ce": ce, "router": router, "top1": top1.detach()}


def router_labels(
    cluster_of_token: torch.Tensor, top: torch.Tensor, target_token: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """(k, M) multi-hot in `dtype`: the clusters of the drafter's top-L tokens `top` (k, L) and of the target's
    next token (k,)."""
    num_clusters = int(cluster_of_token.max()) + 1
    cluster_of_token = cluster_of_token.to(top.device)
    tokens = torch.cat([top, target_token[:, None]], dim=-1)  # (k, L + 1)
    labels = torch.zeros(top.shape[0], num_clusters, dtype=dtype, device=top.device)
    return labels.scatter_(-1, cluster_of_token[tokens], 1.0)

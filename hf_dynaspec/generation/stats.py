"""Speculative statistics of one generate() call, returned with `return_dict_in_generate=True`.

    python -c "from hf_dynaspec.generation.stats import SpeculativeStats as S; s = S(); s.accepted_lengths += [3, 1]; print(s.summary())"
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput


@dataclass
class SpeculativeStats:
    """accepted_lengths: tokens emitted per target step (accepted drafts + the bonus token);
    shortlist sizes are counted over every drafted position; shortlist recall is the fraction of target steps
    whose first token (the target's own choice after the root) lay in the root's shortlist; times are
    wall-clock seconds."""

    accepted_lengths: list[int] = field(default_factory=list)
    shortlist_total: int = 0
    shortlist_positions: int = 0
    draft_time: float = 0.0  # drafter layer + router + shortlisted head + tree bookkeeping
    router_time: float = 0.0  # of draft_time: the router MLP (CPU; on CUDA it overlaps the drafter layer)
    head_time: float = 0.0  # of draft_time: cluster selection + shortlisted (gathered) LM head
    verify_time: float = 0.0
    prefill_time: float = 0.0
    tree_sizes: list[int] = field(default_factory=list)
    recall_hits: int = 0
    recall_checks: int = 0
    lookup_tokens: int = 0  # accepted drafts that came from the lookup branch (not the drafter)

    def add_shortlist(self, sizes: torch.Tensor) -> None:
        self.shortlist_total += int(sizes.sum())
        self.shortlist_positions += int(sizes.numel())

    def add_recall(self, hit: bool) -> None:
        self.recall_hits += int(hit)
        self.recall_checks += 1

    @property
    def shortlist_recall(self) -> float:
        return self.recall_hits / max(1, self.recall_checks)

    @property
    def num_steps(self) -> int:
        return len(self.accepted_lengths)

    @property
    def mean_accepted_length(self) -> float:
        return sum(self.accepted_lengths) / max(1, len(self.accepted_lengths))

    @property
    def mean_shortlist_size(self) -> float:
        return self.shortlist_total / max(1, self.shortlist_positions)

    def summary(self) -> dict[str, float]:
        return {
            "steps": self.num_steps,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_shortlist_size": self.mean_shortlist_size,
            "shortlist_recall": self.shortlist_recall,
            "lookup_tokens": self.lookup_tokens,
            "mean_tree_size": sum(self.tree_sizes) / max(1, len(self.tree_sizes)),
            "draft_time_s": self.draft_time,
            "router_time_s": self.router_time,
            "head_time_s": self.head_time,
            "verify_time_s": self.verify_time,
            "prefill_time_s": self.prefill_time,
        }


@dataclass
class DynaSpecGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `speculative_stats` (a `SpeculativeStats`)."""

    speculative_stats: SpeculativeStats | None = None

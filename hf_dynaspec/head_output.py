"""What a shortlisted head returns (`HeadOutput`) and the per-step columns the context heads add (`ContextColumns`).

    python -c "import torch; from hf_dynaspec.head_output import HeadOutput as H; \
print(H(torch.tensor([4, 9]), torch.tensor([[0.5, 1.0]]), torch.tensor([2])).to_vocab(12))"
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class HeadOutput:
    """Shortlisted logits of T draft positions.

    token_ids: (S,) vocabulary ids of the columns, or (T, S) per position ("lanes" layout); logits: (T, S)
    fp32, -inf where a column is outside that position's own shortlist; shortlist_sizes: (T,) number of
    finite columns per position.
    """

    token_ids: torch.Tensor
    logits: torch.Tensor
    shortlist_sizes: torch.Tensor

    def ids_at(self, columns: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of the columns (T, k) of each position: (T, k)."""
        return self.token_ids.expand_as(self.logits).gather(1, columns)

    def to_vocab(self, vocab_size: int) -> torch.Tensor:
        """Scatter into (T, V) with -inf outside the shortlist (for tests and the sampling verifier)."""
        out = self.logits.new_full((self.logits.shape[0], vocab_size), float("-inf"))  # (T, V)
        # An always-included id can own two columns (its cluster's and its extra one); at most one of them
        # is finite per position, so the max keeps it.
        index = self.token_ids.expand_as(self.logits)  # (T, S)
        return out.scatter_reduce_(1, index, self.logits, reduce="amax")

    @classmethod
    def dense(cls, token_ids: torch.Tensor, logits: torch.Tensor) -> HeadOutput:
        """Every column live at every position: token_ids (S,), logits (T, S)."""
        sizes = torch.full((logits.shape[0],), logits.shape[1], device=logits.device)
        return cls(token_ids, logits, sizes)


@dataclass
class ContextColumns:
    """The columns the "context" / "union" heads add for one decoding step, made once per step
    (`ShortlistHead.context_columns`): token_ids (C,) distinct ascending, weight (C, d) their LM-head rows."""

    token_ids: torch.Tensor
    weight: torch.Tensor

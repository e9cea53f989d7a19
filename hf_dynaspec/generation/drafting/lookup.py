"""Lookup drafts: continuations copied from earlier in the sequence, grafted onto the draft tree as one branch.

A small drafter is weakest where the answer copies its context (extraction, summarization, RAG, translation
of names and numbers) and where a greedy answer repeats itself; prompt lookup decoding (Saxena, 2023) is
strongest exactly there. `find_continuation` finds the most recent earlier occurrence of the sequence's last
n tokens (the longest n from `max_ngram` down to `min_ngram` that occurs) and returns the tokens that
followed it. `graft` (in tree.py) merges them into the drafter's tree as one more root path, sharing
the drafter's nodes where the two agree, so the target verifies both in the same forward pass and output
stays exact (verification never trusts a draft, whatever proposed it).

    python -c "import torch; from hf_dynaspec.generation.drafting.lookup import find_continuation as f; print(f(torch.tensor([5, 6, 7, 8, 5, 6]), 3, 1, 2))"
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def find_continuation(ids: Sequence[int] | torch.Tensor, max_ngram: int, min_ngram: int, num_tokens: int) -> list[int]:
    """Tokens that followed the latest earlier occurrence of the longest suffix n-gram of `ids` (L,).

    For n = max_ngram .. min_ngram: the suffix s = ids[L-n:]; a match is a start i < L - n with
    ids[i : i+n] == s; the latest match wins (recent text predicts a repeating answer best) and its
    continuation ids[i+n : i+n+num_tokens] is returned (it may run into the suffix itself: a repeating
    pattern continues). [] when no n-gram of those sizes occurred before or num_tokens is 0. The search runs
    on the host (numpy): a tensor argument is read once.
    """
    ids = np.asarray(ids.tolist() if torch.is_tensor(ids) else ids, dtype=np.int64)  # (L,)
    length = ids.size
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = ids[length - n :]  # (n,)
        windows = np.lib.stride_tricks.sliding_window_view(ids[: length - 1], n)  # (L - n, n) starts 0 .. L-n-1
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if starts.size:
            start = int(starts[-1]) + n
            return ids[start : start + num_tokens].tolist()
    return []

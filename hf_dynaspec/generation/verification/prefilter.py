"""The exact greedy argmax of a large fp32 LM head from a bf16 pass: greedy verification on CPU reads half the
head's bytes (and a bf16 GEMM is much faster than an fp32 one of a few rows on CPUs with bf16 dot products).

For a final hidden state h (d,) and head rows w_i (V, d), the bf16 pass gives a_i: the product of bf16-rounded
h and w_i, accumulated in fp32, rounded to bf16. Each rounding is relative, u = 2^-8 (bf16 keeps 8 significant
bits), so with s_i = sum_j |h_j w_ij| <= ||h|| ||w_i|| (Cauchy-Schwarz):

    |a_i - h . w_i| <= (3u + O(u^2)) s_i + (fp32 accumulation, ~d 2^-24 s_i) <= b_i = c u ||h|| ||w_i||,  c = 3.1

Let m = argmax_i a_i. The fp32 argmax i* has h . w_i* >= h . w_m >= a_m - b_m, and a_i* + b_i* >= h . w_i*, so

    a_i* >= floor - b_i* >= floor - B,   floor = a_m - b_m,   B = c u ||h|| max_i ||w_i||

and i* is among the candidates {i : a_i >= floor - B}. Rescoring them finds it. An fp32 logit itself depends
on the kernel's summation order (the same row gives a few ulps apart in a GEMM and a GEMV, and at different row
positions), so the rescoring computes each candidate's product in fp64 and rounds it to fp32: the correctly rounded
fp32 logit (but for a 1e-7 chance of a straddled rounding), the same whatever the layout, and equal rows tie and go
to the lowest id, as `torch.argmax` does. A pick differs from the fp32 head's only where two logits are within its
few ulps of summation noise, where every layout of the head differs too. On Gemma 3 270M's answer positions the
realised error stayed under a tenth of the bound and most positions left a handful of candidates
(benchmarks/verify_prefilter.py).

Only for a head with no bias and logits that reach the user unchanged (no scaling, no soft-capping, which could
tie tokens the raw logits order): `unsupported_reason` says why a head does not qualify.

    python -c "
    import torch; from hf_dynaspec.generation.verification.prefilter import Prefilter
    w = torch.randn(50_000, 64); h = torch.randn(3, 64); p = Prefilter.of(w)
    print(p.argmax(h).tolist(), (h @ w.T).argmax(-1).tolist())"
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

UNIT_ROUNDOFF = 2.0**-8  # bfloat16: 8 significant bits
BOUND_FACTOR = 3.1  # two rounded factors and a rounded output (3u), with room for fp32 accumulation


def unsupported_reason(head: torch.nn.Module, scale: float, softcap: float | None) -> str | None:
    """Why the prefilter cannot give this head's greedy argmax exactly (None: it can)."""
    weight = getattr(head, "weight", None)
    if weight is None or weight.ndim != 2:
        return "the target's output embedding has no 2-D weight"
    if weight.dtype != torch.float32:
        return f"its LM head is {weight.dtype}, not float32 (the prefilter reads a bf16 copy of an fp32 head)"
    if getattr(head, "bias", None) is not None:
        return "its LM head has a bias"
    if scale != 1.0 or softcap is not None:
        return "it scales or soft-caps its logits (ties the raw logits do not show)"
    return None


def bound_scale(hidden: torch.Tensor) -> torch.Tensor:
    """c u ||h|| (n,) for hidden (n, d): the bound of a row w is this times ||w||."""
    return BOUND_FACTOR * UNIT_ROUNDOFF * hidden.float().norm(dim=-1)


def bounds(hidden: torch.Tensor, row_norms: torch.Tensor) -> torch.Tensor:
    """b (n, V): the largest |bf16 logit - fp32 logit| the rounding allows, for hidden (n, d), row norms (V,)."""
    return bound_scale(hidden)[:, None] * row_norms[None, :]


@dataclass(frozen=True)
class Prefilter:
    """An fp32 head `weight` (V, d), its bf16 copy `weight_bf16` and its rows' norms (V,), largest `max_norm`."""

    weight: torch.Tensor
    weight_bf16: torch.Tensor
    row_norms: torch.Tensor
    max_norm: float

    @classmethod
    def of(cls, weight: torch.Tensor) -> Prefilter:
        weight = weight.detach()
        row_norms = weight.float().norm(dim=-1)  # (V,)
        return cls(weight, weight.to(torch.bfloat16), row_norms, float(row_norms.max()))

    def bf16_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """a (n, V) as fp32: the bf16 pass over hidden (n, d)."""
        return (hidden.to(torch.bfloat16) @ self.weight_bf16.T).float()

    def candidates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of hidden (n, d): a mask (n, V) of the tokens that may hold the fp32 maximum, and the bf16
        logits (n, V) fp32 behind it."""
        approx = self.bf16_logits(hidden)  # (n, V)
        top, best = approx.max(dim=-1)  # (n,)
        slack = bound_scale(hidden)  # (n,)  c u ||h||
        floor = top - slack * self.row_norms[best]  # (n,)  a_m - b_m
        return approx >= (floor - slack * self.max_norm)[:, None], approx  # a_i >= floor - B

    def error_over_bound(self, hidden: torch.Tensor) -> float:
        """The largest |bf16 logit - fp32 logit| / b over hidden (n, d): under 1 wherever this machine's bf16 GEMM
        rounds as the bound assumes (fp32 accumulation); the measured Gemma 3 states stay under 0.1. (The fp32
        logits' own error, ~d 2^-24, is 1/300 of the bound's unit: no fp64 copy of the head is needed.)"""
        exact = hidden.float() @ self.weight.T  # (n, V)
        return float(((self.bf16_logits(hidden) - exact).abs() / bounds(hidden, self.row_norms)).max())

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The fp32 head's argmax (n,) for final hidden states (n, d): the bf16 pass, then each row's candidates
        rescored (`rescore`)."""
        keep, _ = self.candidates(hidden)
        return torch.stack([rescore(self.weight, keep[row].nonzero().squeeze(1), hidden[row])
                            for row in range(hidden.shape[0])])  # (n,)


def rescore(weight: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """The id among `ids` (c,) ascending whose row of `weight` (V, d) has the largest correctly rounded fp32
    product with `hidden` (d,) (computed in fp64, in chunks of rows); equal products: the lowest id."""
    h = hidden.double()  # (d,)
    logits = torch.cat([(weight.index_select(0, part).double() @ h).float()
                        for part in ids.split(chunk)])  # (c,) fp32
    return ids[logits.argmax()]  # argmax: the first of equal maxima

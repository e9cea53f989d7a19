"""benchmarks/verify_prefilter.py: the bf16 pass with its rounding bound keeps the fp32 argmax among the candidates,
and rescoring them finds it, near-ties and repeated rows included."""

from __future__ import annotations

import torch
from helpers import REPO, load_script

probe = load_script(REPO / "benchmarks/verify_prefilter.py", "verify_prefilter")


def test_the_prefilter_finds_the_fp32_argmax_even_at_near_ties():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 48, generator=generator)
    hidden = torch.randn(64, 48, generator=generator)
    best = (hidden @ weight.T).argmax(-1)
    weight[2999] = weight[best[0]] * (1 + 1e-6)  # a near-tie for the first position, far above bf16's resolution
    weight[2998] = weight[best[1]]  # an exact tie for the second
    fp32 = (hidden @ weight.T).argmax(-1)
    found = probe.exact_argmax(hidden, weight, weight.to(torch.bfloat16), weight.norm(dim=-1))
    assert torch.equal(found[2:], fp32[2:]) and found[0] == fp32[0] == 2999
    # an exact tie is decided by fp32 rounding, which differs between any two ways of computing the head (as it
    # does between the head's layouts): either tied token
    assert {int(found[1]), int(fp32[1])} <= {int(best[1]), 2998}
    approx = (hidden.to(torch.bfloat16) @ weight.to(torch.bfloat16).T).float()
    keep = probe.candidates(approx, probe.bounds(hidden, weight.norm(dim=-1)))
    assert keep.gather(1, fp32[:, None]).all() and keep[0, 2999] and keep[1, 2998]
    assert ((approx - hidden @ weight.T).abs() <= probe.bounds(hidden, weight.norm(dim=-1))).all()
    assert keep.sum() < keep.numel() / 10  # the bound leaves few candidates on random data

"""CPU weight layout for speculative verification: `prepare_for_cpu(model)`.

`nn.Linear` stores its weight as (out, in) and computes `x @ W.T`; on CPU, BLAS runs that "transposed B" GEMM
on a slow path once a few rows come at a time (measured on a 2-core Xeon, fp32, SmolLM2's 576 x 1536 MLP:
3 rows 0.12 ms, 4 rows 0.28 ms, 13 rows 0.61 ms; the same product against a contiguous (in, out) copy: 0.14 /
0.14 / 0.32 ms). Plain decoding feeds 1 row per step, tree verification feeds the root plus every draft node,
so the slow path makes each verified draft expensive. `prepare_for_cpu` re-lays each fp32 CPU `nn.Linear`
weight as the transposed view of a contiguous (in, out) tensor: same shape, same values, same parameter
sharing (tied embeddings stay tied), only the strides change, so BLAS takes the fast path. Outputs are the
products of the same numbers; use it for plain and speculative decoding alike (`--cpu-layout` in the CLI).

Whole-model effect (`benchmarks/bench_verify.py`, SmolLM2-135M fp32 with 2 threads:
`benchmarks/results/cpu-smollm2-verify-cost`, quoted in docs/architecture.md): forwards over ten or more tokens get
cheaper, over 2-3 tokens dearer (multi-threaded BLAS splits small products differently). So it is opt-in: it pays
for trees of ten nodes or more, not for the short chains that are fastest on small CPUs.

    python -c "
    from hf_dynaspec.targets import load_target; from hf_dynaspec.cpu import prepare_for_cpu
    t, _ = load_target('tiny'); print(prepare_for_cpu(t).lm_head.weight.stride())"
"""

from __future__ import annotations

import torch
from torch import nn


def prepare_for_cpu(model: nn.Module) -> nn.Module:
    """Re-lay the fp32 CPU `nn.Linear` weights of `model` in place (see the module docstring); returns it.

    Idempotent. Weights on other devices or in other dtypes are left alone. Every module holding the same
    parameter (e.g. `embed_tokens` tied to `lm_head`) gets the re-laid parameter, so ties survive."""
    replaced: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight
            if weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.is_contiguous():
                replaced.setdefault(id(weight), _relaid(weight))
    if not replaced:
        return model
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) in replaced:
                setattr(module, name, replaced[id(param)])
    return model


def _relaid(weight: nn.Parameter) -> nn.Parameter:
    """Same (out, in) values, stored (in, out)-contiguous: the transposed view of a contiguous transpose."""
    with torch.no_grad():
        data = weight.detach().t().contiguous().t()  # (out, in), strides (1, out)
    return nn.Parameter(data, requires_grad=weight.requires_grad)


def is_prepared_for_cpu(model: nn.Module) -> bool:
    """True when some `nn.Linear` weight of `model` has the re-laid (column-major) layout."""
    return any(
        isinstance(m, nn.Linear) and m.weight.dim() == 2 and m.weight.stride() == (1, m.weight.shape[0])
        for m in model.modules()
    )

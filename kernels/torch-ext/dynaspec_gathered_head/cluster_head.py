"""The clustered LM head: each row's logits over the rows of its own clusters, in a fixed shape.

The vocabulary is laid out by cluster: cluster c holds the tokens ``row_ids[offsets[c]:offsets[c + 1]]``. Row t
of ``hidden_states`` chose K clusters ``clusters[t]`` (-1: an unused slot). Its logits are laid out as K lanes
of ``width`` columns, lane j of slot k holding the j-th token of cluster ``clusters[t, k]``:

    logits[t, k * width + j] = sum_d hidden_states[t, d] * weight[row_ids[offsets[c] + j], d]   c = clusters[t, k]
                             = -inf  when c < 0 or j >= offsets[c + 1] - offsets[c]             (a masked lane)

``width`` is at least the largest selected cluster (the largest cluster of all, for a static shape). Nothing
depends on the values of ``clusters`` or ``offsets`` but the arithmetic: no host read, no data-dependent shape,
so a caller can capture it in a CUDA graph or compile it with ``fullgraph=True``. With equal-size clusters no
lane is wasted.

- ``cluster_lm_head_reference``: the readable PyTorch spec (gathers a (T, K, width, d) copy).
- ``cluster_lm_head_triton``: one program per (row, slot, block of lanes) reads its cluster's rows through
  ``row_ids`` and never materialises them (CUDA, or CPU under ``TRITON_INTERPRET=1``).

    python -c "import sys; sys.path.insert(0, 'kernels/torch-ext'); import torch; \
from dynaspec_gathered_head import cluster_lm_head_reference as f; \
print(f(torch.randn(2, 8), torch.randn(10, 8), torch.arange(10), torch.tensor([0, 4, 10]), \
torch.tensor([[1, -1], [0, 1]]), 6))"
"""

from __future__ import annotations

import torch

from .reference import SUPPORTED_DTYPES, SUPPORTED_ID_DTYPES

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is an optional dependency
    triton = None
    tl = None


def check_cluster_inputs(
    hidden_states: torch.Tensor, weight: torch.Tensor, row_ids: torch.Tensor, offsets: torch.Tensor,
    clusters: torch.Tensor, width: int,
) -> None:
    """Raise ``ValueError`` naming the problem when the inputs do not fit the contract (shapes, dtypes,
    devices; values are not read, that would synchronise)."""
    if hidden_states.dim() != 2 or weight.dim() != 2 or hidden_states.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden_states (T, d) and weight (V, d) must share d, got {tuple(hidden_states.shape)} "
                         f"and {tuple(weight.shape)}")
    if hidden_states.dtype != weight.dtype or weight.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"hidden_states and weight must share a float32/bfloat16/float16 dtype, got "
                         f"{hidden_states.dtype} and {weight.dtype}")
    if row_ids.dim() != 1 or offsets.dim() != 1 or row_ids.dtype not in SUPPORTED_ID_DTYPES:
        raise ValueError("row_ids (V,) and offsets (M + 1,) must be 1-D, row_ids int32/int64")
    if clusters.dim() != 2 or clusters.shape[0] != hidden_states.shape[0]:
        raise ValueError(f"clusters must be (T, K) with T = {hidden_states.shape[0]}, got {tuple(clusters.shape)}")
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    if len({hidden_states.device, weight.device, row_ids.device, offsets.device, clusters.device}) != 1:
        raise ValueError("all inputs must be on one device")


def cluster_lanes(
    row_ids: torch.Tensor, offsets: torch.Tensor, clusters: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids (T, K * width), live (T, K * width) bool) of the lanes: lane j of slot k is the j-th token of
    cluster clusters[t, k]; a masked lane has live False (and token id row_ids[0])."""
    safe = clusters.clamp(min=0).long()  # (T, K)
    start = offsets[safe]  # (T, K)
    size = offsets[safe + 1] - start  # (T, K)
    lane = torch.arange(width, device=clusters.device)  # (W,)
    live = (lane < size[..., None]) & (clusters >= 0)[..., None]  # (T, K, W)
    position = torch.where(live, start[..., None] + lane, 0)  # (T, K, W) in the cluster-sorted layout
    return row_ids[position].flatten(1), live.flatten(1)  # (T, K * W) each


def cluster_lm_head_reference(
    hidden_states: torch.Tensor, weight: torch.Tensor, row_ids: torch.Tensor, offsets: torch.Tensor,
    clusters: torch.Tensor, width: int,
) -> torch.Tensor:
    """(T, K * width) fp32 logits (see the module docstring): gathers the lanes' rows, multiplies in fp32."""
    check_cluster_inputs(hidden_states, weight, row_ids, offsets, clusters, width)
    ids, live = cluster_lanes(row_ids, offsets, clusters, width)  # (T, S) each
    rows = weight[ids].float()  # (T, S, d)
    logits = torch.einsum("tsd,td->ts", rows, hidden_states.float())  # (T, S)
    return logits.masked_fill(~live, float("-inf"))


if triton is not None:

    @triton.jit
    def _cluster_head_kernel(
        h_ptr,  # (T, d) hidden states
        w_ptr,  # (V, d) LM-head weight
        ids_ptr,  # (V,) row ids in the cluster-sorted layout
        off_ptr,  # (M + 1,) cluster offsets
        cl_ptr,  # (T, K) cluster of each slot, -1 unused
        out_ptr,  # (T, K * W) fp32 logits
        K,
        W,
        D,
        stride_ht,
        stride_wv,
        BLOCK_L: tl.constexpr,  # lanes per program
        BLOCK_D: tl.constexpr,
    ):
        t = tl.program_id(0)
        k = tl.program_id(1)
        lanes = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)  # (BLOCK_L,)
        cluster = tl.load(cl_ptr + t * K + k)
        safe = tl.maximum(cluster, 0)
        start = tl.load(off_ptr + safe)
        size = tl.where(cluster >= 0, tl.load(off_ptr + safe + 1) - start, 0)  # an unused slot has no lane
        live = lanes < size  # (BLOCK_L,)
        rows = tl.load(ids_ptr + start + lanes, mask=live, other=0).to(tl.int64)  # (BLOCK_L,) the walk
        acc = tl.zeros((BLOCK_L,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)  # (BLOCK_D,)
            d_ok = dims < D
            h = tl.load(h_ptr + t * stride_ht + dims, mask=d_ok, other=0.0).to(tl.float32)  # (BLOCK_D,)
            w = tl.load(w_ptr + rows[:, None] * stride_wv + dims[None, :], mask=live[:, None] & d_ok[None, :],
                        other=0.0).to(tl.float32)  # (BLOCK_L, BLOCK_D)
            acc += tl.sum(w * h[None, :], axis=1)
        acc = tl.where(live, acc, float("-inf"))
        tl.store(out_ptr + t * K * W + k * W + lanes, acc, mask=lanes < W)


def cluster_lm_head_triton(
    hidden_states: torch.Tensor, weight: torch.Tensor, row_ids: torch.Tensor, offsets: torch.Tensor,
    clusters: torch.Tensor, width: int, *, block_lanes: int = 64, block_d: int = 64,
) -> torch.Tensor:
    """(T, K * width) fp32 logits, fused: see the module docstring. Needs triton (CUDA, or CPU tensors under
    ``TRITON_INTERPRET=1``); ``weight`` rows must be contiguous."""
    if triton is None:
        raise RuntimeError("cluster_lm_head_triton needs triton (pip install triton)")
    check_cluster_inputs(hidden_states, weight, row_ids, offsets, clusters, width)
    if weight.stride(1) != 1 or hidden_states.stride(1) != 1:
        raise ValueError("hidden_states and weight must be contiguous along d")
    num_rows, slots = clusters.shape
    out = torch.empty(num_rows, slots * width, dtype=torch.float32, device=hidden_states.device)
    if out.numel() == 0:
        return out
    grid = (num_rows, slots, triton.cdiv(width, block_lanes))
    _cluster_head_kernel[grid](
        hidden_states, weight, row_ids, offsets, clusters.contiguous(), out, slots, width, weight.shape[1],
        hidden_states.stride(0), weight.stride(0), BLOCK_L=block_lanes, BLOCK_D=block_d,
    )
    return out

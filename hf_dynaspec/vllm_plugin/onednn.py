"""The plugin head's cluster GEMMs on a CPU through vLLM's own oneDNN matmul (imported by vLLM only).

vLLM's CPU build runs every linear layer, the static draft head's included, through a oneDNN matmul whose weight
is packed once (`vllm._custom_ops.create_onednn_mm`, dispatched in `model_executor/layers/utils.py`
`dispatch_cpu_unquantized_gemm`). At a few rows it is several times faster than `torch.mm` on the same fp32 rows
(`benchmarks/serving/cluster_gemm.py` measures both), so the plugin packs each cluster's rows of the cluster-sorted
head once and scores a draft step's clusters with one packed matmul each: `ShortlistHead.use_cluster_gemm`.
The packed copies cost as much memory as the sorted head (one more copy of the LM head).

    (vLLM's environment) python benchmarks/serving/cluster_gemm.py
"""

from __future__ import annotations

import torch

from ..head import ClusterGemm, ShortlistHead


def onednn_cluster_gemm(weight_by_cluster: torch.Tensor, offsets: list[int]) -> ClusterGemm | None:
    """A `ClusterGemm` over the clusters' rows of `weight_by_cluster` (V, d), cluster c in rows
    offsets[c]:offsets[c + 1]; None where vLLM has no oneDNN matmul (another CPU, or a build without it)."""
    from vllm import _custom_ops as ops

    if not getattr(ops, "_supports_onednn", False) or weight_by_cluster.is_cuda:
        return None
    handlers = [ops.create_onednn_mm(weight_by_cluster[a:b].t(), 32) if b > a else None  # (d, n_c) each
                for a, b in zip(offsets[:-1], offsets[1:])]

    def gemm(features: torch.Tensor, clusters: list[int]) -> torch.Tensor:
        pieces = [ops.onednn_mm(handlers[c], features, None) for c in clusters if handlers[c] is not None]  # (T, n_c)
        return torch.cat(pieces, dim=1) if pieces else features.new_empty(features.shape[0], 0)  # (T, S)

    return gemm


def use_onednn(head: ShortlistHead) -> None:
    """Score `head`'s union of clusters with vLLM's oneDNN matmul where it has one (a CPU head)."""
    if head.weight_by_cluster is not None and (gemm := onednn_cluster_gemm(head.weight_by_cluster, head.offsets)):
        head.use_cluster_gemm(gemm)

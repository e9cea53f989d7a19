"""Triton kernel for the gathered LM head: a fused gather + GEMM.

    logits[n, s] = sum_k hidden_states[n, k] * weight[token_ids[s], k]

Each program computes one (BLOCK_N, BLOCK_S) tile of the (N, S) output. It loads its BLOCK_S
token ids once, then walks d in BLOCK_K chunks, loading the weight rows *through* the ids (so
the gathered (S, d) matrix is never materialised in memory) and accumulating ``tl.dot`` in fp32.
Tails of N, S and d that are not multiples of the blocks are masked.

Runs on CUDA, and on CPU tensors under Triton's interpreter (the variable has to be set before
this module is imported, because ``@triton.jit`` reads it at decoration time):

    TRITON_INTERPRET=1 python -c "import sys; sys.path.insert(0, 'kernels/torch-ext'); import torch; \
from dynaspec_gathered_head import gathered_lm_head_triton as f; \
print(f(torch.randn(2, 8), torch.randn(100, 8), torch.tensor([3, 7, 42])))"

Triton is optional: without it this module still imports, ``HAS_TRITON`` is False and
``gathered_lm_head_triton`` raises ``RuntimeError``.
"""

from __future__ import annotations

import torch

from .reference import check_inputs

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is an optional dependency
    triton = None
    tl = None

HAS_TRITON: bool = triton is not None
# Launch defaults from the launch-config sweep of benchmarks/gpu_suite.py on an H200 (bf16, 64 rows; the figures
# are in benchmarks/results/gpu-h200): BLOCK_K up to 128 with 4 pipeline stages was within a few percent of the
# best config on every swept shape, where Triton's own default (3 stages) with BLOCK_K 64 was up to 1.9x slower.
DEFAULT_NUM_STAGES = 4


if HAS_TRITON:

    @triton.jit
    def _gathered_head_kernel(
        h_ptr,  # (N, d) hidden states
        w_ptr,  # (V, d) LM-head weight
        ids_ptr,  # (S,) token ids
        out_ptr,  # (N, S) logits, or (SPLIT, N, S) fp32 partial sums when d is split
        N,
        S,
        D,
        K_PER_SPLIT,  # the d-range of one program along axis 2 (a multiple of BLOCK_K)
        stride_hn,
        stride_hk,
        stride_wv,
        stride_wk,
        stride_on,
        stride_os,
        stride_ok,  # between split partials (0 when d is not split)
        BLOCK_N: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_K: tl.constexpr,
        UPCAST: tl.constexpr,  # convert tiles to fp32 before tl.dot (interpreter + bf16)
        INPUT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no tf32), None otherwise
    ):
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_k = tl.program_id(2)  # which d-range (split-K: more programs when the output has few tiles)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)  # (BLOCK_S,)
        n_mask = offs_n < N
        s_mask = offs_s < S
        rows = tl.load(ids_ptr + offs_s, mask=s_mask, other=0).to(tl.int64)  # (BLOCK_S,)

        h_base = h_ptr + offs_n[:, None].to(tl.int64) * stride_hn  # (BLOCK_N, 1)
        w_base = w_ptr + rows[None, :] * stride_wv  # (1, BLOCK_S): the gather
        acc = tl.zeros((BLOCK_N, BLOCK_S), dtype=tl.float32)  # (BLOCK_N, BLOCK_S)
        k_start = pid_k * K_PER_SPLIT
        k_end = tl.minimum(D, k_start + K_PER_SPLIT)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
            k_mask = offs_k < D
            h = tl.load(
                h_base + offs_k[None, :] * stride_hk, mask=n_mask[:, None] & k_mask[None, :], other=0.0
            )  # (BLOCK_N, BLOCK_K)
            w = tl.load(
                w_base + offs_k[:, None] * stride_wk, mask=k_mask[:, None] & s_mask[None, :], other=0.0
            )  # (BLOCK_K, BLOCK_S)
            if UPCAST:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(h, w, acc, input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_S) fp32

        out_ptrs = out_ptr + pid_k * stride_ok + offs_n[:, None].to(tl.int64) * stride_on + offs_s[None, :] * stride_os
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & s_mask[None, :])


def is_interpreter_mode() -> bool:
    """True when the kernel was decorated under ``TRITON_INTERPRET=1`` (it then runs on CPU tensors)."""
    return HAS_TRITON and type(_gathered_head_kernel).__name__ == "InterpretedFunction"


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _pick_blocks(n: int, s: int, d: int) -> tuple[int, int, int]:
    """Power-of-two tile sizes: >= 16 on every side (``tl.dot``'s minimum), capped for registers and shared
    memory (BLOCK_S 256 with BLOCK_K 128 and 3+ stages does not fit an H200's)."""
    block_n = min(64, max(16, _next_pow2(n)))
    block_s = min(128, max(16, _next_pow2(s)))
    block_k = min(128, max(16, _next_pow2(d)))
    return block_n, block_s, block_k


def launch_plan(n: int, s: int, d: int) -> dict[str, int]:
    """The default launch for (N, d) rows over S shortlist ids: tile sizes, output tiles and d-ranges (split-K,
    1 by default). For benchmarks and reports; `gathered_lm_head_triton` launches exactly this unless overridden."""
    block_n, block_s, block_k = _pick_blocks(n, s, d)
    tiles = -(-n // block_n) * -(-s // block_s)
    return dict(block_n=block_n, block_s=block_s, block_k=block_k, tiles=tiles, split_k=1)


def _check_block(name: str, value: int) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value}")


def _check_out(out: torch.Tensor, hidden_states: torch.Tensor, num_ids: int) -> None:
    expected = (hidden_states.shape[0], num_ids)
    if tuple(out.shape) != expected:
        raise ValueError(f"out must have shape {expected}, got {tuple(out.shape)}")
    if out.dtype != hidden_states.dtype or out.device != hidden_states.device:
        raise ValueError(
            f"out must be {hidden_states.dtype} on {hidden_states.device}, got {out.dtype} on {out.device}"
        )


def _check_runnable(device: torch.device) -> None:
    if not HAS_TRITON:
        raise RuntimeError(
            "gathered_lm_head_triton needs triton, which is not installed (pip install triton)"
        )
    if device.type == "cpu" and not is_interpreter_mode():
        raise RuntimeError(
            "gathered_lm_head_triton got CPU tensors but Triton's interpreter is off: set "
            "TRITON_INTERPRET=1 before importing dynaspec_gathered_head, or move the tensors to a GPU"
        )


def gathered_lm_head_triton(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    block_s: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """Fused gather + GEMM: logits (N, S) of ``hidden_states`` (N, d) against ``weight[token_ids]``.

    Accumulates in fp32 and writes ``hidden_states.dtype`` into ``out`` (allocated when None; any
    strides are accepted, so ``out`` may be a slice of a larger buffer). Arbitrary strides of
    ``hidden_states`` and ``weight`` are handled without copies. ``block_*`` override the tile
    sizes (powers of two >= 16), so tests can exercise multi-tile tails and the GPU suite can sweep
    them; ``num_warps`` / ``num_stages`` likewise override Triton's launch defaults. ``split_k`` splits the
    d-reduction over that many programs per output tile (fp32 partial sums, then one sum). It is opt-in: on an
    H200 (benchmarks/results/gpu-h200-run3-splitk), doubling it while the output tiles left multiprocessors idle
    sped up the 49k x 4096 shapes but slowed most others, where the partial-sum pass costs more than it recovers.
    """
    check_inputs(hidden_states, weight, token_ids)
    _check_runnable(hidden_states.device)
    n, d = hidden_states.shape
    s = token_ids.shape[0]
    if out is None:
        out = torch.empty((n, s), dtype=hidden_states.dtype, device=hidden_states.device)  # (N, S)
    else:
        _check_out(out, hidden_states, s)
    if n == 0 or s == 0:
        return out
    if d == 0:
        return out.zero_()

    auto_n, auto_s, auto_k = _pick_blocks(n, s, d)
    block_n, block_s, block_k = block_n or auto_n, block_s or auto_s, block_k or auto_k
    for name, value in (("block_n", block_n), ("block_s", block_s), ("block_k", block_k)):
        _check_block(name, value)
    if split_k is not None and split_k < 1:
        raise ValueError(f"split_k must be a positive number of d-ranges, got {split_k}")

    num_stages = DEFAULT_NUM_STAGES if num_stages is None else num_stages
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    ids = token_ids.contiguous()  # (S,)
    is_fp32 = hidden_states.dtype == torch.float32
    split = split_k or 1
    k_per_split = triton.cdiv(triton.cdiv(d, split), block_k) * block_k  # a whole number of BLOCK_K steps
    split = triton.cdiv(d, k_per_split)
    # partial sums (SPLIT, N, S) in fp32 when d is split, summed once below; else the output itself
    target = out if split == 1 else torch.empty((split, n, s), dtype=torch.float32, device=out.device)
    stride_on, stride_os = (out.stride(0), out.stride(1)) if split == 1 else (target.stride(1), target.stride(2))
    _gathered_head_kernel[(triton.cdiv(n, block_n), triton.cdiv(s, block_s), split)](
        hidden_states,
        weight,
        ids,
        target,
        n,
        s,
        d,
        k_per_split,
        hidden_states.stride(0),
        hidden_states.stride(1),
        weight.stride(0),
        weight.stride(1),
        stride_on,
        stride_os,
        0 if split == 1 else target.stride(0),
        BLOCK_N=block_n,
        BLOCK_S=block_s,
        BLOCK_K=block_k,
        # The interpreter's tl.dot multiplies the raw uint16 storage of bf16 tiles; upcast there.
        UPCAST=is_interpreter_mode() and hidden_states.dtype == torch.bfloat16,
        INPUT_PRECISION="ieee" if is_fp32 else None,
        **launch,
    )
    if split > 1:
        out.copy_(target.sum(dim=0))  # (N, S): the d-ranges' fp32 partials added, cast once
    return out

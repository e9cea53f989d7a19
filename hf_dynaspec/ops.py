"""LM-head operators for dynamic-vocabulary drafting: the gathered head and the segmented head.

Both compute logits for a *subset* of the vocabulary, given hidden states ``h`` (N, d) and the
LM-head weight ``W`` (V, d):

    gathered_lm_head:  logits[n, s] = sum_k h[n, k] * W[token_ids[s], k]          -> (N, S)
    segmented_lm_head: logits = h @ concat_i(W[starts[i]:ends[i]]).T               -> (N, sum(ends - starts))
    cluster_lm_head:   row t over the K clusters it chose, in fixed lanes (masked lanes -inf)  -> (N, K * width)

``gathered_lm_head`` dispatches between three backends:

- ``"triton"``: the fused gather + GEMM kernel of ``dynaspec_gathered_head`` (default on CUDA
  when triton is installed; on CPU only under ``TRITON_INTERPRET=1``, for testing).
- ``"torch"``: the best plain-PyTorch path (default otherwise). On CPU it gathers the rows in
  cache-sized chunks into one reused buffer and multiplies each chunk straight into its slice of
  the output. On one core that measured 1.3-5x faster than ``index_select`` (or
  ``F.embedding``) of all rows followed by one ``torch.mm`` (the big gathered copy lands in fresh
  memory and can cost more than the GEMM itself); sorting the ids first did not help. Elsewhere
  it is ``index_select`` + ``torch.mm``.
- ``"reference"``: the readable fp32 spec; always available.

The backend is chosen, first match wins, by the ``backend=`` argument, the innermost
``head_backend(name)`` context, the ``HF_DYNASPEC_HEAD_BACKEND`` environment variable, and else
automatically (``"auto"`` also selects the automatic choice explicitly).

Try it on CPU (from the repository root):

    python -c "import torch; from hf_dynaspec.ops import gathered_lm_head as f; \
print(f(torch.randn(2, 64), torch.randn(1000, 64), torch.arange(0, 1000, 3)).shape)"
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

import torch

__all__ = [
    "BACKENDS",
    "cluster_lm_head",
    "ENV_VAR",
    "gathered_lm_head",
    "head_backend",
    "kernel_for",
    "load_kernel_package",
    "merge_adjacent_ranges",
    "resolve_head_backend",
    "segmented_lm_head",
]

BACKENDS: tuple[str, ...] = ("triton", "torch", "reference")
ENV_VAR = "HF_DYNASPEC_HEAD_BACKEND"
_AUTO = "auto"
_VALID_NAMES: tuple[str, ...] = (_AUTO, *BACKENDS)

# Bytes of gathered rows per CPU thread in one chunk of the "torch" path: small enough to stay in
# L2 between the gather and the GEMM (512 KiB/thread was the knee of a 32 KiB..4 MiB sweep).
_CPU_CHUNK_BYTES_PER_THREAD = 512 * 1024
_MIN_CHUNK_ROWS = 16

_backend_override: ContextVar[str | None] = ContextVar("hf_dynaspec_head_backend", default=None)


# --------------------------------------------------------------------------- kernel package


@functools.cache
def load_kernel_package() -> ModuleType:
    """Import ``dynaspec_gathered_head``: installed, or else from this source checkout.

    Loaded lazily so that importing ``hf_dynaspec.ops`` does not import triton.
    """
    name = "dynaspec_gathered_head"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        package_dir = Path(__file__).resolve().parent.parent / "kernels" / "torch-ext" / name
        init_file = package_dir / "__init__.py"
        if not init_file.is_file():
            raise
    spec = importlib.util.spec_from_file_location(
        name, init_file, submodule_search_locations=[str(package_dir)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {package_dir}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


HUB_KERNEL_ENV = "HF_DYNASPEC_HUB_KERNEL"  # the published kernel's repo id (or a local kernel folder)
HUB_KERNEL_VERSION = 1  # kernels/build.toml [general] version


@functools.cache
def load_hub_kernel(source: str) -> ModuleType | None:
    """The kernel as the Kernel Hub's `kernels` package loads it: `get_kernel(repo_id, version=1)`, or
    `get_local_kernel(folder)` for a local kernel repository. None (with a warning) when `kernels` is not
    installed or loading fails: the in-repo package is then used."""
    try:
        import kernels as kernel_hub
    except ImportError:
        return None
    try:
        if Path(source).is_dir():
            return kernel_hub.get_local_kernel(Path(source))
        return kernel_hub.get_kernel(source, version=HUB_KERNEL_VERSION)
    except Exception as err:  # noqa: BLE001 - any loader failure falls back to the in-repo kernel
        warnings.warn(f"could not load the gathered-head kernel {source!r} from the Kernel Hub ({err}); "
                      "using the in-repo kernel", stacklevel=2)
        return None


def kernel_for(device: torch.device) -> ModuleType:
    """The gathered-head kernel package for tensors on `device`: the Kernel Hub's build when
    `$HF_DYNASPEC_HUB_KERNEL` names one, `kernels` is installed and the device is a GPU; else the in-repo
    package (CPU runs, tests under TRITON_INTERPRET=1)."""
    source = os.environ.get(HUB_KERNEL_ENV, "").strip()
    if source and device.type == "cuda":
        hub = load_hub_kernel(source)
        if hub is not None:
            return hub
    return load_kernel_package()


# --------------------------------------------------------------------------- backend choice


def _validate_name(name: str, source: str) -> str:
    normalized = name.strip().lower()
    if normalized not in _VALID_NAMES:
        raise ValueError(f"unknown head backend {name!r} (from {source}); valid: {', '.join(_VALID_NAMES)}")
    return normalized


@contextlib.contextmanager
def head_backend(name: str) -> Iterator[None]:
    """Use backend ``name`` for ``gathered_lm_head`` calls inside the block (unless overridden
    by an explicit ``backend=`` argument). Nested blocks: the innermost wins."""
    token = _backend_override.set(_validate_name(name, "head_backend()"))
    try:
        yield
    finally:
        _backend_override.reset(token)


def _requested_backend(backend: str | None) -> str:
    if backend is not None:
        return _validate_name(backend, "the backend= argument")
    override = _backend_override.get()
    if override is not None:
        return override
    env_value = os.environ.get(ENV_VAR, "").strip()
    if env_value:
        return _validate_name(env_value, f"${ENV_VAR}")
    return _AUTO


def _check_triton_usable(device: torch.device) -> None:
    kernels = load_kernel_package()
    if not kernels.HAS_TRITON:
        raise RuntimeError("head backend 'triton' requested but triton is not installed (pip install triton)")
    if device.type == "cuda":
        return
    if device.type == "cpu" and kernels.is_interpreter_mode():
        return
    if device.type == "cpu":
        raise RuntimeError(
            "head backend 'triton' requested for CPU tensors, which needs Triton's interpreter: set "
            "TRITON_INTERPRET=1 before dynaspec_gathered_head is first imported, or use 'torch'"
        )
    raise RuntimeError(f"head backend 'triton' supports cuda (and cpu when interpreted), not {device.type}")


def resolve_head_backend(
    device: torch.device, backend: str | None = None, *, requires_grad: bool = False
) -> str:
    """The backend ``gathered_lm_head`` would use for tensors on ``device``; raises if unusable.

    ``requires_grad``: autograd must see the result. The Triton kernel has no backward, so the
    automatic choice is then "torch", and an explicit "triton" is an error.
    """
    name = _requested_backend(backend)
    if name == _AUTO:
        if device.type == "cuda" and not requires_grad and load_kernel_package().HAS_TRITON:
            return "triton"
        return "torch"
    if name == "triton":
        _check_triton_usable(device)
        if requires_grad:
            raise RuntimeError("head backend 'triton' has no backward: use 'torch' when gradients are needed")
    return name


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors)


# --------------------------------------------------------------------------- torch backend


def _chunk_rows(d: int, element_size: int) -> int:
    budget = _CPU_CHUNK_BYTES_PER_THREAD * max(1, torch.get_num_threads())
    return max(_MIN_CHUNK_ROWS, budget // max(1, d * element_size))


def _gathered_head_cpu_chunked(
    hidden_states: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """Gather ``chunk`` rows into a reused buffer, multiply them straight into the output slice."""
    n, d = hidden_states.shape
    s = token_ids.shape[0]
    out = torch.empty((n, s), dtype=hidden_states.dtype)  # (N, S)
    if s == 0:
        return out
    chunk = min(s, _chunk_rows(d, weight.element_size()))
    buffer = torch.empty((chunk, d), dtype=weight.dtype)  # (chunk, d), reused
    for start in range(0, s, chunk):
        stop = min(s, start + chunk)
        rows = buffer[: stop - start]  # (c, d)
        torch.index_select(weight, 0, token_ids[start:stop], out=rows)
        torch.mm(hidden_states, rows.T, out=out[:, start:stop])  # (N, c)
    return out


def _gathered_head_torch(
    hidden_states: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    ids = token_ids.long()
    if hidden_states.device.type == "cpu" and not _needs_grad(hidden_states, weight):
        return _gathered_head_cpu_chunked(hidden_states, weight, ids)  # out= writes: no autograd
    return torch.mm(hidden_states, weight.index_select(0, ids).T)  # (N, S)


# --------------------------------------------------------------------------- public ops


def gathered_lm_head(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Logits over a vocabulary shortlist: ``hidden_states`` (N, d), ``weight`` (V, d),
    ``token_ids`` (S,) int32/int64 -> (N, S) in ``hidden_states.dtype``, where

        logits[n, s] = sum_k hidden_states[n, k] * weight[token_ids[s], k]

    accumulated in fp32 (the "torch" backend relies on the BLAS for that with half inputs).
    ``backend`` is one of "auto", "triton", "torch", "reference" (see the module docstring for
    the other ways to choose). Raises ``ValueError`` on malformed inputs or an unknown backend
    and ``RuntimeError`` when "triton" is requested but cannot run here.
    """
    kernels = load_kernel_package()
    kernels.check_inputs(hidden_states, weight, token_ids)
    name = resolve_head_backend(
        hidden_states.device, backend, requires_grad=_needs_grad(hidden_states, weight)
    )
    if name == "triton":
        return kernel_for(hidden_states.device).gathered_lm_head_triton(hidden_states, weight, token_ids)
    if name == "reference":
        return kernels.gathered_lm_head_reference(hidden_states, weight, token_ids)
    return _gathered_head_torch(hidden_states, weight, token_ids)


def cluster_lm_head(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    row_ids: torch.Tensor,
    offsets: torch.Tensor,
    clusters: torch.Tensor,
    width: int,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Each row's fp32 logits over its own clusters, in fixed lanes: ``hidden_states`` (T, d), ``weight`` (V, d),
    the cluster layout ``row_ids`` (V,) / ``offsets`` (M + 1,), ``clusters`` (T, K) (-1: unused) -> (T, K * width),
    lane j of slot k the j-th token of cluster clusters[t, k], -inf past its end (the kernel package's
    ``cluster_head.py`` has the definition). No host read and no data-dependent shape, whatever the backend:
    "triton" (the fused walk, default on CUDA), "torch" (gather + batched GEMV) or "reference"."""
    load_kernel_package().check_cluster_inputs(hidden_states, weight, row_ids, offsets, clusters, width)
    impl = cluster_head_impl(hidden_states.device, backend, requires_grad=_needs_grad(hidden_states, weight))
    return impl(hidden_states, weight, row_ids, offsets, clusters, width)


def cluster_head_impl(
    device: torch.device, backend: str | None = None, *, requires_grad: bool = False
) -> Callable[..., torch.Tensor]:
    """The `cluster_lm_head` implementation for tensors on `device`, resolved once: a draft step that holds it
    makes no import, environment read or backend choice per call, so it compiles whole."""
    kernels = load_kernel_package()
    name = resolve_head_backend(device, backend, requires_grad=requires_grad)
    if name == "triton":
        return kernels.cluster_lm_head_triton
    if name == "reference":
        return kernels.cluster_lm_head_reference
    return functools.partial(_cluster_head_torch, kernels.cluster_lanes)


def _cluster_head_torch(cluster_lanes, hidden_states, weight, row_ids, offsets, clusters, width) -> torch.Tensor:
    ids, live = cluster_lanes(row_ids, offsets, clusters, width)  # (T, S) each
    logits = torch.bmm(weight[ids], hidden_states[:, :, None]).squeeze(-1).float()  # (T, S, d) @ (T, d, 1)
    return logits.masked_fill(~live, float("-inf"))


def merge_adjacent_ranges(starts: Sequence[int], ends: Sequence[int]) -> list[tuple[int, int]]:
    """Drop empty ranges and fuse ``[a, b), [b, c)`` into ``[a, c)``, keeping the order.

    The concatenation of the returned ranges equals the concatenation of the input ranges, so
    the output columns of ``segmented_lm_head`` do not move.
    """
    merged: list[tuple[int, int]] = []
    for start, end in zip(starts, ends, strict=True):
        start, end = int(start), int(end)
        if start == end:
            continue
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _check_segmented_inputs(
    hidden_states: torch.Tensor, weight: torch.Tensor, starts: Sequence[int], ends: Sequence[int]
) -> None:
    if hidden_states.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"hidden_states (N, d) and weight (V, d) must be 2-D, got shapes "
            f"{tuple(hidden_states.shape)} and {tuple(weight.shape)}"
        )
    if hidden_states.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden size mismatch: hidden_states has d={hidden_states.shape[1]}, weight has d={weight.shape[1]}"
        )
    if hidden_states.dtype != weight.dtype or hidden_states.device != weight.device:
        raise ValueError(
            f"hidden_states ({hidden_states.dtype}, {hidden_states.device}) and weight "
            f"({weight.dtype}, {weight.device}) must share dtype and device"
        )
    if len(starts) != len(ends):
        raise ValueError(f"starts and ends must have the same length, got {len(starts)} and {len(ends)}")
    vocab = weight.shape[0]
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        if not 0 <= start <= end <= vocab:
            raise ValueError(f"range {i} = [{start}, {end}) is not within [0, {vocab}] with start <= end")


def segmented_lm_head(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    starts: Sequence[int],
    ends: Sequence[int],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits over contiguous row ranges of the weight: ``hidden_states`` (N, d), ``weight``
    (V, d) -> (N, T) with T = sum_i (ends[i] - starts[i]), where

        logits = hidden_states @ concat_i(weight[starts[i]:ends[i]]).T

    One ``torch.mm`` per range on a view of the weight (no copy), written straight into its
    column slice of ``out`` (allocated when None). Adjacent ranges are merged first, so a
    cluster-sorted weight layout with consecutive clusters costs one GEMM. This is the drafter's
    CPU fast path: it reads only the selected rows, like the gathered head, without the gather.
    """
    _check_segmented_inputs(hidden_states, weight, starts, ends)
    ranges = merge_adjacent_ranges(starts, ends)
    expected = (hidden_states.shape[0], sum(end - start for start, end in ranges))
    if out is None and _needs_grad(hidden_states, weight):  # out= writes would cut the autograd graph
        pieces = [hidden_states @ weight[start:end].T for start, end in ranges]  # (N, width) each
        return torch.cat(pieces, dim=1) if pieces else hidden_states.new_empty(expected)
    if out is None:
        out = torch.empty(expected, dtype=hidden_states.dtype, device=hidden_states.device)  # (N, T)
    elif (
        tuple(out.shape) != expected or out.dtype != hidden_states.dtype or out.device != hidden_states.device
    ):
        raise ValueError(
            f"out must be {hidden_states.dtype} {expected} on {hidden_states.device}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    column = 0
    for start, end in ranges:
        width = end - start
        torch.mm(hidden_states, weight[start:end].T, out=out[:, column : column + width])  # (N, width)
        column += width
    return out

"""Gathered / segmented LM head: Triton kernel, reference, dispatcher, input checks.

Run (CPU, the Triton kernel under its interpreter; a few seconds):

    python -m pytest tests/test_kernels.py

Every implementation is compared with the spec ``h @ W[ids].T`` evaluated in fp64 (exact for
these magnitudes up to ~1e-16 relative) under one tolerance (see ``assert_matches_spec``):

- fp32 accumulation: any order of summing d fp32 products is within gamma_d ~ d * u of the exact
  sum, relative to sum_k |h_k w_k| (u = 2^-24); we allow 2 * d * eps32 * (|h| @ |W_s|.T) with
  eps32 = 2^-23, i.e. 4x that bound, so blocked / FMA / pairwise orders all pass.
- bf16 / fp16 outputs: the fp32 result is rounded once to the storage dtype, a relative error of
  at most u = 2^-8 / 2^-11 (half an ulp); we add rtol * |spec| elementwise with rtol = 2u =
  2^-7 (bf16) / 2^-10 (fp16), one full ulp. fp32 outputs get no rounding term.

Interpreter dtype limits (triton 3.9): fp32 and fp16 run as is. bf16 tiles are stored as raw
uint16 in the interpreter and its ``tl.dot`` multiplies those integers (giving ~1e10 garbage), so
the wrapper upcasts bf16 tiles to fp32 before ``tl.dot`` when interpreted; compiled CUDA runs
use bf16 tensor cores directly. No dtype needs a skip.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is first imported

import pytest  # noqa: E402
import torch  # noqa: E402

from hf_dynaspec import ops  # noqa: E402

kernels = ops.load_kernel_package()

EPS32 = 2.0**-23
RTOL = {torch.float32: 0.0, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
S_VALUES = (1, 7, 33, 100, 257)
N_VALUES = (1, 3, 17, 64)
D_VALUES = (16, 40, 96)
VOCAB = 300
DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)

# Devices the Triton kernel can run on here: CUDA when compiled, CPU (and CUDA) when interpreted.
TRITON_DEVICES = tuple(
    device for device in DEVICES if kernels.HAS_TRITON and (device == "cuda" or kernels.is_interpreter_mode())
)
TRITON_DEVICE = TRITON_DEVICES[-1] if TRITON_DEVICES else "cpu"
needs_triton = pytest.mark.skipif(
    not TRITON_DEVICES, reason="triton missing, or CPU-only without TRITON_INTERPRET=1 at import"
)
needs_interpreter = pytest.mark.skipif(
    not (kernels.HAS_TRITON and kernels.is_interpreter_mode()), reason="needs TRITON_INTERPRET=1 at import"
)


def make_inputs(
    n: int, s: int, d: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen).to(device=device, dtype=dtype)  # (N, d)
    weight = torch.randn(VOCAB, d, generator=gen).to(device=device, dtype=dtype)  # (V, d)
    ids = torch.randint(0, VOCAB, (s,), generator=gen).to(device)  # (S,) with repeats
    return hidden, weight, ids


def assert_matches_spec(
    actual: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor
) -> None:
    """Elementwise |actual - spec| <= 2 d eps32 (|h| @ |W_s|.T) + rtol(dtype) |spec| (fp64 spec)."""
    assert actual.shape == (hidden.shape[0], ids.shape[0])
    assert actual.dtype == hidden.dtype
    h32, rows32 = hidden.double(), weight.double()[ids.long()]  # exact products and sums
    spec = h32 @ rows32.T  # (N, S)
    magnitude = h32.abs() @ rows32.abs().T  # (N, S): sum_k |h_k w_k|
    tol = 2 * hidden.shape[1] * EPS32 * magnitude + RTOL[hidden.dtype] * spec.abs()
    err = (actual.double() - spec).abs()
    worst = (err - tol).argmax()
    assert bool((err <= tol).all()), f"err {err.flatten()[worst]:.3g} > tol {tol.flatten()[worst]:.3g}"


SHAPES = list(itertools.product(S_VALUES, N_VALUES, D_VALUES))


# --------------------------------------------------------------------------- numerics


@needs_triton
@pytest.mark.parametrize("device", TRITON_DEVICES or ("cpu",))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("s", "n", "d"), SHAPES)
def test_triton_matches_spec(s: int, n: int, d: int, dtype: torch.dtype, device: str) -> None:
    hidden, weight, ids = make_inputs(n, s, d, dtype, device)
    assert_matches_spec(kernels.gathered_lm_head_triton(hidden, weight, ids), hidden, weight, ids)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("s", "n", "d"), SHAPES)
def test_torch_paths_match_spec(s: int, n: int, d: int, dtype: torch.dtype) -> None:
    hidden, weight, ids = make_inputs(n, s, d, dtype)
    assert_matches_spec(kernels.gathered_lm_head_reference(hidden, weight, ids), hidden, weight, ids)
    assert_matches_spec(ops.gathered_lm_head(hidden, weight, ids, backend="torch"), hidden, weight, ids)
    assert_matches_spec(hidden @ weight[ids].T, hidden, weight, ids)


def test_reference_is_rounded_fp32_spec() -> None:
    hidden, weight, ids = make_inputs(5, 33, 40, torch.bfloat16)
    expected = (hidden.float() @ weight.float()[ids].T).to(torch.bfloat16)
    torch.testing.assert_close(
        kernels.gathered_lm_head_reference(hidden, weight, ids), expected, rtol=0, atol=0
    )


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_multi_tile_tails(dtype: torch.dtype) -> None:
    """16-wide tiles so N, S and d each span several tiles with a ragged last one."""
    hidden, weight, ids = make_inputs(37, 100, 40, dtype, TRITON_DEVICE)
    out = kernels.gathered_lm_head_triton(hidden, weight, ids, block_n=16, block_s=16, block_k=16)
    assert_matches_spec(out, hidden, weight, ids)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("split_k", [2, 3, 9])
def test_triton_split_k_sums_the_d_ranges(dtype: torch.dtype, split_k: int) -> None:
    """d = 100 over 16-wide steps split into 2, 3 or 9 ranges (the last ragged; 9 asks for more ranges than
    d has steps, so fewer are launched), written into a slice of a larger buffer."""
    hidden, weight, ids = make_inputs(21, 50, 100, dtype, TRITON_DEVICE)
    buffer = torch.full((21, 60), float("nan"), dtype=dtype, device=TRITON_DEVICE)
    out = kernels.gathered_lm_head_triton(
        hidden, weight, ids, out=buffer[:, 5:55], block_n=16, block_s=16, block_k=16, split_k=split_k
    )
    assert_matches_spec(out, hidden, weight, ids)
    assert torch.isnan(buffer[:, :5]).all() and torch.isnan(buffer[:, 55:]).all()
    with pytest.raises(ValueError, match="split_k"):
        kernels.gathered_lm_head_triton(hidden, weight, ids, split_k=0)


@needs_triton
def test_triton_strided_inputs_int32_ids_and_out_slice() -> None:
    device = TRITON_DEVICE
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(40, VOCAB, generator=gen).to(device).T  # (V, d) with strides (1, V)
    hidden = torch.randn(40, 6, generator=gen).to(device)[:, ::2].T  # (3, 40), non-contiguous
    ids = torch.randint(0, VOCAB, (70,), generator=gen, dtype=torch.int32).to(device)
    buffer = torch.full((3, 100), float("nan"), device=device)
    result = kernels.gathered_lm_head_triton(hidden, weight, ids, out=buffer[:, 10:80])
    assert result.data_ptr() == buffer[:, 10:80].data_ptr()
    assert_matches_spec(buffer[:, 10:80], hidden, weight, ids)
    assert torch.isnan(buffer[:, :10]).all() and torch.isnan(buffer[:, 80:]).all()


@needs_triton
def test_triton_empty_shapes() -> None:
    hidden, weight, ids = make_inputs(4, 0, 16, torch.float32, TRITON_DEVICE)
    assert kernels.gathered_lm_head_triton(hidden, weight, ids).shape == (4, 0)
    assert kernels.gathered_lm_head_triton(hidden[:0], weight, ids[:0]).shape == (0, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_backend_spans_several_chunks(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "_CPU_CHUNK_BYTES_PER_THREAD", 1)  # -> _MIN_CHUNK_ROWS rows per chunk
    hidden, weight, ids = make_inputs(3, 257, 40, dtype)
    assert_matches_spec(ops.gathered_lm_head(hidden, weight, ids, backend="torch"), hidden, weight, ids)


# --------------------------------------------------------------------------- segmented head


def concat_ids(starts: list[int], ends: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in zip(starts, ends, strict=True)])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_segmented_equals_reference_on_concatenated_ids(dtype: torch.dtype) -> None:
    hidden, weight, _ = make_inputs(5, 0, 40, dtype)
    starts, ends = [200, 0, 57, 120, 299], [260, 13, 58, 120, 300]  # unsorted, unit, empty, last row
    out = ops.segmented_lm_head(hidden, weight, starts, ends)
    ids = concat_ids(starts, ends)
    assert_matches_spec(out, hidden, weight, ids)
    torch.testing.assert_close(out, kernels.gathered_lm_head_reference(hidden, weight, ids))


def test_merge_adjacent_ranges() -> None:
    assert ops.merge_adjacent_ranges([0, 10, 30, 40, 45], [10, 20, 40, 40, 50]) == [
        (0, 20),
        (30, 40),
        (45, 50),
    ]
    assert ops.merge_adjacent_ranges([5, 0], [9, 5]) == [(5, 9), (0, 5)]  # order kept: not adjacent in order
    assert ops.merge_adjacent_ranges([], []) == []
    assert ops.merge_adjacent_ranges(torch.tensor([0, 4]), torch.tensor([4, 8])) == [(0, 8)]


def test_segmented_merges_into_one_mm_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    hidden, weight, _ = make_inputs(2, 0, 16, torch.float32)
    starts, ends = [0, 10, 20, 50], [10, 20, 30, 64]
    calls: list[tuple[int, ...]] = []
    real_mm = torch.mm

    def counting_mm(a: torch.Tensor, b: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(b.shape))
        return real_mm(a, b, **kwargs)

    monkeypatch.setattr(ops.torch, "mm", counting_mm)
    out = ops.segmented_lm_head(hidden, weight, starts, ends)
    monkeypatch.undo()
    assert calls == [(16, 30), (16, 14)]
    torch.testing.assert_close(out, hidden @ weight[concat_ids(starts, ends)].T)


def test_segmented_writes_into_given_out_and_checks_it() -> None:
    hidden, weight, _ = make_inputs(3, 0, 16, torch.float32)
    out = torch.empty(3, 25)
    assert ops.segmented_lm_head(hidden, weight, [100, 0], [110, 15], out=out) is out
    torch.testing.assert_close(out, hidden @ weight[concat_ids([100, 0], [110, 15])].T)
    with pytest.raises(ValueError, match="out must be"):
        ops.segmented_lm_head(hidden, weight, [0], [10], out=out)


@pytest.mark.parametrize(
    ("starts", "ends", "match"),
    [
        ([0, 5], [5], "same length"),
        ([10], [5], "not within"),
        ([0], [VOCAB + 1], "not within"),
        ([-1], [3], "not within"),
    ],
)
def test_segmented_rejects_bad_ranges(starts: list[int], ends: list[int], match: str) -> None:
    hidden, weight, _ = make_inputs(2, 0, 16, torch.float32)
    with pytest.raises(ValueError, match=match):
        ops.segmented_lm_head(hidden, weight, starts, ends)


# --------------------------------------------------------------------------- dispatcher


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(ops.ENV_VAR, raising=False)
    return monkeypatch


CPU = torch.device("cpu")


def test_auto_backend_on_cpu_is_torch(clean_env: pytest.MonkeyPatch) -> None:
    assert ops.resolve_head_backend(CPU) == "torch"
    assert ops.resolve_head_backend(CPU, "auto") == "torch"


def test_override_precedence_argument_context_env(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(ops.ENV_VAR, "reference")
    assert ops.resolve_head_backend(CPU) == "reference"
    with ops.head_backend("torch"):
        assert ops.resolve_head_backend(CPU) == "torch"
        with ops.head_backend("Reference"):  # case-insensitive; innermost wins
            assert ops.resolve_head_backend(CPU) == "reference"
        assert ops.resolve_head_backend(CPU) == "torch"
        assert ops.resolve_head_backend(CPU, "reference") == "reference"
    assert ops.resolve_head_backend(CPU) == "reference"


def test_dispatch_calls_the_chosen_backend(clean_env: pytest.MonkeyPatch) -> None:
    hidden, weight, ids = make_inputs(2, 9, 16, torch.float32)
    used: list[str] = []

    def spy(name: str):
        def record(hidden_states: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
            used.append(name)
            return hidden_states

        return record

    clean_env.setattr(kernels, "gathered_lm_head_reference", spy("reference"))
    clean_env.setattr(ops, "_gathered_head_torch", spy("torch"))
    ops.gathered_lm_head(hidden, weight, ids)
    ops.gathered_lm_head(hidden, weight, ids, backend="reference")
    with ops.head_backend("reference"):
        ops.gathered_lm_head(hidden, weight, ids)
        ops.gathered_lm_head(hidden, weight, ids, backend="torch")
    clean_env.setenv(ops.ENV_VAR, "reference")
    ops.gathered_lm_head(hidden, weight, ids)
    assert used == ["torch", "reference", "reference", "torch", "reference"]


@needs_interpreter
def test_dispatch_triton_backend_on_cpu_interpreter(clean_env: pytest.MonkeyPatch) -> None:
    hidden, weight, ids = make_inputs(3, 33, 40, torch.float16)
    assert_matches_spec(ops.gathered_lm_head(hidden, weight, ids, backend="triton"), hidden, weight, ids)


def test_unknown_backend_lists_valid_ones(clean_env: pytest.MonkeyPatch) -> None:
    valid = "auto, triton, torch, reference"
    with pytest.raises(ValueError, match=f"unknown head backend 'cuda'.*{valid}"):
        ops.resolve_head_backend(CPU, "cuda")
    with pytest.raises(ValueError, match=f"head_backend.*{valid}"):
        with ops.head_backend("fast"):
            pass
    clean_env.setenv(ops.ENV_VAR, "tritonn")
    hidden, weight, ids = make_inputs(1, 2, 16, torch.float32)
    with pytest.raises(ValueError, match=f"'tritonn'.*{ops.ENV_VAR}.*{valid}"):
        ops.gathered_lm_head(hidden, weight, ids)


def test_triton_without_triton_installed_is_a_clear_error(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(kernels, "HAS_TRITON", False)
    with pytest.raises(RuntimeError, match="triton is not installed"):
        ops.resolve_head_backend(CPU, "triton")
    assert ops.resolve_head_backend(torch.device("cuda"), "auto") == "torch"


def test_triton_on_cpu_without_interpreter_is_a_clear_error(clean_env: pytest.MonkeyPatch) -> None:
    if not kernels.HAS_TRITON:
        pytest.skip("triton is not installed")
    clean_env.setattr(kernels, "is_interpreter_mode", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        ops.resolve_head_backend(CPU, "triton")


def test_kernel_package_imports_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load a second copy of the package while ``import triton`` fails."""
    package_dir = Path(kernels.__file__).parent
    alias = "dynaspec_gathered_head_no_triton"
    for name in ("triton", "triton.language"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import triton` raise ImportError
    spec = importlib.util.spec_from_file_location(
        alias, package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, alias, module)
    spec.loader.exec_module(module)
    try:
        assert module.HAS_TRITON is False
        hidden, weight, ids = make_inputs(2, 5, 16, torch.float32)
        assert_matches_spec(module.gathered_lm_head_reference(hidden, weight, ids), hidden, weight, ids)
        with pytest.raises(RuntimeError, match="needs triton"):
            module.gathered_lm_head_triton(hidden, weight, ids)
    finally:
        for name in (f"{alias}.reference", f"{alias}.triton_kernel"):
            sys.modules.pop(name, None)


# --------------------------------------------------------------------------- bad inputs


def _entry_points() -> list:
    points = [
        pytest.param(ops.gathered_lm_head, id="dispatcher"),
        pytest.param(kernels.gathered_lm_head_reference, id="reference"),
    ]
    if kernels.HAS_TRITON:
        points.append(pytest.param(kernels.gathered_lm_head_triton, id="triton"))
    return points


BAD_INPUTS = {
    "mismatched_d": (
        (torch.randn(2, 16), torch.randn(10, 8), torch.arange(3)),
        "hidden size mismatch.*d=16.*d=8",
    ),
    "hidden_1d": ((torch.randn(16), torch.randn(10, 16), torch.arange(3)), "hidden_states must be 2-D"),
    "float_ids": (
        (torch.randn(2, 16), torch.randn(10, 16), torch.arange(3.0)),
        "token_ids must be int32 or int64",
    ),
    "ids_2d": (
        (torch.randn(2, 16), torch.randn(10, 16), torch.zeros(2, 2, dtype=torch.long)),
        "token_ids must be 1-D",
    ),
    "weight_1d": ((torch.randn(2, 16), torch.randn(16), torch.arange(3)), "weight must be 2-D"),
    "float64": (
        (torch.randn(2, 16).double(), torch.randn(10, 16).double(), torch.arange(3)),
        "float32/bfloat16",
    ),
    "dtype_mismatch": ((torch.randn(2, 16), torch.randn(10, 16).half(), torch.arange(3)), "dtype mismatch"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("entry", _entry_points())
def test_bad_inputs_raise_value_error_naming_the_problem(entry, case: str) -> None:
    args, match = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=match):
        entry(*args)


def test_segmented_bad_inputs() -> None:
    with pytest.raises(ValueError, match="hidden size mismatch"):
        ops.segmented_lm_head(torch.randn(2, 16), torch.randn(10, 8), [0], [3])
    with pytest.raises(ValueError, match="must be 2-D"):
        ops.segmented_lm_head(torch.randn(16), torch.randn(10, 16), [0], [3])


# --------------------------------------------------------------------------- autograd


def test_torch_paths_are_differentiable(clean_env: pytest.MonkeyPatch) -> None:
    hidden, weight, ids = make_inputs(3, 40, 16, torch.float32)
    starts, ends = [10, 100], [30, 120]
    for fn, cols in (
        (lambda h, w: ops.gathered_lm_head(h, w, ids), ids),
        (lambda h, w: ops.segmented_lm_head(h, w, starts, ends), concat_ids(starts, ends)),
    ):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        fn(h, w).square().sum().backward()
        h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        (h_ref @ w_ref[cols].T).square().sum().backward()
        torch.testing.assert_close(h.grad, h_ref.grad)
        torch.testing.assert_close(w.grad, w_ref.grad)


def test_triton_refuses_autograd_inputs(clean_env: pytest.MonkeyPatch) -> None:
    assert ops.resolve_head_backend(torch.device("cuda"), requires_grad=True) == "torch"
    if not kernels.HAS_TRITON:
        pytest.skip("triton is not installed")
    clean_env.setattr(kernels, "is_interpreter_mode", lambda: True)
    with pytest.raises(RuntimeError, match="no backward"):
        ops.resolve_head_backend(CPU, "triton", requires_grad=True)


# ---------------------------------------------------------------------------------------------- Kernel Hub layout


def test_the_kernel_folder_follows_the_kernel_hub_layout():
    import json
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[1] / "kernels"
    general = tomllib.loads((root / "build.toml").read_text())["general"]
    assert re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", general["name"]) and general["version"] == ops.HUB_KERNEL_VERSION
    for backend in general["backends"]:
        variant = root / "build" / f"torch-{backend}"
        metadata = json.loads((variant / "metadata.json").read_text())
        assert metadata["name"] == general["name"] and metadata["version"] == general["version"]
        assert metadata["backend"]["type"] == backend
        assert (variant / general["name"].replace("-", "_") / "__init__.py").is_file()


def test_the_kernels_package_loads_the_local_build_and_the_dispatcher_prefers_it_on_gpus(monkeypatch):
    from pathlib import Path

    pytest.importorskip("kernels")
    folder = str(Path(__file__).resolve().parents[1] / "kernels")
    ops.load_hub_kernel.cache_clear()
    monkeypatch.setenv(ops.HUB_KERNEL_ENV, folder)
    hub = ops.kernel_for(torch.device("cuda"))  # a GPU device asks for the Hub build (loaded here for CPU)
    assert hub is not ops.load_kernel_package() and hub.__name__.startswith("_dynaspec_gathered_head")
    h, w, ids = torch.randn(3, 40), torch.randn(500, 40), torch.arange(0, 500, 7)
    torch.testing.assert_close(hub.gathered_lm_head_triton(h, w, ids), kernels.gathered_lm_head_reference(h, w, ids))
    assert ops.kernel_for(torch.device("cpu")) is ops.load_kernel_package()  # CPU runs use the in-repo package
    monkeypatch.setenv(ops.HUB_KERNEL_ENV, "")
    assert ops.kernel_for(torch.device("cuda")) is ops.load_kernel_package()  # nothing named: in-repo
    ops.load_hub_kernel.cache_clear()

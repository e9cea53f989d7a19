"""The GPU suite: every figure a GPU session should bring back, in one resumable script.

Sections (`--sections`, default all), each saved as `<out>/sections/<name>.json` when it finishes and skipped
on a rerun while that file exists (`--force` redoes it; a file from a `--quick` run or another device is redone):

- head:      the gathered LM head in `--dtype` (bf16): Triton (`gathered_lm_head(..., backend="triton")`) vs
             index_select + matmul vs the dense head, for V in {49152, 128256, 262144}, d in {576, 4096},
             shortlists of 2% / 5% / 12.5% of V and 1 / 8 / 64 rows. Median ms of timed calls after warm-up
             (CUDA events; CPU: perf_counter), Triton's speedup over index_select + matmul, and the HBM roofline:
             the bytes that must move (shortlist rows S x d + hidden N x d + output N x S, in the dtype's bytes,
             + the S int64 ids) / `--peak-gbps`, and the fraction of it each method achieves.
- verify:    the target's verification cost c(n)/c(1) for n in {1, 2, 4, 8, 16, 32, 48, 64} new tokens on a
             random-weight Llama of Llama-3.1-8B shape (bf16, built on the device, nothing downloaded) after
             512 and 2048 cached tokens: with a random tree's 4D mask (as verification runs) and plain causal
             (no mask passed), the cache cropped back after every forward.
- drafter:   one drafter step (layer + router + head) over 1 / 8 / 32 draft positions per head mode ("full",
             "static", "dynamic") for SmolLM2- and Llama-3.1-8B-shaped targets (the target is built on the meta
             device; only its embeddings and LM head are materialised), with the router on its CUDA side stream
             (`run_router_beside`) and run before the layer ("sequential"); plus the router and head alone.
- exactness: speculative greedy (`target.generate(ids, assistant_model=drafter)`) vs plain greedy on random
             targets (tiny Llama, tiny Qwen2, SmolLM2-shaped Llama) in fp32 and bf16, a few prompts, the
             drafter's default tree for the device and the CPU-sized one (12 nodes, depth 5): share of
             identical outputs, the first divergence and the target's logit gap there (plain pick - speculative
             pick).
- syncs:     host synchronisations per decoding step (`HostSyncCounter` around each `speculative_step`): mean,
             max, tokens per step, by kind, for the tiny and the SmolLM2-shaped target.
- trees:     one decoding step, end to end, with each candidate default tree of `benchmarks/device_tree.py` on
             the verify section's target (512 prompt tokens, a random drafter): ms per step and its cost in
             plain decoding steps, which device_tree.py then uses instead of its model.

Results: `<out>/results.json` (every section, the device, torch / triton / transformers versions, a timestamp,
the errors of this run) and `<out>/results.md` (tables made from results.json); `<out>/log.txt` logs runs and
skips. A failing section is logged and left unsaved (a rerun retries it); the others still run.

    python benchmarks/gpu_suite.py --out benchmarks/results/gpu-h200          # the GPU run (H200: a few minutes)
    python benchmarks/gpu_suite.py --quick --out /tmp/gpu-suite                # CPU smoke run, tiny shapes, < 1 min

`--quick` shrinks every shape (tiny V, d, layers; fewer rows, nodes, prompts, repeats). On CPU the Triton
backend is skipped (noted in the results) unless `--triton-interpret` runs it under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import torch
import transformers
from tqdm.auto import tqdm
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a source checkout
if "--triton-interpret" in sys.argv[1:]:  # triton reads it when first imported (importing hf_dynaspec does)
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "") == "1"

try:  # a transformers release the hook refuses must not cost the sections that need no package
    import hf_dynaspec  # noqa: F401, E402  (installs the generate() hook)
    from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter, DynaSpecGenerationConfig  # noqa: E402
    from hf_dynaspec import modeling as dynaspec_modeling  # noqa: E402
    from hf_dynaspec.clustering import VocabClusters  # noqa: E402
    from hf_dynaspec.generation import decoding  # noqa: E402
    from hf_dynaspec.generation.syncs import HostSyncCounter  # noqa: E402
    from hf_dynaspec.generation.verify import crop_cache  # noqa: E402
    from hf_dynaspec.masks import target_masks  # noqa: E402

    PACKAGE_ERROR: str | None = None
except Exception as err:  # noqa: BLE001
    PACKAGE_ERROR = f"import hf_dynaspec failed: {type(err).__name__}: {err}"

SECTIONS = ("head", "verify", "drafter", "exactness", "syncs", "trees")
TIMED_HEAD_MODES = ("full", "static", "dynamic")
COLD_CACHE_BYTES = 256 * 2**20
ROUTER_PLACEMENTS = ("beside", "sequential")

# Random targets (Llama fields unless a family says otherwise); eos/pad None: generation runs to max_new_tokens.
BASE_FIELDS = dict(max_position_embeddings=8192, bos_token_id=0, eos_token_id=None, pad_token_id=None,
                   tie_word_embeddings=False)
LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256)
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256)
QUICK_SMOLLM2 = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=512, tie_word_embeddings=True)
QUICK_LLAMA = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=256, vocab_size=1024)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
# default: the drafter's own tree for the device (a fresh drafter's on CUDA: DEFAULT_DEVICE_TREES["cuda"])
TREES = {"default": {}, "cpu-tree": {"num_draft_nodes": 12, "draft_depth": 5, "draft_top_k": 4}}


@dataclass(frozen=True)
class Plan:
    """The sizes of every section: FULL for the GPU run, QUICK for a CPU smoke run."""

    head_vocab: tuple[int, ...]
    head_dims: tuple[int, ...]
    head_shares: tuple[float, ...]  # shortlist size / V
    head_rows: tuple[int, ...]
    repeats: int
    warmup: int
    verify_model: dict[str, Any]
    verify_contexts: tuple[int, ...]
    verify_nodes: tuple[int, ...]
    drafter_targets: dict[str, dict[str, Any]]
    drafter_rows: tuple[int, ...]
    drafter_context: int
    num_clusters: int
    exact_targets: dict[str, tuple[str, dict[str, Any]]]  # name -> (family, config fields)
    prompts: int
    prompt_length: int
    new_tokens: int
    sync_targets: tuple[str, ...]
    tune_cases: tuple[tuple[int, int, float], ...]  # (V, d, share) swept over TUNE_CONFIGS at tune_rows rows
    tune_rows: int
    tune_configs: tuple[tuple[int, int, int, int], ...]  # (block_s, block_k, num_warps, num_stages)
    step_context: int  # prompt tokens before the timed steps of the trees section
    step_tokens: int  # tokens generated per timed call there
    trees: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(TREES))


FULL = Plan(
    head_vocab=(49152, 128256, 262144), head_dims=(576, 4096), head_shares=(0.02, 0.05, 0.125),
    head_rows=(1, 8, 64), repeats=20, warmup=5,
    verify_model=LLAMA_8B, verify_contexts=(512, 2048), verify_nodes=(1, 2, 4, 8, 16, 32, 48, 64),
    drafter_targets={"smollm2": SMOLLM2, "llama3-8b": LLAMA_8B}, drafter_rows=(1, 8, 32), drafter_context=512,
    num_clusters=64,
    exact_targets={"tiny-llama": ("llama", TINY), "tiny-qwen2": ("qwen2", TINY), "smollm2": ("llama", SMOLLM2)},
    prompts=3, prompt_length=24, new_tokens=48, sync_targets=("tiny-llama", "smollm2"),
    tune_cases=((262144, 4096, 0.05), (262144, 4096, 0.125), (128256, 4096, 0.05), (262144, 576, 0.05)),
    tune_rows=64,
    tune_configs=tuple((bs, bk, w, st) for bs in (64, 128, 256) for bk in (64, 128) for w in (4, 8)
                       for st in (2, 3, 4)),
    step_context=512, step_tokens=33,
)
QUICK = Plan(
    head_vocab=(1024, 4096), head_dims=(64,), head_shares=(0.02, 0.05, 0.125), head_rows=(1, 8),
    repeats=3, warmup=1,
    verify_model=QUICK_LLAMA, verify_contexts=(16, 32), verify_nodes=(1, 2, 4, 8),
    drafter_targets={"smollm2": QUICK_SMOLLM2, "llama3-8b": QUICK_LLAMA}, drafter_rows=(1, 4), drafter_context=16,
    num_clusters=8,
    exact_targets={"tiny-llama": ("llama", TINY), "tiny-qwen2": ("qwen2", TINY), "smollm2": ("llama", QUICK_SMOLLM2)},
    prompts=2, prompt_length=8, new_tokens=12, sync_targets=("tiny-llama", "smollm2"),
    tune_cases=((1024, 64, 0.125),), tune_rows=8, tune_configs=((16, 16, 4, 2), (32, 32, 4, 3)),
    step_context=16, step_tokens=5,
)


@dataclass
class Context:
    """What every section reads: the arguments, the plan, the device and dtype; `notes` collect caveats."""

    args: argparse.Namespace
    plan: Plan
    device: torch.device
    dtype: torch.dtype
    notes: list[str] = field(default_factory=list)

    def time_ms(self, fn: Callable[[], object], reset: Callable[[], object] | None = None) -> float:
        return time_ms(fn, self.device, self.plan.repeats, self.plan.warmup, reset)

    def time_cold_ms(self, fn: Callable[[], object]) -> float:
        """`time_ms` with the GPU's L2 cache flushed before every call (as in decoding, where the whole target
        runs between two head calls): a write of COLD_CACHE_BYTES (H200 L2: 60 MB), untimed."""
        if self.device.type != "cuda":
            return self.time_ms(fn)
        scratch = torch.empty(COLD_CACHE_BYTES, dtype=torch.uint8, device=self.device)
        return self.time_ms(fn, reset=scratch.zero_)


# ---------------------------------------------------------------------------------------------- helpers


def time_ms(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int,
    reset: Callable[[], object] | None = None,
) -> float:
    """Median milliseconds of `fn` after `warmup` untimed calls: CUDA events on a GPU (read after one final
    synchronisation), perf_counter with synchronisation elsewhere. `reset` runs after every call, untimed."""
    for _ in range(warmup):
        fn()
        if reset is not None:
            reset()
    times: list[float] = []
    events: list[tuple[Any, Any]] = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        else:
            began = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - began))
        if reset is not None:
            reset()
    if events:
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) for start, end in events]
    return statistics.median(times)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def random_model(family: str, fields: dict[str, Any], dtype: torch.dtype, device: torch.device,
                 seed: int = 0) -> torch.nn.Module:
    """A random-weight causal LM built straight on `device` in `dtype` (no download, no fp32 copy)."""
    config_name, model_name = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**BASE_FIELDS, **fields})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        model = getattr(transformers, model_name)(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def head_only_target(fields: dict[str, Any], dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A Llama target on the meta device with only its embeddings and LM head materialised (random): enough to
    bind a drafter to, at any size."""
    config = transformers.LlamaConfig(**{**BASE_FIELDS, **fields, "tie_word_embeddings": False})
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        target = transformers.LlamaForCausalLM(config)
    for module in (target.get_input_embeddings(), target.get_output_embeddings()):
        module.to_empty(device=device).to(dtype)
        torch.nn.init.normal_(module.weight, std=0.02)
    return target.eval()


def check_cache_length(cache: DynamicCache, expected: int) -> None:
    """Refuse to time on a cache the model did not fill (a `cache=` keyword the model silently ignored)."""
    if cache.get_seq_length() != expected:
        raise RuntimeError(f"the KV cache holds {cache.get_seq_length()} tokens after filling {expected}: the "
                           f"model ignored its cache argument (transformers {transformers.__version__})")


def prompt_ids(index: int, length: int, vocab: int, device: torch.device) -> torch.Tensor:
    """(1, length) random tokens; odd prompts repeat their first half (so the lookup branch has work)."""
    gen = torch.Generator().manual_seed(1000 + index)
    ids = torch.randint(3, vocab, (1, length), generator=gen)
    if index % 2:
        half = ids[:, : length // 2]
        ids = torch.cat([half, half, ids[:, : length - 2 * half.shape[1]]], dim=1)
    return ids.to(device)


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def require_package() -> None:
    if PACKAGE_ERROR is not None:
        raise RuntimeError(PACKAGE_ERROR)


def progress(total: int, name: str) -> tqdm:
    return tqdm(total=total, desc=name, unit="case", file=sys.stderr, dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------- head


def load_ops() -> ModuleType:
    """`hf_dynaspec.ops`; if the package cannot be imported, ops.py alone (it needs only torch)."""
    if PACKAGE_ERROR is None:
        import hf_dynaspec.ops as ops

        return ops
    spec = importlib.util.spec_from_file_location("dynaspec_ops_standalone", ROOT / "hf_dynaspec" / "ops.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def triton_status(ctx: Context, ops: ModuleType) -> tuple[bool, str]:
    """(may the Triton backend be timed here, a note saying why or why not)."""
    if ctx.device.type == "cpu":
        if not ctx.args.triton_interpret:
            return False, "CPU run: Triton backend skipped (--triton-interpret runs it under TRITON_INTERPRET=1)"
        if not INTERPRET_AT_IMPORT:
            return False, "CPU run: Triton skipped, TRITON_INTERPRET=1 was not set before triton was imported"
    kernels = ops.load_kernel_package()
    if not kernels.HAS_TRITON:
        return False, "triton is not installed: Triton backend skipped"
    interpreted = kernels.is_interpreter_mode()
    if ctx.device.type == "cpu" and not interpreted:
        return False, "the kernel was imported without TRITON_INTERPRET=1: Triton backend skipped on CPU"
    if interpreted:
        return True, "Triton ran under TRITON_INTERPRET=1 (the interpreter): its times mean nothing"
    hub = os.environ.get(ops.HUB_KERNEL_ENV, "").strip()
    return True, f"Triton kernel from the Kernel Hub ({hub})" if hub else "Triton kernel: the in-repo package"


def roofline(share_bytes: int, ctx: Context) -> float:
    """Milliseconds to move `share_bytes` at the peak bandwidth."""
    return 1e3 * share_bytes / (ctx.args.peak_gbps * 1e9)


def head_bytes(n: int, s: int, d: int, size: int, id_size: int = 0) -> int:
    """Bytes a head product must move: S weight rows and N hidden rows of d, N x S logits (`size` bytes each),
    and the S ids (`id_size` bytes each; 0 for the dense head, which reads no ids)."""
    return s * d * size + n * d * size + n * s * size + s * id_size


def head_case(ctx: Context, ops: ModuleType, weight: torch.Tensor, hidden: torch.Tensor, share: float,
              dense_ms: float, use_triton: bool) -> dict[str, Any]:
    """One shortlist: weight (V, d), hidden (N, d), a random shortlist of round(share * V) ids."""
    vocab, d = weight.shape
    n, size = hidden.shape[0], weight.element_size()
    s = max(1, round(share * vocab))
    ids = torch.randperm(vocab, device=weight.device)[:s]  # (S,) unsorted, as a dynamic shortlist
    index_ms = ctx.time_cold_ms(lambda: hidden @ weight.index_select(0, ids).T)  # (N, S)
    moved = head_bytes(n, s, d, size, ids.element_size())
    dense_moved = head_bytes(n, vocab, d, size)
    row: dict[str, Any] = dict(
        vocab=vocab, d=d, rows=n, share=share, shortlist=s, dense_ms=dense_ms, index_select_ms=index_ms,
        bytes=moved, roofline_ms=roofline(moved, ctx), dense_roofline_ms=roofline(dense_moved, ctx),
    )
    row["index_select_roofline_fraction"] = row["roofline_ms"] / index_ms
    row["dense_roofline_fraction"] = row["dense_roofline_ms"] / dense_ms
    if use_triton:
        expected = (hidden @ weight.index_select(0, ids).T).float()  # (N, S)
        got = ops.gathered_lm_head(hidden, weight, ids, backend="triton").float()
        row["triton_max_abs_err"] = float((got - expected).abs().max())
        row["triton_max_rel_err"] = row["triton_max_abs_err"] / max(float(expected.abs().max()), 1e-30)
        row["triton_ms"] = ctx.time_cold_ms(lambda: ops.gathered_lm_head(hidden, weight, ids, backend="triton"))
        row["speedup_triton_vs_index_select"] = index_ms / row["triton_ms"]
        row["triton_roofline_fraction"] = row["roofline_ms"] / row["triton_ms"]
        row["triton_gbps"] = moved / (row["triton_ms"] * 1e6)
        plan = getattr(ops.load_kernel_package(), "launch_plan", None)  # a Hub kernel may predate it
        if plan is not None:
            row["triton_launch"] = plan(n, s, d)
    return row


def head_weight_cases(ctx: Context, ops: ModuleType, vocab: int, d: int, use_triton: bool,
                      bar: tqdm) -> list[dict[str, Any]]:
    """Every (rows, shortlist) case of one random (V, d) head."""
    weight = torch.randn(vocab, d, device=ctx.device, dtype=ctx.dtype)  # (V, d)
    rows = []
    for n in ctx.plan.head_rows:
        hidden = torch.randn(n, d, device=ctx.device, dtype=ctx.dtype)  # (N, d)
        dense_ms = ctx.time_cold_ms(lambda: hidden @ weight.T)  # noqa: B023  (N, V)
        for share in ctx.plan.head_shares:
            rows.append(head_case(ctx, ops, weight, hidden, share, dense_ms, use_triton))
            bar.update()
    return rows


def tune_case(ctx: Context, kernels: ModuleType, vocab: int, d: int, share: float) -> dict[str, Any]:
    """One (V, d, share) at `tune_rows` rows: the Triton kernel's time and roofline fraction for every launch
    config of `tune_configs`, beside its default config's."""
    weight = torch.randn(vocab, d, device=ctx.device, dtype=ctx.dtype)  # (V, d)
    hidden = torch.randn(ctx.plan.tune_rows, d, device=ctx.device, dtype=ctx.dtype)  # (N, d)
    s = max(1, round(share * vocab))
    ids = torch.randperm(vocab, device=ctx.device)[:s]  # (S,)
    size = weight.element_size()
    moved = head_bytes(hidden.shape[0], s, d, size, ids.element_size())
    roof = roofline(moved, ctx)
    default_ms = ctx.time_cold_ms(lambda: kernels.gathered_lm_head_triton(hidden, weight, ids))
    configs = []
    for block_s, block_k, warps, stages in ctx.plan.tune_configs:
        launch = dict(block_s=block_s, block_k=block_k, num_warps=warps, num_stages=stages)
        try:
            ms = ctx.time_cold_ms(lambda: kernels.gathered_lm_head_triton(hidden, weight, ids, **launch))  # noqa: B023
        except Exception as err:  # noqa: BLE001 - a config the chip cannot hold (shared memory) is recorded
            configs.append({**launch, "error": f"{type(err).__name__}: {str(err)[:160]}"})
            continue
        configs.append({**launch, "ms": ms, "roofline_fraction": roof / ms})
    timed = [c for c in configs if "ms" in c]
    best = min(timed, key=lambda c: c["ms"]) if timed else None
    return dict(vocab=vocab, d=d, rows=hidden.shape[0], share=share, shortlist=s, roofline_ms=roof,
                default_ms=default_ms, default_roofline_fraction=roof / default_ms, best=best, configs=configs)


def run_head_tune(ctx: Context, ops: ModuleType) -> list[dict[str, Any]]:
    kernels = ops.load_kernel_package()
    rows = []
    for vocab, d, share in tqdm(ctx.plan.tune_cases, desc="head tune", file=sys.stderr):
        rows.append(tune_case(ctx, kernels, vocab, d, share))
        release_memory(ctx.device)
    return rows


def run_head(ctx: Context) -> dict[str, Any]:
    plan, ops = ctx.plan, load_ops()
    use_triton, note = triton_status(ctx, ops)
    rows: list[dict[str, Any]] = []
    bar = progress(len(plan.head_vocab) * len(plan.head_dims) * len(plan.head_rows) * len(plan.head_shares), "head")
    torch.manual_seed(ctx.args.seed)
    for vocab in plan.head_vocab:
        for d in plan.head_dims:
            rows += head_weight_cases(ctx, ops, vocab, d, use_triton, bar)
            release_memory(ctx.device)
    bar.close()
    speedups = [r["speedup_triton_vs_index_select"] for r in rows if "speedup_triton_vs_index_select" in r]
    summary = {"triton_timed": use_triton, "peak_gbps": ctx.args.peak_gbps, "dtype": str(ctx.dtype)}
    if speedups:
        summary["speedup_geomean"] = math.exp(statistics.fmean(math.log(s) for s in speedups))
        summary["speedup_min"], summary["speedup_max"] = min(speedups), max(speedups)
    tune = run_head_tune(ctx, ops) if use_triton else []
    return {"rows": rows, "summary": summary, "tune": tune, "notes": [note]}


# ---------------------------------------------------------------------------------------------- verify


def random_tree_ancestors(n: int, seed: int) -> torch.Tensor:
    """(n, n) bool: node i sees node j iff j is i or an ancestor, for a random tree (node 0 the root)."""
    gen = torch.Generator().manual_seed(seed)
    ancestor = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = int(torch.randint(0, i, (1,), generator=gen))
        ancestor[i] |= ancestor[parent]
    return ancestor


def verify_inputs(target: torch.nn.Module, context: int, n: int, mask: str) -> dict[str, torch.Tensor]:
    """The forward's inputs for n new tokens after `context` cached ones: a random tree's 4D mask with per-node
    positions (context + depth), or nothing but the ids (transformers' own causal mask)."""
    device = target.device
    ids = torch.randint(0, target.config.vocab_size, (1, n), device=device)  # (1, n)
    if mask == "causal":
        return {"input_ids": ids}
    ancestor = random_tree_ancestors(n, seed=n)  # (n, n)
    allowed = torch.cat([torch.ones(n, context, dtype=torch.bool), ancestor], dim=1).to(device)  # (n, ctx + n)
    positions = context + ancestor.sum(dim=1).to(device) - 1  # (n,) context + depth
    keys = torch.cat([torch.arange(context, device=device), positions])  # (ctx + n,)
    attention = target_masks(target.config, allowed, positions, keys, target.dtype)  # (1, 1, n, ctx + n)
    return {"input_ids": ids, "attention_mask": attention, "position_ids": positions[None]}


def verify_context(ctx: Context, target: torch.nn.Module, context: int, bar: tqdm) -> list[dict[str, Any]]:
    """Fill a cache with `context` random tokens, then time forwards over n new tokens, cropping back."""
    cache = DynamicCache()
    ids = torch.randint(0, target.config.vocab_size, (1, context), device=ctx.device)
    target(input_ids=ids, use_cache=True, logits_to_keep=1, cache=cache)
    check_cache_length(cache, context)
    rows = []
    for mask in ("tree", "causal"):
        for n in ctx.plan.verify_nodes:
            inputs = verify_inputs(target, context, n, mask)
            ms = ctx.time_ms(
                lambda: target(**inputs, use_cache=True, output_hidden_states=True, cache=cache),  # noqa: B023
                reset=lambda: crop_cache(cache, context),
            )
            rows.append(dict(context=context, mask=mask, nodes=n, ms=ms))
            bar.update()
    base = {(r["context"], r["mask"]): r["ms"] for r in rows if r["nodes"] == 1}
    for r in rows:
        r["cost"] = r["ms"] / base[(r["context"], r["mask"])] if (r["context"], r["mask"]) in base else None
    return rows


def run_verify(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    began = time.perf_counter()
    target = random_model("llama", plan.verify_model, ctx.dtype, ctx.device)
    build_s = time.perf_counter() - began
    bar = progress(len(plan.verify_contexts) * 2 * len(plan.verify_nodes), "verify")
    rows: list[dict[str, Any]] = []
    for context in plan.verify_contexts:
        rows += verify_context(ctx, target, context, bar)
    bar.close()
    del target
    notes = ["cost = ms / ms(n = 1) at the same context and mask"]
    model = {**plan.verify_model, "dtype": str(ctx.dtype), "build_seconds": build_s}
    return {"model": model, "rows": rows, "notes": notes}


# ---------------------------------------------------------------------------------------------- drafter


def random_drafter(target: torch.nn.Module, ctx: Context) -> DynaSpecDrafter:
    """An untrained drafter bound to `target`: random weights, random balanced clusters (no k-means), and a
    random static shortlist as large as the dynamic one at depth 0 (k0 of M clusters)."""
    m = ctx.plan.num_clusters
    config = DynaSpecConfig.from_target_config(target.config, num_clusters=m)
    config._attn_implementation = "sdpa"
    with torch.device(ctx.device), default_dtype(ctx.dtype):
        drafter = DynaSpecDrafter(config).eval()
    vocab, gen = config.vocab_size, torch.Generator().manual_seed(ctx.args.seed)
    drafter.set_clusters(VocabClusters.from_assignments(torch.randperm(vocab, generator=gen) % m, m))
    drafter.set_static_shortlist(torch.randperm(vocab, generator=gen)[: round(vocab * config.shortlist_k0 / m)])
    return drafter.bind(target)


def router_then_layer(router: torch.nn.Module, features: torch.Tensor, layer_fn: Callable[..., Any],
                      *layer_args: Any, timer: Any = None, **layer_kwargs: Any) -> tuple[torch.Tensor, Any]:
    """`run_router_beside` without the side stream: the router, then the layer, on one stream."""
    return router(features), layer_fn(*layer_args, **layer_kwargs)


@contextlib.contextmanager
def router_placement(placement: str) -> Iterator[None]:
    """Where the router runs: "beside" the layer (the package's `run_router_beside`: a side stream on CUDA) or
    "sequential" (`router_then_layer`)."""
    if placement == "beside":
        yield
        return
    with mock.patch.object(dynaspec_modeling, "run_router_beside", router_then_layer):
        yield


def component_ms(ctx: Context, drafter: DynaSpecDrafter, ids: torch.Tensor, hidden: torch.Tensor,
                 cache: DynamicCache) -> dict[str, float]:
    """The router alone and each head mode alone, on one step's inputs ids (1, T), hidden (1, T, d)."""
    context, k = ctx.plan.drafter_context, drafter.config.shortlist_k0
    out = drafter(ids, hidden, cache=cache, head_mode=None)
    crop_cache(cache, context)
    embeds = drafter.bound_target.get_input_embeddings()(ids).to(hidden.dtype)  # (1, T, d)
    if drafter.is_eagle3:
        router_input = drafter.layer.attention_input(embeds, hidden)  # (1, T, 2d)
    else:
        router_input = drafter.fc(torch.cat([embeds, hidden], dim=-1))  # (1, T, d)
    times = {"router_ms": ctx.time_ms(lambda: drafter.router(router_input))}
    features, router_logits = out.hidden_states[0], out.router_logits[0]  # (T, d), (T, M)
    for mode in TIMED_HEAD_MODES:
        times[f"head_{mode}_ms"] = ctx.time_ms(
            lambda: drafter.bound_head.logits(features, mode, router_logits, k)  # noqa: B023
        )
    return times


def drafter_rows(ctx: Context, shape: str, drafter: DynaSpecDrafter, bar: tqdm) -> list[dict[str, Any]]:
    """Every (positions, head mode, router placement) step on a drafter cache of `drafter_context` tokens."""
    context, d, k = ctx.plan.drafter_context, drafter.config.hidden_size, drafter.config.shortlist_k0
    vocab = drafter.config.vocab_size
    cache = DynamicCache()
    drafter(torch.randint(0, vocab, (1, context), device=ctx.device),
            torch.randn(1, context, d, device=ctx.device, dtype=ctx.dtype), cache=cache, head_mode=None)
    check_cache_length(cache, context)
    rows = []
    for t in ctx.plan.drafter_rows:
        ids = torch.randint(0, vocab, (1, t), device=ctx.device)  # (1, T)
        hidden = torch.randn(1, t, d, device=ctx.device, dtype=ctx.dtype)  # (1, T, d)
        parts = component_ms(ctx, drafter, ids, hidden, cache)
        for mode in TIMED_HEAD_MODES:
            sizes = drafter(ids, hidden, cache=cache, head_mode=mode, num_clusters=k).head.shortlist_sizes
            crop_cache(cache, context)
            row = dict(shape=shape, d=d, vocab=vocab, positions=t, head_mode=mode, context=context,
                       shortlist_mean=float(sizes.float().mean()), router_ms=parts["router_ms"],
                       head_ms=parts[f"head_{mode}_ms"])
            for placement in ROUTER_PLACEMENTS:
                with router_placement(placement):
                    row[f"step_{placement}_ms"] = ctx.time_ms(
                        lambda: drafter(ids, hidden, cache=cache, head_mode=mode, num_clusters=k),  # noqa: B023
                        reset=lambda: crop_cache(cache, context),
                    )
                bar.update()
            row["overlap_saving_ms"] = row["step_sequential_ms"] - row["step_beside_ms"]
            rows.append(row)
    return rows


def run_drafter(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    bar = progress(len(plan.drafter_targets) * len(plan.drafter_rows) * len(TIMED_HEAD_MODES) * 2, "drafter")
    rows: list[dict[str, Any]] = []
    for shape, fields in plan.drafter_targets.items():
        target = head_only_target(fields, ctx.dtype, ctx.device)
        drafter = random_drafter(target, ctx)
        rows += drafter_rows(ctx, shape, drafter, bar)
        del target, drafter
        release_memory(ctx.device)
    bar.close()
    notes = [f"{plan.num_clusters} random clusters, k0 = {plan.num_clusters // 8} per position; static shortlist "
             f"as large; drafter cache of {plan.drafter_context} tokens"]
    if ctx.device.type != "cuda":
        notes.append("not CUDA: run_router_beside runs the router before the layer, so both placements match")
    return {"rows": rows, "notes": notes}


# ---------------------------------------------------------------------------------------------- exactness


def first_divergence(plain: list[int], spec: list[int]) -> int | None:
    """Index of the first differing generated token (or the shorter length), None when equal."""
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a != b:
            return i
    return None if len(plain) == len(spec) else min(len(plain), len(spec))


def logit_gap(target: torch.nn.Module, plain: torch.Tensor, position: int, spec_token: int) -> float:
    """The target's logit of plain greedy's pick minus that of the speculative pick at `position` of plain
    (1, L), recomputed without a cache: small values mean a near-tie (numerics, not a bug)."""
    logits = target(input_ids=plain[:, :position]).logits[0, -1].float()  # (V,)
    return float(logits[int(plain[0, position])] - logits[spec_token])


def exact_runs(ctx: Context, name: str, family: str, fields: dict[str, Any], dtype: torch.dtype,
               bar: tqdm) -> list[dict[str, Any]]:
    """Every prompt x tree of one target in one dtype."""
    plan = ctx.plan
    target = random_model(family, fields, dtype, ctx.device, seed=ctx.args.seed)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=plan.num_clusters, seed=ctx.args.seed).eval()
    rows = []
    for p in range(plan.prompts):
        ids = prompt_ids(p, plan.prompt_length, fields["vocab_size"], ctx.device)  # (1, L)
        plain = target.generate(ids, do_sample=False, max_new_tokens=plan.new_tokens)
        for tree, settings in plan.trees.items():
            config = DynaSpecGenerationConfig(**settings, max_new_tokens=plan.new_tokens, do_sample=False)
            spec = target.generate(ids, generation_config=config, assistant_model=drafter)
            a, b = plain[0, ids.shape[1]:].tolist(), spec[0, ids.shape[1]:].tolist()
            first = first_divergence(a, b)
            gap = logit_gap(target, plain, ids.shape[1] + first, b[first]) if first is not None and first < min(
                len(a), len(b)) else None
            rows.append(dict(target=name, family=family, dtype=str(dtype).removeprefix("torch."), prompt=p,
                             tree=tree, identical=a == b, first_divergence=first, logit_gap=gap, new_tokens=len(a)))
            bar.update()
    del target, drafter
    release_memory(ctx.device)
    return rows


def exactness_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (target, dtype, tree): runs, identical share, the first divergences."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["target"], r["dtype"], r["tree"]), []).append(r)
    return [
        dict(target=t, dtype=dt, tree=tree, runs=len(g), identical_share=sum(r["identical"] for r in g) / len(g),
             first_divergences=[r["first_divergence"] for r in g if r["first_divergence"] is not None],
             logit_gaps=[r["logit_gap"] for r in g if r["logit_gap"] is not None])
        for (t, dt, tree), g in groups.items()
    ]


def run_exactness(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    dtypes = (torch.float32, torch.bfloat16)
    bar = progress(len(plan.exact_targets) * len(dtypes) * plan.prompts * len(plan.trees), "exactness")
    rows: list[dict[str, Any]] = []
    for name, (family, fields) in plan.exact_targets.items():
        for dtype in dtypes:
            rows += exact_runs(ctx, name, family, fields, dtype, bar)
    bar.close()
    targets = {name: {"family": family, **fields} for name, (family, fields) in plan.exact_targets.items()}
    by_dtype = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        same = [r["identical"] for r in rows if r["dtype"] == dtype]
        by_dtype[dtype] = sum(same) / len(same)
    return {"rows": rows, "summary": exactness_summary(rows), "identical_share_by_dtype": by_dtype,
            "targets": targets, "trees": plan.trees,
            "notes": ["fresh (untrained) drafters: acceptance is low, exactness is what counts",
                      "logit gap: the target's logit of plain greedy's pick minus the speculative pick's, at the "
                      "first divergence (recomputed without a cache); near 0: a numerical near-tie"]}


# ---------------------------------------------------------------------------------------------- syncs


def count_syncs(target: torch.nn.Module, drafter: DynaSpecDrafter, ids: torch.Tensor,
                config: DynaSpecGenerationConfig) -> list[tuple[int, int, Counter[str]]]:
    """(host reads, tokens emitted, reads by kind) of every decoding step of one generate() call."""
    steps: list[tuple[int, int, Counter[str]]] = []
    original = decoding.speculative_step

    def counted(target_: torch.nn.Module, generator: Any, run: Any, *args: Any, **kwargs: Any) -> None:
        before = run.input_ids.shape[1]
        with HostSyncCounter() as counter:
            original(target_, generator, run, *args, **kwargs)
        steps.append((counter.total, run.input_ids.shape[1] - before, counter.counts))

    with mock.patch.object(decoding, "speculative_step", counted):
        target.generate(ids, generation_config=config, assistant_model=drafter)
    return steps


def sync_row(name: str, tree: str, steps: list[tuple[int, int, Counter[str]]]) -> dict[str, Any]:
    reads = [s[0] for s in steps]
    kinds: Counter[str] = Counter()
    for _, _, counts in steps:
        kinds.update(counts)
    return dict(target=name, tree=tree, steps=len(steps), mean=statistics.fmean(reads) if reads else 0.0,
                max=max(reads, default=0), tokens_per_step=statistics.fmean(s[1] for s in steps) if steps else 0.0,
                by_kind={k: v / max(1, len(steps)) for k, v in kinds.most_common()})


def run_syncs(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    dtype = ctx.dtype if ctx.device.type == "cuda" else torch.float32
    bar = progress(len(plan.sync_targets) * len(plan.trees), "syncs")
    rows = []
    for name in plan.sync_targets:
        family, fields = plan.exact_targets[name]
        target = random_model(family, fields, dtype, ctx.device, seed=ctx.args.seed)
        drafter = DynaSpecDrafter.from_target(target, num_clusters=plan.num_clusters, seed=ctx.args.seed).eval()
        ids = prompt_ids(1, plan.prompt_length, fields["vocab_size"], ctx.device)
        for tree, settings in plan.trees.items():
            config = DynaSpecGenerationConfig(**settings, max_new_tokens=plan.new_tokens, do_sample=False)
            rows.append(sync_row(name, tree, count_syncs(target, drafter, ids, config)))
            bar.update()
        del target, drafter
        release_memory(ctx.device)
    bar.close()
    return {"rows": rows, "dtype": str(dtype), "notes": ["by_kind: host reads per step by kind"]}


# ---------------------------------------------------------------------------------------------- trees


def candidate_trees() -> list[dict[str, Any]]:
    """benchmarks/device_tree.py's candidate default trees (its SWEEPS), as generate() settings."""
    module = sys.modules.get("device_tree")  # already imported (a test), else loaded from its file
    if module is None:
        spec = importlib.util.spec_from_file_location("device_tree", Path(__file__).resolve().parent / "device_tree.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return [dict(num_draft_nodes=n, draft_depth=d, draft_top_k=k, min_draft_prob=0.0)
            for trees in module.SWEEPS.values() for n, d, k in trees]


def generate_ms(target: torch.nn.Module, ids: torch.Tensor, tokens: int, device: torch.device, repeats: int,
                **kwargs: Any) -> tuple[float, Any]:
    """(median wall ms of `target.generate` over `tokens` new tokens, the last output)."""
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        began = time.perf_counter()
        out = target.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, **kwargs)
        _sync(device)
        times.append(1e3 * (time.perf_counter() - began))
    return statistics.median(times), out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tree_step_row(ctx: Context, target: torch.nn.Module, drafter: DynaSpecDrafter, ids: torch.Tensor,
                  tree: dict[str, Any], plain_ms: float) -> dict[str, Any]:
    """One tree's decoding step, end to end (draft, verify, walk, extend): ms per step from calls of 1 and
    `step_tokens` new tokens (the difference drops the prefill), and its cost in plain steps."""
    speculative = dict(generation_config=DynaSpecGenerationConfig(**tree, lookup_num_tokens=0,
                                                                  return_dict_in_generate=True),
                       assistant_model=drafter)
    repeats, n = max(1, ctx.plan.repeats // 10), ctx.plan.step_tokens
    generate_ms(target, ids, n, ctx.device, 1, **speculative)  # warm-up: Triton compiles per shape class
    first_ms, first = generate_ms(target, ids, 1, ctx.device, repeats, **speculative)
    all_ms, out = generate_ms(target, ids, n, ctx.device, repeats, **speculative)
    steps = out.speculative_stats.steps - first.speculative_stats.steps
    step_ms = (all_ms - first_ms) / max(1, steps)
    return dict(tree=tree, steps=steps, tokens_per_step=(n - 1) / max(1, steps),
                tree_nodes_per_step=out.speculative_stats.mean_tree_size, step_ms=step_ms, cost=step_ms / plain_ms)


def run_trees(ctx: Context) -> dict[str, Any]:
    """The step cost of every candidate default tree on the verify section's target, measured: what
    benchmarks/device_tree.py otherwise models as c(1 + nodes) + depth x r."""
    require_package()
    plan, trees = ctx.plan, candidate_trees()
    target = random_model("llama", plan.verify_model, ctx.dtype, ctx.device, seed=ctx.args.seed)
    drafter = random_drafter(target, ctx)
    ids = prompt_ids(0, plan.step_context, plan.verify_model["vocab_size"], ctx.device)
    repeats = max(1, plan.repeats // 10)
    generate_ms(target, ids, 2, ctx.device, 1)  # warm-up
    first_ms, _ = generate_ms(target, ids, 1, ctx.device, repeats)
    all_ms, _ = generate_ms(target, ids, plan.step_tokens, ctx.device, repeats)
    plain_ms = (all_ms - first_ms) / (plan.step_tokens - 1)
    bar = progress(len(trees), "trees")
    rows = []
    for tree in trees:
        rows.append(tree_step_row(ctx, target, drafter, ids, tree, plain_ms))
        bar.update()
    bar.close()
    del target, drafter
    release_memory(ctx.device)
    return {"rows": rows, "plain_ms_per_token": plain_ms, "context": plan.step_context,
            "notes": ["random target and drafter: next to no draft is accepted, so every step verifies the whole "
                      "tree and emits about one token; cost = ms per step / plain ms per token (no lookup branch)"]}


RUNNERS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "head": run_head, "verify": run_verify, "drafter": run_drafter, "exactness": run_exactness, "syncs": run_syncs,
    "trees": run_trees,
}


# ---------------------------------------------------------------------------------------------- markdown


def fmt(value: Any, digits: int = 4) -> str:
    """A cell: floats to `digits` significant digits (thousands separated from 1e4), lists and dicts inline."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 1e4 else str(value)
    if isinstance(value, list):
        return ", ".join(fmt(v, 3) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v, 3)}" for k, v in list(value.items())[:6])
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[str]:
    """Markdown table of `rows` with (key, header) columns; a percentage where the key ends in _pct."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for key, _ in columns:
            if key.endswith("_pct"):
                value = row.get(key.removesuffix("_pct"))
                cells.append("" if value is None else f"{100 * value:.1f}%")
            else:
                cells.append(fmt(row.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


HEAD_COLUMNS = [("vocab", "V"), ("d", "d"), ("rows", "N"), ("share_pct", "shortlist"), ("shortlist", "S"),
                ("dense_ms", "dense ms"), ("index_select_ms", "idx+mm ms"), ("triton_ms", "Triton ms"),
                ("speedup_triton_vs_index_select", "Triton speedup"), ("roofline_ms", "roofline ms"),
                ("triton_roofline_fraction_pct", "Triton % roofline"),
                ("index_select_roofline_fraction_pct", "idx+mm % roofline"),
                ("dense_roofline_fraction_pct", "dense % roofline"), ("triton_max_abs_err", "Triton max err")]
TUNE_COLUMNS = [("vocab", "V"), ("d", "d"), ("rows", "N"), ("share_pct", "shortlist"), ("roofline_ms", "roofline ms"),
                ("default_ms", "default ms"), ("default_roofline_fraction_pct", "default % roofline"),
                ("best_launch", "best block_s/block_k/warps/stages"), ("best_ms", "best ms"),
                ("best_roofline_fraction_pct", "best % roofline"), ("failed_configs", "configs failed")]
DRAFTER_COLUMNS = [("shape", "target"), ("d", "d"), ("vocab", "V"), ("positions", "T"), ("head_mode", "head"),
                   ("shortlist_mean", "shortlist"), ("step_beside_ms", "step ms (router beside)"),
                   ("step_sequential_ms", "step ms (sequential)"), ("overlap_saving_ms", "saved ms"),
                   ("router_ms", "router ms"), ("head_ms", "head ms")]
EXACT_COLUMNS = [("target", "target"), ("dtype", "dtype"), ("tree", "tree"), ("runs", "runs"),
                 ("identical_share_pct", "identical"), ("first_divergences", "first divergence (token)"),
                 ("logit_gaps", "logit gap there")]
SYNC_COLUMNS = [("target", "target"), ("tree", "tree"), ("steps", "steps"), ("mean", "syncs/step mean"),
                ("max", "max"), ("tokens_per_step", "tokens/step"), ("by_kind", "per step by kind")]

TREE_COLUMNS = [("tree", "tree"), ("steps", "steps"), ("tokens_per_step", "tokens/step"),
                ("tree_nodes_per_step", "nodes/step"), ("step_ms", "ms/step"), ("cost", "cost (plain steps)")]


def verify_table(rows: list[dict[str, Any]]) -> list[str]:
    """n down, (context, mask) across: ms and c(n)/c(1)."""
    keys = sorted({(r["context"], r["mask"]) for r in rows}, key=lambda k: (k[0], k[1] != "tree"))
    cells = {(r["context"], r["mask"], r["nodes"]): r for r in rows}
    lines = ["| n | " + " | ".join(f"ctx {c} {m}: ms | c(n)/c(1)" for c, m in keys) + " |",
             "|---|" + "---|---|" * len(keys)]
    for n in sorted({r["nodes"] for r in rows}):
        parts = [f"{fmt(cells[(c, m, n)]['ms'])} | {fmt(cells[(c, m, n)]['cost'], 3)}" if (c, m, n) in cells
                 else " | " for c, m in keys]
        lines.append(f"| {n} | " + " | ".join(parts) + " |")
    return lines


def tune_table(cases: list[dict[str, Any]]) -> list[str]:
    rows = []
    for case in cases:
        best = case.get("best") or {}
        launch = "/".join(str(best.get(k, "-")) for k in ("block_s", "block_k", "num_warps", "num_stages"))
        failed = sum("error" in c for c in case["configs"])
        rows.append({**case, "best_launch": launch, "best_ms": best.get("ms"),
                     "best_roofline_fraction": best.get("roofline_fraction"), "failed_configs": failed})
    return table(rows, TUNE_COLUMNS)


def section_markdown(name: str, data: dict[str, Any]) -> list[str]:
    meta = data.get("meta", {})
    lines = [f"## {name}", "", f"{meta.get('device', '?')}, {fmt(data.get('seconds'), 1)} s, "
             f"{'quick' if meta.get('quick') else 'full'} run of {meta.get('timestamp', '?')}", ""]
    if name == "head":
        lines += table(data["rows"], HEAD_COLUMNS)
        lines += ["", "Summary: " + fmt(data.get("summary", {}))]
        if data.get("tune"):
            lines += ["", "Triton launch configs swept (best of each case):", ""] + tune_table(data["tune"])
    elif name == "verify":
        lines += [f"Model: {fmt(data.get('model', {}))}", ""] + verify_table(data["rows"])
    elif name == "drafter":
        lines += table(data["rows"], DRAFTER_COLUMNS)
    elif name == "exactness":
        lines += table(data["summary"], EXACT_COLUMNS)
        shares = data.get("identical_share_by_dtype", {})
        lines += ["", "Identical outputs: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares.items())]
    elif name == "syncs":
        lines += table(data["rows"], SYNC_COLUMNS)
    elif name == "trees":
        lines += [f"Plain decoding: {fmt(data['plain_ms_per_token'])} ms per token after {data['context']} prompt "
                  "tokens.", ""] + table(data["rows"], TREE_COLUMNS)
    lines += [""] + [f"- {note}" for note in data.get("notes", [])] + [""]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """results.md from results.json's content (nothing else)."""
    meta = results["meta"]
    lines = ["# GPU suite results", "", "Generated by `benchmarks/gpu_suite.py` from `results.json`.", ""]
    lines += table([meta], [(k, k) for k in ("device", "torch", "triton", "transformers", "cuda", "timestamp",
                                             "quick")])
    lines += [""] + [f"- {note}" for note in meta.get("notes", [])]
    for name, trace in results.get("errors", {}).items():
        lines += [f"- **{name} failed**: `{trace.strip().splitlines()[-1]}` (see log.txt)"]
    lines.append("")
    for name in SECTIONS:
        if name in results["sections"]:
            lines += section_markdown(name, results["sections"][name])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- driver


def version_of(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def environment(ctx: Context) -> dict[str, Any]:
    device = ctx.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return dict(
        device=name, device_type=device.type, torch=torch.__version__, triton=version_of("triton", "pytorch-triton"),
        transformers=transformers.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        threads=torch.get_num_threads(), timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), quick=ctx.args.quick, dtype=str(ctx.dtype), peak_gbps=ctx.args.peak_gbps,
    )


def compatibility_notes() -> list[str]:
    notes = []
    if PACKAGE_ERROR is not None:
        notes.append(PACKAGE_ERROR)
    return notes


def write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(data, indent=1, default=str))
    os.replace(partial, path)


def log(out: Path, message: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    tqdm.write(f"[gpu_suite {stamp}] {message}", file=sys.stderr)
    with (out / "log.txt").open("a") as handle:
        handle.write(f"{stamp} {message}\n")


def is_done(path: Path, ctx: Context) -> bool:
    """A saved section counts when it comes from a run of the same kind (quick or not) on the same device type."""
    if not path.exists() or ctx.args.force:
        return False
    with contextlib.suppress(ValueError, OSError):
        meta = json.loads(path.read_text()).get("meta", {})
        return meta.get("quick") == ctx.args.quick and meta.get("device_type") == ctx.device.type
    return False


def run_section(name: str, ctx: Context, out: Path, errors: dict[str, str]) -> None:
    path = out / "sections" / f"{name}.json"
    if is_done(path, ctx):
        log(out, f"skip {name}: {path.name} is there (--force to redo)")
        return
    log(out, f"run {name}")
    began = time.perf_counter()
    try:
        with torch.no_grad():
            data = RUNNERS[name](ctx)
    except Exception:  # noqa: BLE001 - one failing section must not cost the others
        errors[name] = traceback.format_exc()
        log(out, f"FAILED {name}:\n{errors[name]}")
        return
    finally:
        release_memory(ctx.device)
    data = {"name": name, "meta": environment(ctx), "seconds": time.perf_counter() - began, **data}
    write_json(path, data)
    log(out, f"done {name} in {data['seconds']:.1f} s")


def collect(out: Path, ctx: Context, errors: dict[str, str]) -> dict[str, Any]:
    sections = {}
    for name in SECTIONS:
        path = out / "sections" / f"{name}.json"
        if path.exists():
            sections[name] = json.loads(path.read_text())
    meta = {**environment(ctx), "notes": ctx.notes, "argv": ctx.args.argv, "plan": dataclasses.asdict(ctx.plan)}
    return {"meta": meta, "sections": sections, "errors": errors}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--force", action="store_true", help="redo sections already saved")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few repeats (CPU smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--peak-gbps", type=float, default=4800.0, help="peak HBM bandwidth (H200: 4800)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per case (default 20, quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 5, quick 1)")
    parser.add_argument("--triton-interpret", action="store_true", help="CPU: time Triton under its interpreter")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the chosen sections into `--out`, then write results.json and results.md; returns results.json's
    content."""
    args = parse_args(argv)
    overrides = {k: v for k, v in (("repeats", args.repeats), ("warmup", args.warmup)) if v is not None}
    plan = dataclasses.replace(QUICK if args.quick else FULL, **overrides)
    ctx = Context(args, plan, torch.device(args.device), getattr(torch, args.dtype), compatibility_notes())
    out = Path(args.out)
    (out / "sections").mkdir(parents=True, exist_ok=True)
    log(out, f"gpu_suite {' '.join(args.argv)} on {environment(ctx)['device']}")
    errors: dict[str, str] = {}
    for name in args.sections:
        run_section(name, ctx, out, errors)
        publish(out, ctx, errors)  # a run cut short still leaves results for what finished
    results = publish(out, ctx, errors)
    log(out, f"wrote {out / 'results.json'} and results.md ({len(errors)} failed: {sorted(errors)})")
    return results


def publish(out: Path, ctx: Context, errors: dict[str, str]) -> dict[str, Any]:
    """results.json from the saved sections, and results.md from it."""
    results = collect(out, ctx, errors)
    write_json(out / "results.json", results)
    (out / "results.md").write_text(render_markdown(json.loads((out / "results.json").read_text())))
    return results


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)

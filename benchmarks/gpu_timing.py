"""The GPU suite's timing sections (`benchmarks/gpu_suite.py` runs them): the gathered LM head against the
HBM roofline (and its launch-config sweep), the target's verification cost c(n), and one drafter step.

    python benchmarks/gpu_suite.py --quick --device cpu --sections head verify drafter --out /tmp/gpu-suite
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any
from unittest import mock

import torch
from gpu_common import (  # noqa: E402
    INTERPRET_AT_IMPORT,
    PACKAGE_ERROR,
    ROOT,
    ROUTER_PLACEMENTS,
    TIMED_HEAD_MODES,
    Context,
    DynaSpecConfig,
    DynaSpecDrafter,
    VocabClusters,
    check_cache_length,
    crop_cache,
    default_dtype,
    dynaspec_modeling,
    head_mode_and_layout,
    head_only_target,
    progress,
    random_model,
    release_memory,
    require_package,
    target_masks,
)
from tqdm.auto import tqdm
from transformers import DynamicCache

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
        head_mode, layout = head_mode_and_layout(mode)
        times[f"head_{mode}_ms"] = ctx.time_ms(
            lambda: drafter.bound_head.logits(features, head_mode, router_logits, k, layout=layout)  # noqa: B023
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
            head_mode, layout = head_mode_and_layout(mode)
            call = dict(cache=cache, head_mode=head_mode, num_clusters=k, shortlist_layout=layout)
            sizes = drafter(ids, hidden, **call).head.shortlist_sizes
            crop_cache(cache, context)
            row = dict(shape=shape, d=d, vocab=vocab, positions=t, head_mode=mode, context=context,
                       shortlist_mean=float(sizes.float().mean()), router_ms=parts["router_ms"],
                       head_ms=parts[f"head_{mode}_ms"])
            for placement in ROUTER_PLACEMENTS:
                with router_placement(placement):
                    row[f"step_{placement}_ms"] = ctx.time_ms(
                        lambda: drafter(ids, hidden, **call),  # noqa: B023
                        reset=lambda: crop_cache(cache, context),
                    )
                bar.update()
            row["overlap_saving_ms"] = row["step_sequential_ms"] - row["step_beside_ms"]
            rows.append(row)
    return rows


def rows_per_target(ctx: Context, targets: dict[str, dict[str, Any]],
                    rows_of: Callable[[Context, str, DynaSpecDrafter, tqdm], list[dict[str, Any]]],
                    bar: tqdm) -> list[dict[str, Any]]:
    """`rows_of(ctx, shape, drafter, bar)` for a random drafter bound to each head-only target shape, the
    device's memory released after each; closes `bar`."""
    rows: list[dict[str, Any]] = []
    for shape, fields in targets.items():
        target = head_only_target(fields, ctx.dtype, ctx.device)
        rows += rows_of(ctx, shape, random_drafter(target, ctx), bar)
        del target
        release_memory(ctx.device)
    bar.close()
    return rows


def run_drafter(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    bar = progress(len(plan.drafter_targets) * len(plan.drafter_rows) * len(TIMED_HEAD_MODES) * 2, "drafter")
    rows = rows_per_target(ctx, plan.drafter_targets, drafter_rows, bar)
    notes = [f"{plan.num_clusters} random clusters, k0 = {plan.num_clusters // 8} per position; static shortlist "
             f"as large; drafter cache of {plan.drafter_context} tokens"]
    if ctx.device.type != "cuda":
        notes.append("not CUDA: run_router_beside runs the router before the layer, so both placements match")
    return {"rows": rows, "notes": notes}

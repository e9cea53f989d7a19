"""The GPU suite's "steps" section: one draft step as decoding runs it, eager and as a captured graph.

The step is `DynaSpecCandidateGenerator.draft_step` (drafter layer with the router beside it, shortlisted head,
top-k children) on a drafter cache of `drafter_context` committed positions, for F frontier nodes, with the
"dynamic" head in the "lanes" layout, the "static" head of the same size and the "full" head, at the SmolLM2,
Llama-3.1-8B and Gemma 3 270M shapes. "eager" runs it kernel by kernel; "graphed" replays its CUDA graph
(`generation.drafting.graphs`, `draft_graphs="on"`: static drafter cache, inputs copied in, outputs cloned). A capture
that fails is recorded with its reason and the row keeps its eager time only. Off CUDA the graphed column runs
`ReplayEmulation` (a smoke check of the code path: its times mean nothing). Each row also says whether the
graphed step proposed the same children as the eager one (same committed pairs and frontier).

    python benchmarks/gpu_suite.py --quick --sections steps --out /tmp/gpu-suite
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Any
from unittest import mock

import torch
from gpu_common import Context, head_mode_and_layout, require_package
from gpu_timing import rows_per_target
from tqdm.auto import tqdm

STEP_HEAD_MODES = ("dynamic-lanes", "static", "full")


def step_generator(ctx: Context, drafter: Any, mode: str, graphed: bool) -> Any:
    """A generator on `drafter` for one head mode, its cache filled with `drafter_context` random committed pairs,
    graphs on or off."""
    from hf_dynaspec import DynaSpecGenerationConfig
    from hf_dynaspec.generation.drafting import graphs
    from hf_dynaspec.generation.drafting.candidates import DynaSpecCandidateGenerator
    from hf_dynaspec.generation_config import resolve_draft_settings

    head_mode, _ = head_mode_and_layout(mode)
    config = DynaSpecGenerationConfig(head_mode=head_mode, implementation=dict(
        shortlist_layout="lanes", tree_growth="device", draft_graphs="off"))
    settings = resolve_draft_settings(config, None, drafter.config, ctx.device.type)
    settings = dataclasses.replace(settings, draft_graphs="on" if graphed else "off")
    context, width = ctx.plan.drafter_context, len(drafter.config.feature_layer_ids) * drafter.config.hidden_size
    emulate = graphed and ctx.device.type != "cuda"
    with mock.patch.object(graphs, "backend_for", lambda device: graphs.ReplayEmulation()) if emulate else \
            contextlib.nullcontext():
        generator = DynaSpecCandidateGenerator(drafter, settings, max_length=context + 64)
    features = torch.randn(context, width, device=ctx.device, dtype=drafter.dtype)  # (L, k * d)
    generator.extend(features, torch.randint(0, drafter.config.vocab_size, (context,), device=ctx.device))
    return generator


def step_inputs(generator: Any, positions: int) -> tuple[torch.Tensor, ...]:
    """F frontier nodes at draft position 1, children of the root: tokens (F,), parents (F, d), positions (F,),
    the mask over the committed cache and themselves (widened to a static cache's size)."""
    from hf_dynaspec.masks import additive_mask

    drafter, committed, device = generator.drafter, generator.committed, generator.device
    tokens = torch.randint(0, drafter.config.vocab_size, (positions,), device=device)
    parents = generator.root.feature[None].expand(positions, -1).contiguous()  # (F, d)
    allowed = torch.zeros(positions, committed + positions, dtype=torch.bool, device=device)
    allowed[:, :committed] = True
    allowed[:, committed:] = torch.eye(positions, dtype=torch.bool, device=device)
    mask = generator._fit(additive_mask(allowed, drafter.dtype))
    return tokens, parents, torch.full((positions,), committed, device=device), mask


def run_once(generator: Any, inputs: tuple[torch.Tensor, ...], budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's children (F, k) and their log q, the drafter cache put back after."""
    from hf_dynaspec.generation.verification.cache import crop_cache

    _, _, (children, log_q) = generator._run_step(*inputs, budget)
    crop_cache(generator.cache, generator.committed)
    return children, log_q


def step_row(ctx: Context, eager: Any, graphed: Any, positions: int, budget: int) -> dict[str, Any]:
    """Eager and graphed times of one step shape, and whether both propose the same children (same seed: the
    same committed pairs and frontier)."""
    from hf_dynaspec.generation.verification.cache import crop_cache

    inputs = {}
    for name, generator in (("eager", eager), ("graphed", graphed)):
        torch.manual_seed(ctx.args.seed + positions)
        inputs[name] = step_inputs(generator, positions)
    (tokens_e, logq_e), (tokens_g, logq_g) = (run_once(g, inputs[n], budget)
                                              for n, g in (("eager", eager), ("graphed", graphed)))
    row = dict(same_children=bool(torch.equal(tokens_e, tokens_g)),
               max_log_q_diff=float((logq_e - logq_g).abs().nan_to_num(0.0).max()))
    for name, generator in (("eager", eager), ("graphed", graphed)):
        row[f"{name}_ms"] = ctx.time_ms(lambda g=generator, x=inputs[name]: g._run_step(*x, budget),
                                        reset=lambda g=generator: crop_cache(g.cache, g.committed))
    return row


def step_rows(ctx: Context, shape: str, drafter: Any, bar: tqdm) -> list[dict[str, Any]]:
    rows = []
    budget = drafter.config.shortlist_k0
    for mode in STEP_HEAD_MODES:
        generators = []
        for graphed in (False, True):
            torch.manual_seed(ctx.args.seed)  # both on the same committed pairs
            generators.append(step_generator(ctx, drafter, mode, graphed))
        eager, graphed = generators
        for positions in ctx.plan.drafter_rows:
            row = dict(shape=shape, d=drafter.config.hidden_size, vocab=drafter.config.vocab_size,
                       positions=positions, head_mode=mode, clusters=budget,
                       **step_row(ctx, eager, graphed, positions, budget))
            fallbacks = graphed.graphs.fallbacks
            row["fallback"] = "; ".join(sorted(set(fallbacks.values()))) or None
            row["graph_speedup"] = row["eager_ms"] / row["graphed_ms"]
            rows.append(row)
            bar.update()
        del eager, graphed, generators
    full = {r["positions"]: r["graphed_ms"] for r in rows if r["head_mode"] == "full"}
    for r in rows:
        r["vs_full_step"] = r["graphed_ms"] / full[r["positions"]] if r["positions"] in full else None
    return rows


def run_steps(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    bar = tqdm(total=len(plan.step_targets) * len(plan.drafter_rows) * len(STEP_HEAD_MODES), desc="steps",
               file=sys.stderr)
    rows = rows_per_target(ctx, plan.step_targets, step_rows, bar)
    notes = [f"draft step on {plan.drafter_context} committed positions, {plan.num_clusters} random clusters, "
             f"k0 = {plan.num_clusters // 8} per node; vs_full_step: graphed step time / the full head's"]
    if ctx.device.type != "cuda":
        notes.append("not CUDA: the graphed column replays ReplayEmulation traces (a code-path check, not a time)")
    return {"rows": rows, "notes": notes}

"""The GPU suite's decoding sections (`benchmarks/gpu_suite.py` runs them): greedy exactness against plain
greedy, host synchronisations per step, and the end-to-end step cost of each candidate default tree.

    python benchmarks/gpu_suite.py --quick --device cpu --sections exactness syncs trees --out /tmp/gpu-suite
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from typing import Any
from unittest import mock

import torch
from gpu_common import (  # noqa: E402
    DRAFTING,
    Context,
    DynaSpecDrafter,
    DynaSpecGenerationConfig,
    HostSyncCounter,
    decoding,
    progress,
    prompt_ids,
    random_model,
    release_memory,
    require_package,
    time_ms,
)
from gpu_timing import random_drafter  # noqa: E402
from tqdm.auto import tqdm

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

    def counted(target_: torch.nn.Module, batch: Any) -> None:
        run = batch.rows[0]  # one sequence
        before = run.input_ids.shape[1]
        with HostSyncCounter() as counter:
            original(target_, batch)
        steps.append((counter.total, run.input_ids.shape[1] - before, counter.counts))

    with mock.patch.object(decoding, "speculative_step", counted):
        target.generate(ids, generation_config=config, assistant_model=drafter)
    return steps


def sync_row(name: str, tree: str, drafting: str, steps: list[tuple[int, int, Counter[str]]]) -> dict[str, Any]:
    reads = [s[0] for s in steps]
    kinds: Counter[str] = Counter()
    for _, _, counts in steps:
        kinds.update(counts)
    return dict(target=name, tree=tree, drafting=drafting, steps=len(steps), mean=statistics.fmean(reads) if reads else 0.0,
                max=max(reads, default=0), tokens_per_step=statistics.fmean(s[1] for s in steps) if steps else 0.0,
                by_kind={k: v / max(1, len(steps)) for k, v in kinds.most_common()})


def run_syncs(ctx: Context) -> dict[str, Any]:
    require_package()
    plan = ctx.plan
    dtype = ctx.dtype if ctx.device.type == "cuda" else torch.float32
    bar = progress(len(plan.sync_targets) * len(plan.trees) * len(DRAFTING), "syncs")
    rows = []
    for name in plan.sync_targets:
        family, fields = plan.exact_targets[name]
        target = random_model(family, fields, dtype, ctx.device, seed=ctx.args.seed)
        drafter = DynaSpecDrafter.from_target(target, num_clusters=plan.num_clusters, seed=ctx.args.seed).eval()
        ids = prompt_ids(1, plan.prompt_length, fields["vocab_size"], ctx.device)
        for (tree, settings), (drafting, where) in itertools.product(plan.trees.items(), DRAFTING.items()):
            # the whole tree every step: host vs device drafting compared on the same drafted steps
            config = DynaSpecGenerationConfig(**settings, implementation=where, max_new_tokens=plan.new_tokens, do_sample=False,
                                              step_policy="off")
            rows.append(sync_row(name, tree, drafting, count_syncs(target, drafter, ids, config)))
            bar.update()
        del target, drafter
        release_memory(ctx.device)
    bar.close()
    return {"rows": rows, "dtype": str(dtype), "notes": [
        "by_kind: host reads per step by kind",
        "drafting: host = union shortlists and host tree growth; device = lanes and fixed-shape growth (CUDA's "
        "default); on a CPU target the walk also reads one value per emitted token (its lazy LM-head walk)"]}


# ---------------------------------------------------------------------------------------------- trees


def candidate_trees() -> list[dict[str, Any]]:
    """benchmarks/device_tree.py's candidate default trees (its SWEEPS), as generate() settings."""
    import device_tree  # a sibling: gpu_suite puts benchmarks/ on sys.path

    return [dict(num_draft_nodes=n, draft_depth=d, draft_top_k=k, min_draft_prob=0.0)
            for trees in device_tree.SWEEPS.values() for n, d, k in trees]


def generate_timed(ctx: Context, target: torch.nn.Module, ids: torch.Tensor, tokens: int, warmup: int = 0,
                   **kwargs: Any) -> tuple[float, Any]:
    """(median ms of `target.generate` over `tokens` new tokens, timed as every section times (`time_ms`), the
    last output)."""
    outputs = []
    call = lambda: outputs.append(target.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens,  # noqa: E731
                                                  do_sample=False, **kwargs))
    return time_ms(call, ctx.device, max(1, ctx.plan.repeats // 10), warmup), outputs[-1]


def step_ms(ctx: Context, target: torch.nn.Module, ids: torch.Tensor, **kwargs: Any) -> tuple[float, int, Any]:
    """(ms per decoding step, steps, output) from calls of `step_tokens` and of 1 new token (the difference drops
    the prefill), the first after one untimed call (Triton compiles per shape class). Plain decoding takes one
    step per token after the first; a speculative call counts its steps."""
    n = ctx.plan.step_tokens
    all_ms, out = generate_timed(ctx, target, ids, n, warmup=1, **kwargs)
    first_ms, first = generate_timed(ctx, target, ids, 1, **kwargs)
    stats = getattr(out, "speculative_stats", None)
    steps = n - 1 if stats is None else stats.steps - first.speculative_stats.steps
    return (all_ms - first_ms) / max(1, steps), steps, out


def tree_step_row(ctx: Context, target: torch.nn.Module, drafter: DynaSpecDrafter, ids: torch.Tensor,
                  tree: dict[str, Any], plain_ms: float) -> dict[str, Any]:
    """One tree's decoding step, end to end (draft, verify, walk, extend), and its cost in plain steps."""
    config = DynaSpecGenerationConfig(**tree, lookup_num_tokens=0, return_dict_in_generate=True,
                                      step_policy="off")  # the candidate tree itself, every step
    ms, steps, out = step_ms(ctx, target, ids, generation_config=config, assistant_model=drafter)
    return dict(tree=tree, steps=steps, tokens_per_step=(ctx.plan.step_tokens - 1) / max(1, steps),
                tree_nodes_per_step=out.speculative_stats.mean_tree_size, step_ms=ms, cost=ms / plain_ms)


def run_trees(ctx: Context) -> dict[str, Any]:
    """The step cost of every candidate default tree on the verify section's target, measured: what
    benchmarks/device_tree.py otherwise models as c(1 + nodes) + depth x r."""
    require_package()
    plan, trees = ctx.plan, candidate_trees()
    target = random_model("llama", plan.verify_model, ctx.dtype, ctx.device, seed=ctx.args.seed)
    drafter = random_drafter(target, ctx)
    ids = prompt_ids(0, plan.step_context, plan.verify_model["vocab_size"], ctx.device)
    plain_ms, _, _ = step_ms(ctx, target, ids)
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


# ---------------------------------------------------------------------------------------------- batch

# generate() settings per method (None: plain batched generate); "whole-tree": every row drafts and verifies the
# whole tree every step (the step policy off), the cost of a drafted batch step at each B
BATCH_METHODS: dict[str, dict[str, Any] | None] = {"plain": None, "dynaspec": {},
                                                   "dynaspec-whole-tree": {"step_policy": "off"}}


def batch_prompts(size: int, length: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` random prompts of mixed lengths (every third row a quarter shorter, the next a half), left-padded with
    token 0 (`batch_speed.left_pad`): input_ids and attention_mask (B, length)."""
    from batch_speed import left_pad  # a sibling: gpu_suite puts benchmarks/ on sys.path

    rows = [prompt_ids(b, length - (b % 3) * (length // 4), vocab, torch.device("cpu"))[0].tolist()
            for b in range(size)]
    ids, mask = left_pad(rows, 0)  # (B, length) each
    return ids.to(device), mask.to(device)


def batch_rows(ctx: Context, target: torch.nn.Module, drafter: DynaSpecDrafter, size: int, vocab: int
               ) -> list[dict[str, Any]]:
    """Every method at batch size `size` on the same padded batch: ms per call of `batch_tokens` new tokens per
    row (after one untimed call), tokens/s, speedup over plain batched generate(), rows identical to plain's."""
    plan = ctx.plan
    ids, mask = batch_prompts(size, plan.prompt_length, vocab, ctx.device)
    rows, plain = [], None
    for method, settings in BATCH_METHODS.items():
        kwargs: dict[str, Any] = dict(attention_mask=mask, pad_token_id=0)
        if settings is not None:
            kwargs.update(assistant_model=drafter, generation_config=DynaSpecGenerationConfig(**settings))
        ms, out = generate_timed(ctx, target, ids, plan.batch_tokens, warmup=1, **kwargs)
        new = out[:, ids.shape[1]:]  # (B, batch_tokens)
        plain = new if plain is None else plain
        same = [bool(torch.equal(a, b)) for a, b in zip(new, plain)]
        rows.append(dict(batch_size=size, method=method, ms=ms, tokens_per_s=1e3 * size * plan.batch_tokens / ms,
                         identical_rows=sum(same), rows=size))
    for row in rows:
        row["speedup"] = rows[0]["ms"] / row["ms"]
    return rows


def run_batch(ctx: Context) -> dict[str, Any]:
    """Batched decoding at each batch size on the SmolLM2-shaped random target in `--dtype`: plain batched
    generate(), DynaSpec with its step policy, and the whole tree every step."""
    require_package()
    plan = ctx.plan
    family, fields = plan.exact_targets["smollm2"]
    dtype = ctx.dtype if ctx.device.type == "cuda" else torch.float32
    target = random_model(family, fields, dtype, ctx.device, seed=ctx.args.seed)
    drafter = DynaSpecDrafter.from_target(target, num_clusters=plan.num_clusters, seed=ctx.args.seed).eval()
    bar = progress(len(plan.batch_sizes), "batch")
    rows = []
    for size in plan.batch_sizes:
        rows += batch_rows(ctx, target, drafter, size, fields["vocab_size"])
        bar.update()
    bar.close()
    del target, drafter
    release_memory(ctx.device)
    return {"rows": rows, "dtype": str(dtype).removeprefix("torch."), "new_tokens": plan.batch_tokens,
            "notes": ["random target and drafter: next to no draft is accepted, so 'dynaspec' shows the step "
                      "policy's floor at each B (its plain steps and probes) and 'dynaspec-whole-tree' what a drafted "
                      "batch step costs; identical rows: against plain batched generate() of the same padded batch",
                      "prompts of mixed lengths, left-padded (token 0) with an attention mask"]}

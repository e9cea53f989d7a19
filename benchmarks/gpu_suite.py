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
- steps:     one draft step as decoding runs it (`draft_step`: layer, router beside it, head, top-k children)
             eager and replayed as a CUDA graph (`draft_graphs`), dynamic-lanes / static / full heads, at the
             SmolLM2, Llama-3.1-8B and Gemma 3 270M shapes (`gpu_steps.py`); the report sets the Llama step
             against a plain target step (the verify section's n = 1 forward).
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
- batch:     batched decoding at B in {1, 2, 4, 8, 16, 32} on the SmolLM2-shaped random target (prompts of mixed
             lengths, left-padded): plain batched generate(), DynaSpec (step policy on) and the whole tree every
             step; ms per call, tokens/s, speedup over plain at the same B, rows identical to plain's.

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
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is loaded

from gpu_common import (  # noqa: E402
    FULL,
    PACKAGE_ERROR,
    QUICK,
    SECTIONS,
    Context,
    release_memory,
)
from gpu_decoding import run_batch, run_exactness, run_syncs, run_trees  # noqa: E402
from gpu_report import render_markdown  # noqa: E402
from gpu_steps import run_steps  # noqa: E402
from gpu_timing import run_drafter, run_head, run_verify  # noqa: E402

RUNNERS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "head": run_head, "verify": run_verify, "drafter": run_drafter, "steps": run_steps, "exactness": run_exactness,
    "syncs": run_syncs, "trees": run_trees, "batch": run_batch,
}



# ---------------------------------------------------------------------------------------------- driver


def version_of(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def source_hash() -> str:
    """sha256 (first 16 hex digits) of the code a section measures: the package, the kernels, the suite's scripts.
    A section saved by other code is redone."""
    root = Path(__file__).resolve().parent.parent
    paths = sorted([*(root / "hf_dynaspec").rglob("*.py"), *(root / "kernels").rglob("*.py"),
                    *Path(__file__).resolve().parent.glob("gpu_*.py")])
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def environment(ctx: Context) -> dict[str, Any]:
    device = ctx.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return dict(
        device=name, device_type=device.type, torch=torch.__version__, triton=version_of("triton", "pytorch-triton"),
        transformers=transformers.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        threads=torch.get_num_threads(), timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), quick=ctx.args.quick, dtype=str(ctx.dtype), peak_gbps=ctx.args.peak_gbps,
        source=source_hash(),
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
    """A saved section counts when it comes from a run of the same kind (quick or not) on the same device type,
    of the same code (`source_hash`)."""
    if not path.exists() or ctx.args.force:
        return False
    with contextlib.suppress(ValueError, OSError):
        meta = json.loads(path.read_text()).get("meta", {})
        return (meta.get("quick") == ctx.args.quick and meta.get("device_type") == ctx.device.type
                and meta.get("source") == source_hash())
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

"""Micro-benchmark of LM heads restricted to a shortlist of the vocabulary.

For a shortlist holding `fraction` of the V rows it times, in fp32:

- dense:     hidden @ W.T over the whole vocabulary (the baseline; "ideal" = fraction * dense);
- gathered:  hf_dynaspec.ops.gathered_lm_head with its default backend (Triton on CUDA), on random ids;
- idx+mm:    index_select of the shortlist rows on every call, then matmul (the naive path);
- segmented: hf_dynaspec.ops.segmented_lm_head on a cluster-sorted layout (the dynamic head's CPU path): V split
             into M=64 equal contiguous clusters (256 for gemma3, as its drafter), M / fraction random clusters
             selected (adjacent ones merge);
- static:    the shortlist rows copied once into a contiguous matrix, then hidden @ W_s.T
             (the best case a fixed shortlist can reach; the copy is not timed);
- dense^T:   the whole vocabulary with the weight laid out transposed, hidden @ W_t (W_t: (d, V) contiguous),
             the other layout verification may choose for the target's own rows.

Reported: median time (ms), time / ideal, and gathered / static and segmented / static. With `--target NAME`
the weight is the real target's LM head, and one plain decoding step of that target (one token after 128 of
context, its full-vocabulary head included) is timed in the same run, so every head cost is also given as a
share of a decoding step. `--out DIR` writes results.json and results.md.

    python benchmarks/bench_head.py --shapes smollm            # ~1 min on one CPU core
    python benchmarks/bench_head.py --shapes all --quick       # llama3 shape needs ~4 GB of RAM
    python benchmarks/bench_head.py --shapes gemma3 --target gemma3 --threads 2 --positions 1 2 4 8 \
        --out benchmarks/results/cpu-gemma3-head               # Gemma 3 270M's 262,144 x 640 head, ~3 min
    python benchmarks/bench_head.py --shapes all --device cuda --dtype bfloat16 --positions 1 8 32 64  # GPU, < 3 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a source checkout

from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.ops import gathered_lm_head, resolve_head_backend, segmented_lm_head  # noqa: E402

SHAPES: dict[str, tuple[int, int]] = {"smollm": (49152, 576), "llama3": (128256, 4096), "gemma3": (262144, 640)}
TARGET_SHAPES = {"smollm2": "smollm", "gemma3": "gemma3"}  # --target NAME: the shape its head has
FRACTIONS: tuple[int, ...] = (2, 4, 8, 16)  # shortlist = V / fraction
# at 262k tokens the shortlists that matter are smaller: 1/8 = 32,768 (FR-Spec's usual size) down to 1/64 (4,096)
SHAPE_FRACTIONS: dict[str, tuple[int, ...]] = {"gemma3": (8, 16, 32, 64)}
POSITIONS: tuple[int, ...] = (1, 8)
NUM_CLUSTERS = 64
SHAPE_CLUSTERS: dict[str, int] = {"gemma3": 256}  # as many as the Gemma drafter has


@dataclass
class Row:
    shape: str
    n: int
    fraction: int
    shortlist: int  # rows scored: V // fraction
    dense_ms: float
    gathered_ms: float
    index_select_ms: float
    segmented_ms: float
    static_ms: float
    dense_t_ms: float


def median_ms(fn: Callable[[], object], repeats: int, warmup: int, device: torch.device) -> float:
    """Median wall time of ``fn`` in milliseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def random_clusters(
    vocab: int, fraction: int, gen: torch.Generator, clusters: int = NUM_CLUSTERS
) -> tuple[list[int], list[int]]:
    """Row ranges of ``clusters // fraction`` random equal-size clusters, in layout order."""
    bounds = torch.linspace(0, vocab, clusters + 1).round().long().tolist()
    chosen = torch.randperm(clusters, generator=gen)[: clusters // fraction].sort().values.tolist()
    return [bounds[c] for c in chosen], [bounds[c + 1] for c in chosen]


def bench_case(
    shape: str, weight: torch.Tensor, n: int, fraction: int, args: argparse.Namespace, gen: torch.Generator
) -> Row:
    vocab, d = weight.shape
    device = weight.device
    hidden = torch.randn(n, d, generator=gen).to(device, weight.dtype)  # (N, d)
    ids = torch.randperm(vocab, generator=gen)[: vocab // fraction].to(device)  # (S,)
    starts, ends = random_clusters(vocab, fraction, gen, SHAPE_CLUSTERS.get(shape, NUM_CLUSTERS))
    static_rows = weight[ids].contiguous()  # (S, d), made once
    weight_t = weight.T.contiguous()  # (d, V), made once

    tol = 1e-4 if weight.dtype == torch.float32 else 2e-2  # bf16/fp16: output rounding of the dtype
    torch.testing.assert_close(
        gathered_lm_head(hidden, weight, ids).float(), (hidden @ static_rows.T).float(), rtol=tol, atol=tol * 10
    )

    def timed(fn: Callable[[], object]) -> float:
        return median_ms(fn, args.repeats, args.warmup, device)

    row = Row(
        shape=shape,
        n=n,
        fraction=fraction,
        shortlist=len(ids),
        dense_ms=timed(lambda: hidden @ weight.T),
        gathered_ms=timed(lambda: gathered_lm_head(hidden, weight, ids)),
        index_select_ms=timed(lambda: hidden @ weight.index_select(0, ids).T),
        segmented_ms=timed(lambda: segmented_lm_head(hidden, weight, starts, ends)),
        static_ms=timed(lambda: hidden @ static_rows.T),
        dense_t_ms=timed(lambda: hidden @ weight_t),
    )
    return row


def format_row(row: Row) -> str:
    ideal = row.dense_ms / row.fraction
    return (
        f"{row.shape:<7} {row.n:>2} 1/{row.fraction:<3} {row.dense_ms:>9.3f} {ideal:>8.3f} | "
        f"{row.gathered_ms:>9.3f} {row.gathered_ms / ideal:>6.2f}x {row.gathered_ms / row.static_ms:>6.2f}x | "
        f"{row.index_select_ms:>9.3f} {row.index_select_ms / ideal:>6.2f}x | "
        f"{row.segmented_ms:>9.3f} {row.segmented_ms / ideal:>6.2f}x {row.segmented_ms / row.static_ms:>6.2f}x | "
        f"{row.static_ms:>9.3f} {row.static_ms / ideal:>6.2f}x | {row.dense_t_ms:>9.3f}"
    )


HEADER = (
    f"{'shape':<7} {'N':>2} {'frac':<5} {'dense ms':>9} {'ideal ms':>8} | "
    f"{'gathered':>9} {'/ideal':>7} {'/static':>7} | "
    f"{'idx+mm':>9} {'/ideal':>7} | "
    f"{'segmentd':>9} {'/ideal':>7} {'/static':>7} | "
    f"{'static':>9} {'/ideal':>7} | {'dense^T':>9}"
)


@torch.no_grad()
def target_head_and_step(name: str, args: argparse.Namespace) -> tuple[torch.Tensor, float]:
    """(the target's LM head weight (V, d), median ms of one plain decoding step: one token after 128 of
    context with its KV cache, the full-vocabulary head included), both from the real target."""
    from hf_dynaspec.generation.verification.cache import crop_cache
    from hf_dynaspec.targets import load_target

    target, _ = load_target(name)
    if args.threads > 0:
        torch.set_num_threads(args.threads)  # loading may reset it
    context = torch.randint(0, target.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
    prefill = target(context, use_cache=True)
    token = prefill.logits[:, -1:].argmax(-1)  # (1, 1)

    def step() -> None:
        cache = prefill.past_key_values
        target(token, past_key_values=cache, use_cache=True)
        crop_cache(cache, context.shape[1])  # back to the context, so every timed step sees the same 128 tokens

    step_ms = median_ms(step, args.repeats, args.warmup, torch.device("cpu"))
    return target.get_output_embeddings().weight.detach(), step_ms


def markdown(rows: list[Row], meta: dict) -> str:
    """Per shortlist fraction and row count: ms of each head (and its share of a plain decoding step)."""
    step = meta.get("plain_step_ms")
    share = (lambda ms: f"{ms:.2f} ({ms / step:.0%})") if step else (lambda ms: f"{ms:.2f}")
    lines = [f"LM heads, {meta['dtype']}, on {meta['machine']} (`{meta['command']}`)."]
    if step:
        lines.append(f"One plain decoding step of {meta['target']} (one token after 128, its full head included): "
                     f"{step:.1f} ms; in brackets each head's share of it.")
    lines += ["", "| shape | rows | shortlist | full head | full head, W^T | gathered ids (GPU path) "
              "| segmented clusters (dynamic, CPU path) | static (contiguous copy) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.shape} | {r.n} | {r.shortlist:,} (1/{r.fraction}) | {share(r.dense_ms)} | {share(r.dense_t_ms)} | "
                     f"{share(r.gathered_ms)} | {share(r.segmented_ms)} | {share(r.static_ms)} |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, rows: list[Row], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    (out / "results.md").write_text(markdown(rows, meta))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", choices=(*SHAPES, "all"), default="smollm")
    parser.add_argument("--target", choices=sorted(TARGET_SHAPES), default=None,
                        help="use this target's real head for its shape and time one plain decoding step (CPU)")
    parser.add_argument("--out", type=Path, default=None, help="write results.json and results.md here")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per case (default 15, quick 5)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats and warm-up calls")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS), help="draft positions N")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (5 if args.quick else 15)
    args.warmup = 1 if args.quick else 3
    if args.target and args.shapes not in ("all", TARGET_SHAPES[args.target]):
        parser.error(f"--target {args.target} has the {TARGET_SHAPES[args.target]!r} shape: pass --shapes "
                     f"{TARGET_SHAPES[args.target]} (or all)")
    if args.target and args.device != "cpu":
        parser.error("--target times the plain step on CPU: pass --device cpu")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    names = list(SHAPES) if args.shapes == "all" else [args.shapes]
    real, step_ms = target_head_and_step(args.target, args) if args.target else (None, None)
    meta = {"machine": machine_description(), "dtype": args.dtype, "repeats": args.repeats, "target": args.target,
            "plain_step_ms": step_ms, "backend": resolve_head_backend(device),
            "clusters": {name: SHAPE_CLUSTERS.get(name, NUM_CLUSTERS) for name in names},
            "command": "python benchmarks/bench_head.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    print(f"device={device} threads={torch.get_num_threads()} dtype={args.dtype} repeats={args.repeats} "
          f"gathered backend={meta['backend']} clusters={meta['clusters']}"
          + (f" plain step of {args.target}: {step_ms:.1f} ms" if step_ms else ""))
    print(HEADER)
    rows = []
    for name in names:
        vocab, d = SHAPES[name]
        if real is not None and name == TARGET_SHAPES[args.target]:
            weight = real.to(device, getattr(torch, args.dtype))  # (V, d): the target's own head
        else:
            weight = torch.randn(vocab, d, generator=gen).to(device, getattr(torch, args.dtype))  # (V, d)
        for n in args.positions:
            for fraction in SHAPE_FRACTIONS.get(name, FRACTIONS):
                rows.append(bench_case(name, weight, n, fraction, args, gen))
                print(format_row(rows[-1]), flush=True)
        del weight
    if args.out:
        write_results(args.out, rows, meta)
        print(f"wrote {args.out}/results.json and results.md")


if __name__ == "__main__":
    main()

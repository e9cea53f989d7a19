"""Benchmark spherical k-means vocabulary clustering on CPU.

Times :func:`hf_dynaspec.clustering.fit_spherical_kmeans` on LM-head-shaped matrices:

* ``small``: 49152 x 576 (SmolLM2-135M head),
* ``large``: 128256 x 4096 (Llama-3-8B head), 2.1 GB in fp32,

with M = 64 clusters (``--clusters 64 256`` adds M = 256). The matrix is low-rank plus noise by
default (closer to a real LM head than i.i.d. noise), or i.i.d. Gaussian with ``--matrix random``.

    python benchmarks/bench_clustering.py                 # both shapes, M=64, 20 iterations
    python benchmarks/bench_clustering.py --quick         # 3 iterations per case
    python benchmarks/bench_clustering.py --cases large --clusters 64 256
"""

from __future__ import annotations

import argparse
import time

import torch

from hf_dynaspec.clustering import VocabClusters, fit_spherical_kmeans

CASES = {"small": (49152, 576), "large": (128256, 4096)}


def make_matrix(vocab_size: int, dim: int, kind: str, rank: int, seed: int) -> torch.Tensor:
    """(V, d) fp32: i.i.d. N(0, 1), or U B / sqrt(r) + 0.5 N(0, 1) with U (V, r), B (r, d)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab_size, dim, generator=generator)  # (V, d)
    if kind == "lowrank":
        u = torch.randn(vocab_size, rank, generator=generator)  # (V, r)
        b = torch.randn(rank, dim, generator=generator)  # (r, d)
        weight.mul_(0.5).addmm_(u, b, alpha=rank**-0.5)  # in place: no second (V, d) temporary
    return weight


def run_case(weight: torch.Tensor, num_clusters: int, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    result = fit_spherical_kmeans(
        weight,
        num_clusters,
        seed=args.seed,
        max_iters=args.max_iters,
        chunk_size=args.chunk_size,
        show_progress=args.progress,
    )
    total = time.perf_counter() - t0
    sizes = VocabClusters.from_assignments(result.assignments, num_clusters).sizes().float()
    vocab_size, dim = weight.shape
    print(
        f"V={vocab_size:>6} d={dim:>4} M={num_clusters:>3}: total {total:7.2f} s | "
        f"init {result.init_seconds:6.2f} s | {result.iterations:>2} iters, "
        f"{result.iter_seconds / result.iterations:6.3f} s/iter | converged={result.converged} | "
        f"mean cos {result.mean_cosine:.4f} | sizes min {int(sizes.min())} "
        f"median {int(sizes.median())} max {int(sizes.max())}",
        flush=True,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["small", "large"])
    parser.add_argument("--clusters", type=int, nargs="+", default=[64])
    parser.add_argument("--matrix", choices=["lowrank", "random"], default="lowrank")
    parser.add_argument("--rank", type=int, default=64, help="rank of the low-rank part")
    parser.add_argument("--max-iters", type=int, default=20)
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 iterations per case")
    parser.add_argument("--progress", action="store_true", help="tqdm progress bar")
    args = parser.parse_args()
    if args.quick:
        args.max_iters = min(args.max_iters, 3)
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.matrix} matrix")
    for case in args.cases:
        vocab_size, dim = CASES[case]
        t0 = time.perf_counter()
        weight = make_matrix(vocab_size, dim, args.matrix, args.rank, args.seed)
        print(f"[{case}] generated {vocab_size} x {dim} in {time.perf_counter() - t0:.1f} s", flush=True)
        for num_clusters in args.clusters:
            run_case(weight, num_clusters, args)
        del weight


if __name__ == "__main__":
    main()

"""How many tokens does greedy verification's bf16 prefilter (`hf_dynaspec/generation/verification/prefilter.py`, the maths
there) leave to rescore on a real target's answer positions, and is its pick always the fp32 argmax?

It measures, on answer positions of stored features (`hf-dynaspec features`: their `hidden` is the target's
final normed state), how many candidates the bound leaves, that the fp32 argmax is always among them, and the
largest realised error as a share of the bound; with --timing also the head's milliseconds for r rows: fp32
against the prefilter's picks (meaningful only on an otherwise idle machine).

    python benchmarks/verify_prefilter.py --features runs/gemma3-ml/features/en \
        --out benchmarks/results/cpu-gemma3-verify-prefilter
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import save_results  # noqa: E402

from hf_dynaspec.generation.verification.prefilter import BOUND_FACTOR, Prefilter, bounds  # noqa: E402
from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.targets import load_target  # noqa: E402
from hf_dynaspec.training.data import load_dataset  # noqa: E402


def answer_states(folders: list[Path], count: int, seed: int) -> torch.Tensor:
    """`count` final hidden states (n, d) fp32 of answer positions drawn at random from feature folders."""
    rows = []
    for folder in folders:
        for conv in load_dataset(folder):
            rows.append(conv.hidden[conv.loss_mask[1:]])  # states whose next token is an answer token
    states = torch.cat(rows)  # (N, d)
    pick = torch.randperm(states.shape[0], generator=torch.Generator().manual_seed(seed))[:count]
    return states[pick.sort().values].float()  # (n, d)


def measure(hidden: torch.Tensor, prefilter: Prefilter) -> dict:
    """Candidates per position, the argmax check (against the correctly rounded fp32 logits, computed in fp64)
    and the realised error over the bound."""
    weight64 = prefilter.weight.double()  # (V, d)
    counts, inside, same, worst = [], 0, True, 0.0
    for chunk in hidden.split(64):
        exact = chunk.double() @ weight64.T  # (n, V)
        best = exact.float().argmax(-1)  # (n,)
        keep, approx = prefilter.candidates(chunk)
        counts += keep.sum(-1).tolist()
        inside += int(keep.gather(1, best[:, None]).sum())
        same &= bool((prefilter.argmax(chunk) == best).all())
        worst = max(worst, float(((approx.double() - exact).abs() / bounds(chunk, prefilter.row_norms)).max()))
    ordered = sorted(counts)
    return {"positions": len(counts), "argmax_among_candidates": inside, "prefilter_argmax_equals_fp32": same,
            "largest_error_over_bound": worst, "candidates_mean": statistics.fmean(counts),
            "candidates_median": statistics.median(counts),
            "candidates_p90": ordered[int(0.9 * (len(ordered) - 1))],
            "candidates_p99": ordered[int(0.99 * (len(ordered) - 1))], "candidates_max": ordered[-1]}


def timings(hidden: torch.Tensor, prefilter: Prefilter, rows: list[int], repeats: int) -> dict[str, dict]:
    """Median milliseconds of the fp32 head and of the prefilter's picks, per row count."""
    ways = {"fp32 head": lambda h: h @ prefilter.weight.T, "bf16 pass + rescoring (prefilter)": prefilter.argmax}
    out: dict[str, dict] = {}
    for name, fn in ways.items():
        for r in rows:
            fn(hidden[:r])  # warm-up
            times = []
            for i in range(repeats):
                start = time.perf_counter()
                fn(hidden[i * r : (i + 1) * r])
                times.append(time.perf_counter() - start)
            out.setdefault(name, {})[str(r)] = 1e3 * statistics.median(times)
    return out


def report(result: dict) -> str:
    m = result["candidates"]
    lines = [f"bf16 prefilter of the {result['meta']['target']} head ({result['meta']['vocab']:,} x "
             f"{result['meta']['hidden']}), {m['positions']:,} answer positions of `{result['meta']['features']}`, "
             f"bound {BOUND_FACTOR} u ||h|| ||w|| (`hf_dynaspec/generation/verification/prefilter.py`), on {result['meta']['machine']}. "
             "`python benchmarks/verify_prefilter.py`", "",
             "| candidates per position: mean | median | p90 | p99 | max | fp32 argmax among them | "
             "prefilter argmax = fp32 argmax | largest error / bound |", "|---|---|---|---|---|---|---|---|",
             f"| {m['candidates_mean']:,.1f} | {m['candidates_median']:,.0f} | {m['candidates_p90']:,} | "
             f"{m['candidates_p99']:,} | {m['candidates_max']:,} | {m['argmax_among_candidates']} of "
             f"{m['positions']} | {m['prefilter_argmax_equals_fp32']} | {m['largest_error_over_bound']:.3f} |"]
    if result.get("timing_ms"):
        rows = list(next(iter(result["timing_ms"].values())))
        lines += ["", "| head (ms, median) | " + " | ".join(f"r = {r}" for r in rows) + " |",
                  "|---" * (len(rows) + 1) + "|"]
        lines += [f"| {name} | " + " | ".join(f"{t[r]:.1f}" for r in rows) + " |"
                  for name, t in result["timing_ms"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="gemma3")
    parser.add_argument("--features", type=Path, nargs="+", required=True, help="feature folders of that target")
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing", action="store_true", help="also time the heads (on an idle machine only)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target)
    head = target.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise SystemExit("this probe takes a head without bias")
    prefilter = Prefilter.of(head.weight.detach().float())  # the head (V, d) and its bf16 copy, made once
    vocab, width = prefilter.weight.shape
    hidden = answer_states(args.features, args.positions, args.seed)
    result = {"meta": {"target": args.target, "vocab": vocab, "hidden": width,
                       "features": " ".join(map(str, args.features)), "machine": machine_description()},
              "candidates": measure(hidden, prefilter)}
    if args.timing:
        result["timing_ms"] = timings(hidden, prefilter, args.rows, repeats=min(9, args.positions // max(args.rows)))
    print(save_results(args.out, result, report))


if __name__ == "__main__":
    main()

"""Two code versions timed in alternating rounds of `hf-dynaspec bench`: each round's speedup over plain (same run,
so machine drift cancels), their means and a bootstrap interval of the difference. Reads `<dir>/<label>-<n>/
results.json` for two labels; writes `<dir>/rounds.json` and `<dir>/rounds.md`.

    python benchmarks/compare_rounds.py benchmarks/results/cpu-smollm2-cpu-path-check --labels old new
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path


def overall(path: Path, method: str) -> dict:
    """The overall row of `method` in one bench run: its speedup over plain and tokens/s."""
    data = json.loads(path.read_text())
    row = next(s for s in data["summaries"] if s["category"] == "overall" and s["method"] == method)
    return {"speedup": row["speedup"], "tokens_per_s": row["tokens_per_s"], "machine": data["meta"]["machine"]}


def rounds(folder: Path, label: str, method: str) -> dict[int, dict]:
    found = {}
    for path in sorted(folder.glob(f"{label}-*/results.json")):
        found[int(path.parent.name.rsplit("-", 1)[1])] = overall(path, method)
    return found


def bootstrap_difference(a: list[float], b: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% interval of mean(b) - mean(a), resampling each side."""
    rng = random.Random(seed)
    diffs = sorted(statistics.fmean(rng.choices(b, k=len(b))) - statistics.fmean(rng.choices(a, k=len(a)))
                   for _ in range(draws))
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--labels", nargs=2, default=["old", "new"], metavar=("BEFORE", "AFTER"))
    parser.add_argument("--method", default="dynaspec")
    parser.add_argument("--rounds", type=int, nargs="+", default=None, help="only these rounds (default: all)")
    args = parser.parse_args(argv)
    before, after = ({n: r for n, r in rounds(args.folder, label, args.method).items()
                      if args.rounds is None or n in args.rounds} for label in args.labels)
    if not before or not after:
        raise SystemExit(f"no {args.labels[0]}-N / {args.labels[1]}-N runs in {args.folder}")
    a, b = [r["speedup"] for r in before.values()], [r["speedup"] for r in after.values()]
    low, high = bootstrap_difference(a, b)
    result = {"labels": args.labels, "method": args.method, args.labels[0]: before, args.labels[1]: after,
              "mean": {args.labels[0]: statistics.fmean(a), args.labels[1]: statistics.fmean(b)},
              "difference": statistics.fmean(b) - statistics.fmean(a), "difference_95": [low, high],
              "machines": sorted({r["machine"] for r in [*before.values(), *after.values()]})}
    (args.folder / "rounds.json").write_text(json.dumps(result, indent=1))
    lines = [f"{args.method} speedup over plain per round ({'; '.join(result['machines'])}):", "",
             "| round | " + " | ".join(args.labels) + " |", "|---|---|---|"]
    for n in sorted(set(before) | set(after)):
        cells = [f"{r[n]['speedup']:.3f}x" if n in r else "" for r in (before, after)]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [f"| mean | {result['mean'][args.labels[0]]:.3f}x | {result['mean'][args.labels[1]]:.3f}x |", "",
              f"{args.labels[1]} - {args.labels[0]}: {result['difference']:+.3f}x (95% bootstrap interval "
              f"{low:+.3f} to {high:+.3f})."]
    (args.folder / "rounds.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()

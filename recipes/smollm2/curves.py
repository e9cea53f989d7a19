"""Learning curves of a drafter training run: held-out top-1 at draft depths 1-3 against steps and positions seen.

Reads the `curve` that `hf-dynaspec train --eval-every N` keeps in the checkpoint's trainer_state.json and writes
`curve.json`, `curve.md` and `curve.png` into `--out` (with several data folders, e.g. one per language, also
their own held-out figures and `curve-groups.png`), and the table into recipes/smollm2/training.md (a generated
block), so the next person can see whether more data or more steps would pay. Several `--ckpt` are stages of one
drafter, in order (a run started from the previous stage's weights, e.g. on more data): their steps and positions
add up, and each point names its stage.

    python recipes/smollm2/curves.py --ckpt runs/smollm2-eagle3/ckpt --out benchmarks/results/cpu-smollm2-eagle3-train
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_dynaspec.bench import write_doc_block

HERE = Path(__file__).resolve().parent
DEPTHS = 3


def load_curve(ckpt: Path) -> tuple[list[dict], dict]:
    state = json.loads((ckpt / "trainer_state.json").read_text())
    curve = state.get("curve") or []
    if not curve:
        raise SystemExit(f"{ckpt}/trainer_state.json has no learning curve: train with --eval-every N")
    return curve, state


def chain(stages: list[tuple[list[dict], dict]]) -> list[dict]:
    """One curve from stages run one after the other: each stage's steps and positions offset by the totals of
    those before it (its trainer state's final step and positions seen); every point gets its 1-based stage."""
    points, steps, positions = [], 0, 0
    for number, (curve, state) in enumerate(stages, start=1):
        points += [p | {"stage": number, "step": p["step"] + steps, "positions_seen": p["positions_seen"] + positions}
                   for p in curve]
        steps += int(state["step"])
        positions += int(state.get("positions_seen", curve[-1]["positions_seen"]))
    return points


def trend(curve: list[dict], depth: int) -> float | None:
    """Held-out top-1 gained over the last quarter of the curve (per 1,000 steps), at `depth` (1-based)."""
    tail = curve[-max(2, len(curve) // 4):]
    steps = tail[-1]["step"] - tail[0]["step"]
    if len(tail) < 2 or steps <= 0:
        return None
    return 1000 * (tail[-1]["top1_at_depth"][depth - 1] - tail[0]["top1_at_depth"][depth - 1]) / steps


def markdown(curve: list[dict], state: dict, ckpts: list[Path]) -> str:
    depths = min(DEPTHS, len(curve[0]["top1_at_depth"]))
    stages = "; ".join(f"stage {i}: `{c}`" for i, c in enumerate(ckpts, start=1))
    lines = [f"Learning curve of {stages} (batch {state['batch_size']} x {state['seq_len']}, unroll {state['unroll']}), "
             "written by `recipes/smollm2/curves.py`:", "",
             "| stage | step | positions seen | held-out positions | "
             + " | ".join(f"top-1 depth {d}" for d in range(1, depths + 1)) + " |",
             "|---|---|---|---|" + "---|" * depths]
    for point in curve:
        cells = " | ".join(f"{v:.3f}" for v in point["top1_at_depth"][:depths])
        lines.append(f"| {point.get('stage', 1)} | {point['step']:,} | {point['positions_seen']:,} | "
                     f"{point['heldout_positions']:,} | {cells} |")
    gains = [trend(curve, d) for d in range(1, depths + 1)]
    if all(g is not None for g in gains):
        lines += ["", "Gain over the last quarter of the run, per 1,000 steps: "
                  + ", ".join(f"depth {d} {g:+.3f}" for d, g in zip(range(1, depths + 1), gains)) + "."]
    return "\n".join(lines)


def group_markdown(curve: list[dict]) -> str:
    """Held-out top-1 at depth 1 per data folder (e.g. per language) at every point, where training reported
    them (`by_group`, several --data folders); "" otherwise."""
    points = [p for p in curve if p.get("by_group")]
    if not points:
        return ""
    groups = list(points[-1]["by_group"])
    last = points[-1]["by_group"]
    lines = ["Held-out top-1 at draft depth 1 per data folder (its own held-out split, up to half the positions "
             "of the overall figure each):", "",
             "| step | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
    for point in points:
        cells = " | ".join(f"{point['by_group'][g]['top1_at_depth'][0]:.3f}" if g in point["by_group"] else "-"
                           for g in groups)
        lines.append(f"| {point['step']:,} | {cells} |")
    lines += ["", "At the last point, depths 1 / 2 / 3 and held-out positions per folder: "
              + "; ".join(f"{g} {' / '.join(f'{v:.3f}' for v in last[g]['top1_at_depth'][:DEPTHS])} "
                          f"({last[g]['heldout_positions']:,})" for g in groups) + "."]
    return "\n".join(lines)


def plot_groups(curve: list[dict], path: Path) -> None:
    """Depth-1 held-out top-1 per data folder against positions seen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in curve if p.get("by_group")]
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = plt.get_cmap("tab10").colors  # ten hues: past ten groups the line style tells them apart
    for i, group in enumerate(points[-1]["by_group"]):
        mine = [p for p in points if group in p["by_group"]]
        style = i // len(colours) % 3  # which round of the ten hues
        ax.plot([p["positions_seen"] / 1e6 for p in mine], [p["by_group"][group]["top1_at_depth"][0] for p in mine],
                marker="os^"[style], markersize=3, color=colours[i % len(colours)],
                linestyle=("-", "--", ":")[style], label=group)
    ax.set_xlabel("training positions seen (millions)")
    ax.set_ylabel("held-out top-1, depth 1")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(curve: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for depth in range(min(DEPTHS, len(curve[0]["top1_at_depth"]))):
        ax.plot([p["positions_seen"] / 1e6 for p in curve], [p["top1_at_depth"][depth] for p in curve],
                marker="o", label=f"depth {depth + 1}")
    for point, before in zip(curve[1:], curve[:-1]):
        if point.get("stage", 1) != before.get("stage", 1):  # a new stage (e.g. more data) starts here
            ax.axvline(before["positions_seen"] / 1e6, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training positions seen (millions)")
    ax.set_ylabel("held-out top-1 agreement")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, nargs="+", required=True, help="checkpoints, one per stage, in order")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--doc", type=Path, default=HERE / "training.md", help="markdown file for the generated block")
    args = parser.parse_args()
    stages = [load_curve(ckpt) for ckpt in args.ckpt]
    curve, state = chain(stages), stages[-1][1]
    args.out.mkdir(parents=True, exist_ok=True)
    keys = ("step", "batch_size", "seq_len", "unroll", "positions_seen", "lr")
    kept = [{"ckpt": str(c)} | {k: st[k] for k in keys if k in st} for c, (_, st) in zip(args.ckpt, stages)]
    (args.out / "curve.json").write_text(json.dumps({"stages": kept, "curve": curve}, indent=1) + "\n")
    text = markdown(curve, state, args.ckpt)
    groups = group_markdown(curve)
    if groups:
        text += "\n\n" + groups
        plot_groups(curve, args.out / "curve-groups.png")
    (args.out / "curve.md").write_text(text + "\n")
    plot(curve, args.out / "curve.png")
    write_doc_block(args.doc, "learning-curve", text)
    print(text)


if __name__ == "__main__":
    main()

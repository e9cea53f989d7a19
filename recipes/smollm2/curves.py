"""Learning curves of a drafter training run: held-out top-1 at draft depths 1-3 against steps and positions seen.

Reads the `curve` that `hf-dynaspec train --eval-every N` keeps in the checkpoint's trainer_state.json and writes
`curve.json`, `curve.md` and `curve.png` into `--out`, and the table into recipes/smollm2/training.md (a generated
block), so the next person can see whether more data or more steps would pay.

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


def trend(curve: list[dict], depth: int) -> float | None:
    """Held-out top-1 gained over the last quarter of the curve (per 1,000 steps), at `depth` (1-based)."""
    tail = curve[-max(2, len(curve) // 4):]
    steps = tail[-1]["step"] - tail[0]["step"]
    if len(tail) < 2 or steps <= 0:
        return None
    return 1000 * (tail[-1]["top1_at_depth"][depth - 1] - tail[0]["top1_at_depth"][depth - 1]) / steps


def markdown(curve: list[dict], state: dict, ckpt: Path) -> str:
    depths = min(DEPTHS, len(curve[0]["top1_at_depth"]))
    lines = [f"Learning curve of `{ckpt}` (batch {state['batch_size']} x {state['seq_len']}, unroll {state['unroll']}; "
             f"held-out answer positions per point: {curve[-1]['heldout_positions']:,}), written by "
             "`recipes/smollm2/curves.py`:", "",
             "| step | positions seen | " + " | ".join(f"top-1 depth {d}" for d in range(1, depths + 1)) + " |",
             "|---|---|" + "---|" * depths]
    for point in curve:
        cells = " | ".join(f"{v:.3f}" for v in point["top1_at_depth"][:depths])
        lines.append(f"| {point['step']:,} | {point['positions_seen']:,} | {cells} |")
    gains = [trend(curve, d) for d in range(1, depths + 1)]
    if all(g is not None for g in gains):
        lines += ["", "Gain over the last quarter of the run, per 1,000 steps: "
                  + ", ".join(f"depth {d} {g:+.3f}" for d, g in zip(range(1, depths + 1), gains)) + "."]
    return "\n".join(lines)


def plot(curve: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for depth in range(min(DEPTHS, len(curve[0]["top1_at_depth"]))):
        ax.plot([p["positions_seen"] / 1e6 for p in curve], [p["top1_at_depth"][depth] for p in curve],
                marker="o", label=f"depth {depth + 1}")
    ax.set_xlabel("training positions seen (millions)")
    ax.set_ylabel("held-out top-1 agreement")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--doc", type=Path, default=HERE / "training.md", help="markdown file for the generated block")
    args = parser.parse_args()
    curve, state = load_curve(args.ckpt)
    args.out.mkdir(parents=True, exist_ok=True)
    keep = {k: state[k] for k in ("step", "batch_size", "seq_len", "unroll", "positions_seen") if k in state}
    (args.out / "curve.json").write_text(json.dumps({"state": keep, "curve": curve}, indent=1) + "\n")
    text = markdown(curve, state, args.ckpt)
    (args.out / "curve.md").write_text(text + "\n")
    plot(curve, args.out / "curve.png")
    write_doc_block(args.doc, "learning-curve", text)
    print(text)


if __name__ == "__main__":
    main()

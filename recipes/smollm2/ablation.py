"""Compare drafter training runs that differ in one setting (e.g. the feature-regression weight) on the same
held-out conversations: top-1 agreement with the target at draft depths 1-4 and router recall.

Each run is a checkpoint folder. Its held-out evaluation is read from `heldout_eval.json` (written by
`hf-dynaspec train`) when that evaluated the same data, else computed here on the held-out split of `--data`
(the split training used: same fraction and seed). Writes `ablation.json` / `ablation.md` into `--out` and the
table into recipes/smollm2/training.md (generated block "ablation").

    python recipes/smollm2/ablation.py --data runs/smollm2-eagle3/features-a \
        --run "start (3,000 steps)" runs/smollm2-eagle3/ckpt \
        --run "regression 1, CE 0.5, router 0.2" runs/smollm2-eagle3/ablate-reg1 \
        --run "regression 0, CE 1, router 0.2" runs/smollm2-eagle3/ablate-reg0 \
        --out benchmarks/results/cpu-smollm2-eagle3-ablation
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.bench import write_doc_block
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target
from hf_dynaspec.training.arguments import HELDOUT_FRACTION
from hf_dynaspec.training.trainer import (
    HELDOUT_EVAL_NAME,
    STATE_NAME,
    evaluate_drafter,
    load_split,
)

HERE = Path(__file__).resolve().parent
DEPTHS = 4


def evaluate(ckpt: Path, data: list[str], target, heldout) -> dict:
    """The run's held-out evaluation: its own record when it was made on `data`, else computed now."""
    saved = ckpt / HELDOUT_EVAL_NAME
    if saved.is_file():
        record = json.loads(saved.read_text())
        if record.get("settings", {}).get("data") == data and len(record["eval"]["top1_at_depth"]) >= DEPTHS:
            return record["eval"]
    drafter = DynaSpecDrafter.from_pretrained(ckpt).bind(target).eval()
    return evaluate_drafter(drafter, heldout, 256, unroll=DEPTHS)


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"Training ablation on {meta['heldout_positions']:,} held-out answer positions of `{meta['data']}`, "
             f"{meta['machine']}; written by `recipes/smollm2/ablation.py`:", "",
             "| run | steps | " + " | ".join(f"top-1 depth {d}" for d in range(1, DEPTHS + 1))
             + " | router recall k=8 |", "|---|---|" + "---|" * (DEPTHS + 1)]
    for r in rows:
        cells = " | ".join(f"{v:.3f}" for v in r["top1_at_depth"][:DEPTHS])
        lines.append(f"| {r['label']} | {r['steps']} | {cells} | {r['router_recall_k8']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs=2, action="append", metavar=("LABEL", "CKPT"), required=True)
    parser.add_argument("--data", nargs="+", required=True, help="the data folders the runs trained on")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--doc", type=Path, default=HERE / "training.md")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target("smollm2")
    _, heldout, _ = load_split(args.data, HELDOUT_FRACTION, seed=0)  # as `train_drafter` splits
    rows = []
    for label, ckpt in args.run:
        ev = evaluate(Path(ckpt), args.data, target, heldout)
        state = json.loads((Path(ckpt) / STATE_NAME).read_text())
        rows.append({"label": label, "ckpt": ckpt, "steps": state["step"], "top1_at_depth": ev["top1_at_depth"],
                     "router_recall_k8": ev["router_recall"].get(8, ev["router_recall"].get("8")),
                     "positions": ev["positions"]})
    meta = {"data": " + ".join(args.data), "heldout_positions": rows[0]["positions"],
            "machine": machine_description()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1) + "\n")
    text = markdown(rows, meta)
    (args.out / "ablation.md").write_text(text + "\n")
    write_doc_block(args.doc, "ablation", text)
    print(text)


if __name__ == "__main__":
    main()

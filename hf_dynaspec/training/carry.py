"""A training checkpoint packed to be committed, so that a run spanning sessions resumes on a fresh machine.

`train_drafter`'s checkpoints (`trainer.save_checkpoint`) keep three fp32 copies of every parameter: the
weights and AdamW's two moments. A packed copy keeps the weights in fp32 (a resumed run continues from the exact
parameters) and the moments in bfloat16: fp32's exponent range, so the tiny second moments survive, and a
relative error of at most 2^-9 in a moving average that AdamW only divides by (its square root). Unpacked, the
files are used as they are: `torch.optim.Optimizer.load_state_dict` casts the moments back to the parameters'
dtype. The packed folder is itself a checkpoint folder (`load_checkpoint` reads it) and a drafter folder
(`from_pretrained` reads it), which is how it also stands in for the run's init folder on a fresh machine:
the init's weights are replaced by the checkpoint's, and its vocabulary clusters are the checkpoint's own.

    python -m hf_dynaspec.training.carry pack runs/gemma3-ml/ckpt recipes/gemma3/carry
    python -m hf_dynaspec.training.carry unpack recipes/gemma3/carry runs/gemma3-ml/ckpt --init runs/gemma3-ml/init
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .trainer import OPTIMIZER_NAME, STATE_NAME

CARRY_NAME = "carry.json"  # in a packed folder: what was packed, from which step
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW state entries cast on packing ("step" stays as it is)
DRAFTER_FILES = ("config.json", "generation_config.json")  # with model*.safetensors: a drafter folder


def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """The step of the complete checkpoint in `folder` (its state JSON is written last), or None."""
    path = Path(folder) / STATE_NAME
    return int(json.loads(path.read_text())["step"]) if path.is_file() else None


def packed_moments(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The optimizer file's tensors ("<param index>.<entry>") with the AdamW moments cast to `dtype`."""
    return {key: value.to(dtype) if key.rsplit(".", 1)[-1] in MOMENTS else value for key, value in tensors.items()}


def pack(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike, moments_dtype: torch.dtype = torch.bfloat16) -> int:
    """Write the checkpoint of `ckpt_dir` to `out_dir` (replaced whole, atomically), its moments as
    `moments_dtype`. Returns the packed step."""
    src, out = Path(ckpt_dir), Path(out_dir)
    step = checkpoint_step(src)
    if step is None:
        raise FileNotFoundError(f"{src} holds no complete checkpoint ({STATE_NAME}): train first, then pack.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    for file in sorted(src.iterdir()):
        if file.is_file() and file.name != OPTIMIZER_NAME:
            shutil.copy2(file, tmp / file.name)
    save_file(packed_moments(load_file(str(src / OPTIMIZER_NAME)), moments_dtype), str(tmp / OPTIMIZER_NAME))
    (tmp / CARRY_NAME).write_text(json.dumps({"step": step, "moments_dtype": str(moments_dtype).split(".")[-1],
                                              "from": str(src)}, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return step


def unpack(carry_dir: str | os.PathLike, ckpt_dir: str | os.PathLike, init_dir: str | os.PathLike | None = None) -> bool:
    """Copy the packed checkpoint of `carry_dir` into `ckpt_dir` unless that already holds one at the same step
    or later; with `init_dir`, also write its drafter files there when it has none (a fresh machine: the init's
    clusters must be the checkpoint's). Returns whether the checkpoint was copied."""
    carry, ckpt = Path(carry_dir), Path(ckpt_dir)
    carried = checkpoint_step(carry)
    if carried is None:
        raise FileNotFoundError(f"{carry} holds no packed checkpoint: pack one with `pack CKPT {carry}`.")
    if init_dir is not None and not (Path(init_dir) / "config.json").is_file():
        _copy(carry, Path(init_dir), lambda f: f.name in DRAFTER_FILES or f.name.startswith("model"))
    here = checkpoint_step(ckpt)
    if here is not None and here >= carried:
        return False
    _copy(carry, ckpt, lambda f: f.name != CARRY_NAME)
    return True


def _copy(src: Path, dst: Path, keep) -> None:
    """The files of `src` that `keep` takes, into `dst`, the state JSON last (it marks a complete checkpoint)."""
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted((f for f in src.iterdir() if f.is_file() and keep(f)), key=lambda f: f.name == STATE_NAME)
    for file in files:
        shutil.copy2(file, dst / file.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="a checkpoint folder -> a compact folder to commit")
    p.add_argument("ckpt")
    p.add_argument("out")
    u = sub.add_parser("unpack", help="a packed folder -> the run's checkpoint folder (when it is newer)")
    u.add_argument("carry")
    u.add_argument("ckpt")
    u.add_argument("--init", default=None, help="the run's init folder, written from the packed drafter if missing")
    args = parser.parse_args(argv)
    if args.command == "pack":
        print(f"packed step {pack(args.ckpt, args.out)} into {args.out}")
    elif unpack(args.carry, args.ckpt, args.init):
        print(f"unpacked step {checkpoint_step(args.ckpt)} into {args.ckpt}")
    else:
        print(f"{args.ckpt} is at step {checkpoint_step(args.ckpt)}, not behind {args.carry}: left as it is")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Step 4 (either venv): the trained draft as the repository keeps it, drafters/smollm2-speculators-eagle3/.

WORK/trained/ is what speculators' checkpointer writes (train.py `save_trained`): config.json and model.safetensors
with the draft layer, fc, norms, its own lm_head over the draft vocabulary, d2t / t2d, and a copy of the
verifier's input embeddings (`embed_tokens.weight`, 49152 x 576: frozen in training, `embed_requires_grad` false).
That copy is the only tensor left out here, after checking that it equals the verifier's embeddings in the saved
dtype: vLLM and hf-dynaspec both use the target's own embeddings when a checkpoint carries none. Everything else
is written as speculators wrote it; in config.json only `speculators_config.verifier.name_or_path` (the local
folder training read) becomes the Hub id of the same model.

    .venv/bin/python recipes/speculators/ship.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import DRAFTER_DIR, SMOLLM2_HUB_ID, VERIFIER_DIR, WORK_DIR  # recipes/speculators/common.py
from safetensors.torch import load_file, save_file

FROZEN = "embed_tokens.weight"


def check_frozen_copy(tensors: dict[str, torch.Tensor], verifier: Path) -> None:
    """The checkpoint's embeddings are the verifier's, cast to the checkpoint's dtype (else they were trained and
    must stay)."""
    own = tensors[FROZEN]
    theirs = load_file(str(verifier / "model.safetensors"))["model.embed_tokens.weight"].to(own.dtype)
    if not torch.equal(own, theirs):
        raise SystemExit(f"{FROZEN} differs from {verifier}'s embeddings: the draft trained them, keep them.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR, help="the recipe's work folder (train.py's)")
    parser.add_argument("--verifier", type=Path, default=VERIFIER_DIR, help="plain HF folder (target_folder.py)")
    parser.add_argument("--out", type=Path, default=DRAFTER_DIR, help="default: %(default)s")
    args = parser.parse_args()
    trained = args.work_dir / "trained"
    tensors = load_file(str(trained / "model.safetensors"))
    if FROZEN in tensors:
        check_frozen_copy(tensors, args.verifier)
        del tensors[FROZEN]
    config = json.loads((trained / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = SMOLLM2_HUB_ID
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / "model.safetensors"), {"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"wrote {args.out}: {len(tensors)} tensors, {size / 2**20:.1f} MiB ({', '.join(sorted(tensors))})")


if __name__ == "__main__":
    main()

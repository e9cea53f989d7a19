"""Step 2 (speculators venv): build the untrained EAGLE-3 draft with speculators' own training CLI.

1. Token frequencies of the corpus with speculators' own `save_token_frequency_distribution`
   (speculators/train/vocab_mapping.py:20; it counts the tokens under loss_mask = 1, the answers) into
   WORK/data/token_freq.pt, the file its trainer looks for (train/cli.py:350 `data_path / "token_freq.pt"`).
2. `speculators train --dry-run` itself, in this process: `speculators.train.cli.main(TrainConfig.resolve(argv))`,
   exactly what the `speculators train` command runs (speculators/cli/train.py:22). With `--draft-vocab-size N`
   and that token_freq.pt it builds d2t / t2d with `build_vocab_mappings_from_distribution` (train/cli.py:350-389,
   vocab_mapping.py:74) and caches them as WORK/data/{d2t,t2d}-N.npy; it builds the draft layer config from the
   verifier with `create_transformer_layer_config` (train/cli.py:113) and the model with
   `Eagle3DraftModel.from_training_args` (models/eagle3/core.py:368), which loads the verifier's embeddings, the
   lm_head rows of the draft vocabulary and its final norm (model.py:127-210); then the dry run saves it with
   `save_pretrained` and stops before training (train/cli.py:680-696).
   Every architecture flag is left at 0.9.0's CLI default (train/config/schema.py): speculator_type eagle3,
   draft_arch llama, num_layers 1, norm_before_residual true, norm_before_fc true and norm_output true
   (`_resolve_derived_defaults`, eagle3), fc_norm false, sliding_window 2048 on every layer, draft_hidden_act
   silu, target_layer_ids (2, L // 2, L - 3), embed_requires_grad false, seed 42. Only these are passed:
   the verifier, the data / save / log folders, --draft-vocab-size (default 8192 here, to keep the file small),
   and --hidden-states-dtype float32 (the dry run saves in that dtype, train/cli.py:682; float32 keeps the
   initial weights exact for training on a CPU; it changes no architecture field). Extra flags after `--` go to
   `speculators train` as they are.

    .venv-speculators/bin/python recipes/speculators/build.py
    .venv-speculators/bin/python recipes/speculators/build.py --verifier /tmp/spec-toy/verifier \\
        --corpus /tmp/spec-toy/corpus --work-dir /tmp/spec-toy/work --draft-vocab-size 64

Writes WORK/data/{token_freq.pt, d2t-N.npy, t2d-N.npy} and WORK/init/ (config.json, model.safetensors, run.yaml,
train_command.txt): the draft as speculators initialises it, the starting point of train.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

import torch
from common import add_folder_arguments, read_corpus  # recipes/speculators/common.py
from safetensors import safe_open


def count_tokens(corpus: Path, data_dir: Path, limit: int | None, force: bool) -> Path:
    """WORK/data/token_freq.pt with speculators' own counter (it keeps an existing file: --force recounts)."""
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    path = data_dir / "token_freq.pt"
    if force:
        for stale in [path, *data_dir.glob("d2t-*.npy"), *data_dir.glob("t2d-*.npy")]:
            stale.unlink(missing_ok=True)
    if not path.exists():
        rows = read_corpus(corpus, limit)
        print(f"{len(rows)} conversations, {sum(int(r['loss_mask'].sum()) for r in rows)} answer tokens")
        save_token_frequency_distribution(rows, path)
    counts = torch.load(path, weights_only=True)
    print(f"token_freq.pt: {len(counts)} distinct answer tokens")
    return path


def speculators_argv(args: argparse.Namespace, data_dir: Path, init_dir: Path) -> list[str]:
    return ["--speculator-type", "eagle3", "--verifier-name-or-path", str(args.verifier),
            "--data-path", str(data_dir), "--draft-vocab-size", str(args.draft_vocab_size),
            "--save-path", str(init_dir), "--log-dir", str(args.work_dir / "logs"),
            "--hidden-states-dtype", "float32", "--dry-run", *args.extra]


def describe(init_dir: Path) -> None:
    config = json.loads((init_dir / "config.json").read_text())
    keys = ("speculators_model_type", "draft_vocab_size", "norm_before_residual", "norm_before_fc", "fc_norm",
            "norm_output", "eagle_aux_hidden_state_layer_ids", "embed_requires_grad")
    print("config:", {k: config.get(k, "(absent)") for k in keys})
    layer = config.get("transformer_layer_config", {})
    print("layer:", {k: layer.get(k, "(absent)") for k in ("model_type", "hidden_size", "intermediate_size",
                                                           "num_attention_heads", "num_key_value_heads",
                                                           "layer_types", "sliding_window", "vocab_size")})
    with safe_open(str(init_dir / "model.safetensors"), framework="pt") as handle:
        print("tensors:", {k: (tuple(handle.get_slice(k).get_shape()), handle.get_slice(k).get_dtype())
                           for k in handle.keys()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_folder_arguments(parser)
    parser.add_argument("--draft-vocab-size", type=int, default=8192, help="draft vocabulary (default 8192)")
    parser.add_argument("--max-conversations", type=int, default=None, help="count only the first N conversations")
    parser.add_argument("--force", action="store_true", help="recount tokens and rebuild WORK/init")
    parser.add_argument("extra", nargs="*", help="after `--`: more `speculators train` flags, passed as they are")
    args = parser.parse_args()
    if not (args.verifier / "config.json").is_file():
        raise SystemExit(f"{args.verifier} is not a model folder: run target_folder.py (project venv) first.")
    data_dir, init_dir = args.work_dir / "data", args.work_dir / "init"
    data_dir.mkdir(parents=True, exist_ok=True)
    count_tokens(args.corpus, data_dir, args.max_conversations, args.force)
    if (init_dir / "model.safetensors").is_file() and not args.force:
        print(f"{init_dir} is already built (--force to rebuild it)")
    else:
        shutil.rmtree(init_dir, ignore_errors=True)
        from speculators.train.cli import main as speculators_train
        from speculators.train.config import TrainConfig

        argv = speculators_argv(args, data_dir, init_dir)
        print("speculators train " + shlex.join(argv), flush=True)
        speculators_train(TrainConfig.resolve(argv))
    describe(init_dir)


if __name__ == "__main__":
    sys.exit(main())

"""Shared by the scripts of recipes/speculators/ (imported from beside them; no third-party imports but numpy
and torch, so it loads in both the project's venv and the speculators venv).

- The default folders: the verifier as a plain HF folder, and the work folder of the recipe (token counts,
  vocabulary maps, speculators' initial checkpoint, training state, the trained checkpoint).
- `read_corpus`: the project's corpus of token ids (data/corpus/smollm2) as speculators' pre-tokenized rows
  {"input_ids", "loss_mask"}. The format is hf_dynaspec/training/corpus.py's (`_write_shard` / `load_corpus`):
  index.json {"shards": [{"file": ...}]} and shards answers_NNNNN.npz = {input_ids (N,) uint16/int32, offsets
  (n + 1,), prompt_lengths (n,)}. It is read here directly rather than through hf_dynaspec because the
  speculators venv (transformers 5.19) is not the project's. The loss mask is 1 on the answer (the target's own
  tokens) and 0 on the chat-templated prompt, as speculators' preprocessing marks assistant turns
  (speculators/data_generation/preprocessing.py:316 `[0] * boundary + [1] * (len(full_ids) - boundary)`).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "data" / "corpus" / "smollm2"
DRAFTER_DIR = ROOT / "drafters" / "smollm2-speculators-eagle3"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """hf_dynaspec.targets.cache_dir(): $HF_DYNASPEC_CACHE, else ~/.cache/hf-dynaspec."""
    return Path(os.environ.get("HF_DYNASPEC_CACHE", Path.home() / ".cache" / "hf-dynaspec"))


VERIFIER_DIR = cache_dir() / "smollm2-135m-instruct-hf"
WORK_DIR = cache_dir() / "speculators-eagle3-smollm2"


def add_folder_arguments(parser: argparse.ArgumentParser) -> None:
    """--verifier, --corpus and --work-dir, as every step of the recipe names them."""
    parser.add_argument("--verifier", type=Path, default=VERIFIER_DIR, help="plain HF folder (target_folder.py)")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="corpus of token ids (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR, help="the recipe's work folder")


def read_corpus(folder: str | os.PathLike, limit: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The conversations of a corpus folder, in shard order, as {"input_ids": (L,) long, "loss_mask": (L,)
    long}; at most `limit` of them."""
    folder = Path(folder)
    index_file = folder / "index.json"
    if not index_file.is_file():
        raise FileNotFoundError(f"{index_file} is missing: {folder} is not a corpus folder (hf_dynaspec/training/"
                                "corpus.py write_answers).")
    rows: list[dict[str, torch.Tensor]] = []
    for shard in json.loads(index_file.read_text())["shards"]:
        with np.load(folder / shard["file"], allow_pickle=False) as data:
            ids = torch.from_numpy(data["input_ids"].astype(np.int64))
            offsets, prompt_lengths = data["offsets"].tolist(), data["prompt_lengths"].tolist()
        for lo, hi, prompt in zip(offsets[:-1], offsets[1:], prompt_lengths):
            mask = torch.zeros(hi - lo, dtype=torch.long)
            mask[prompt:] = 1
            rows.append({"input_ids": ids[lo:hi], "loss_mask": mask})
            if limit is not None and len(rows) >= limit:
                return rows
    if not rows:
        raise ValueError(f"{folder} holds no conversations.")
    return rows

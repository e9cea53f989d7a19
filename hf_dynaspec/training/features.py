"""The target's features of a token-id corpus (`corpus.py`), recomputed in batched forward passes.

For each conversation of L tokens we keep, for its first L - 1 positions, the target's final normed hidden
state (`hidden`, the loss's target: the target's distribution is head(hidden)) and the hidden states of the
layers an EAGLE-3 drafter reads (`aux`, k layers concatenated). They are large (2 bytes x (k + 1) x d per
token) and rebuilt from the committed ids on a fresh machine, so they live outside git, as float16 `.npy`
files (bfloat16 bits for targets whose states exceed float16, such as Gemma) read through memory maps
(the training process touches only the windows it samples):

    index.json                    {"format": "features", "layer_ids": [...], "hidden_size": d, "dtype", "shards"}
    features_00000.npz            input_ids (N,), offsets (n + 1,), prompt_lengths (n,)
    features_00000.hidden.npy     (N - n, d) float16 (or bfloat16 bits as int16: index "dtype")
    features_00000.aux.npy        (N - n, k * d) likewise

    python -c "
    import torch; torch.set_num_threads(1); from hf_dynaspec.targets import load_target
    from hf_dynaspec.training.corpus import write_answers; from hf_dynaspec.training.features import write_features
    from hf_dynaspec.training.data import load_dataset
    t, tok = load_target('tiny'); write_answers(t, tok, [{'prompt': 'hi'}], '/tmp/corpus', 8, 2)
    write_features(t, '/tmp/corpus', '/tmp/feats', [1, 2]); print(load_dataset('/tmp/feats')[0].aux.shape)"
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..target_states import select_hidden_states
from .corpus import CorpusConversation, feature_rows, load_corpus, stored_features

FORMAT = "features"
INDEX_NAME = "index.json"


@torch.no_grad()
def padded_states(
    target, convs: list[CorpusConversation], layer_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor, list[slice]]:
    """One right-padded batch through the target: the final normed hidden states (B, W, d), the layers
    `layer_ids` concatenated (B, W, k * d), and each conversation's featured positions (its first L - 1).
    Causal attention: padding on the right changes no real position."""
    device = target.get_output_embeddings().weight.device
    width = max(c.input_ids.numel() for c in convs)
    input_ids = torch.zeros(len(convs), width, dtype=torch.long)  # (B, W)
    for row, conv in enumerate(convs):
        input_ids[row, : conv.input_ids.numel()] = conv.input_ids
    out = target.model(input_ids=input_ids.to(device), output_hidden_states=True, use_cache=False)
    aux = select_hidden_states(out.hidden_states, layer_ids)  # (B, W, k * d)
    return out.hidden_states[-1], aux, [slice(0, c.input_ids.numel() - 1) for c in convs]


def forward_features(
    target, convs: list[CorpusConversation], layer_ids: list[int], dtype: str = "float16"
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per conversation of one batch (`padded_states`): (hidden (L - 1, d), aux (L - 1, k * d)) stored as `dtype`."""
    return feature_rows(*padded_states(target, convs, layer_ids), dtype)


def batches_by_tokens(convs: list[CorpusConversation], max_tokens: int) -> list[list[int]]:
    """Indices of conversations grouped so that (count x longest) <= max_tokens, in length order."""
    order = sorted(range(len(convs)), key=lambda i: convs[i].input_ids.numel())
    groups, current = [], []
    for i in order:
        longest = convs[i].input_ids.numel()  # sorted: the newest is the longest
        if current and (len(current) + 1) * longest > max_tokens:
            groups.append(current)
            current = []
        current.append(i)
    return groups + ([current] if current else [])


def write_features(
    target, corpus_dir: str | os.PathLike, out_dir: str | os.PathLike, layer_ids: list[int],
    max_tokens: int = 8192, per_shard: int = 1024, progress: bool = True, dtype: str = "float16",
    sources: str | None = None,
) -> dict[str, Any]:
    """Features of every conversation of `corpus_dir` under `out_dir`, stored as `dtype` ("float16", or
    "bfloat16" for targets whose hidden states exceed float16), shard by shard (resumable: a rerun continues
    after the last complete shard). `sources`: a regular expression; only conversations whose source it matches
    whole are kept (e.g. one language of a multilingual corpus per folder, so training reports each on its own).
    Returns the index."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = read_features_index(out) or {
        "format": FORMAT, "corpus": str(corpus_dir), "layer_ids": list(layer_ids),
        "hidden_size": int(target.config.get_text_config().hidden_size), "dtype": dtype, "shards": [],
        "sources": sources,
    }
    if index["layer_ids"] != list(layer_ids):
        raise ValueError(f"{out} holds features of layers {index['layer_ids']}, not {list(layer_ids)}: use another folder.")
    if stored_dtype(index) != dtype:
        raise ValueError(f"{out} holds {stored_dtype(index)} features, not {dtype}: use another folder.")
    if index.get("sources") != sources:
        raise ValueError(f"{out} holds the conversations of sources {index.get('sources')!r}, not {sources!r}: use "
                         "another folder.")
    convs = load_corpus(corpus_dir)
    if sources is not None:
        pattern = re.compile(sources)
        convs = [c for c in convs if pattern.fullmatch(c.source)]
        if not convs:
            raise ValueError(f"No conversation of {corpus_dir} has a source matching {sources!r}.")
    done = sum(s["num_conversations"] for s in index["shards"])
    bar = tqdm(total=len(convs), initial=done, desc="target features", unit="conv", disable=not progress)
    for lo in range(done, len(convs), per_shard):
        part, t0 = convs[lo : lo + per_shard], time.perf_counter()
        rows: list[Any] = [None] * len(part)
        for group in batches_by_tokens(part, max_tokens):
            for i, pair in zip(group, forward_features(target, [part[i] for i in group], layer_ids, dtype)):
                rows[i] = pair
            bar.update(len(group))
        _write_shard(out, index, part, rows, time.perf_counter() - t0)
    bar.close()
    return index


class CapturedFeatures:
    """`corpus.write_answers(on_shard=...)`: writes the features the target produced while answering, shard for
    shard beside the corpus (same conversations, same order), so no second pass is needed. A shard rewritten
    after an interruption replaces its earlier copy."""

    def __init__(self, out_dir: str | os.PathLike, corpus_dir: str | os.PathLike, layer_ids: list[int],
                 hidden_size: int) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.index = read_features_index(self.out) or {
            "format": FORMAT, "corpus": str(corpus_dir), "layer_ids": list(layer_ids), "hidden_size": hidden_size,
            "shards": [], "captured": True,
        }
        if self.index["layer_ids"] != list(layer_ids):
            raise ValueError(f"{self.out} holds features of layers {self.index['layer_ids']}, not {list(layer_ids)}.")

    def __call__(self, shard: int, convs: list[CorpusConversation], rows: list, seconds: float) -> None:
        if len(rows) != len(convs):
            raise ValueError("write_answers must capture features (capture_layers=...) to write them.")
        if len(self.index["shards"]) < shard:
            raise ValueError(
                f"{self.out} has features for {len(self.index['shards'])} corpus shards, the corpus has {shard}: "
                "recompute the missing ones first (`hf-dynaspec features`, which resumes), then continue."
            )
        del self.index["shards"][shard:]  # a shard redone after an interruption
        _write_shard(self.out, self.index, convs, rows, seconds)


def _write_shard(out: Path, index: dict[str, Any], convs: list[CorpusConversation], rows: list, seconds: float) -> None:
    name = f"features_{len(index['shards']):05d}"
    lengths = np.array([c.input_ids.numel() for c in convs], dtype=np.int64)
    np.savez(out / f"{name}.npz", input_ids=torch.cat([c.input_ids for c in convs]).numpy().astype(np.int32),
             offsets=np.concatenate([[0], lengths.cumsum()]),
             prompt_lengths=np.array([c.prompt_length for c in convs], dtype=np.int64))
    np.save(out / f"{name}.hidden.npy", np.concatenate([h for h, _ in rows]))
    np.save(out / f"{name}.aux.npy", np.concatenate([a for _, a in rows]))
    tokens = int(lengths.sum())
    index["shards"].append({"name": name, "num_conversations": len(convs), "num_tokens": tokens,
                            "seconds": round(seconds, 1), "tokens_per_s": round(tokens / max(seconds, 1e-9), 1)})
    tmp = out / (INDEX_NAME + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / INDEX_NAME)


def read_features_index(out: Path) -> dict[str, Any] | None:
    path = out / INDEX_NAME
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    return index if index.get("format") == FORMAT else None


def stored_dtype(index: dict[str, Any]) -> str:
    """The folder's storage dtype (folders written before bfloat16 storage hold float16 and do not say so)."""
    return index.get("dtype", "float16")


def load_feature_shards(out: Path, index: dict[str, Any]) -> list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]]:
    """Per conversation (input_ids (L,), loss_mask (L,) bool, prompt length, hidden (L - 1, d), aux
    (L - 1, k * d)); the feature arrays are copy-on-write memory maps (read lazily, never written back)."""
    result, dtype = [], stored_dtype(index)
    for shard in index["shards"]:
        with np.load(out / f"{shard['name']}.npz", allow_pickle=False) as data:
            ids = torch.from_numpy(data["input_ids"].astype(np.int64))
            offsets, prompt_lengths = data["offsets"].tolist(), data["prompt_lengths"].tolist()
        hidden = stored_features(np.load(out / f"{shard['name']}.hidden.npy", mmap_mode="c"), dtype)
        aux = stored_features(np.load(out / f"{shard['name']}.aux.npy", mmap_mode="c"), dtype)
        for c, (lo, hi, p) in enumerate(zip(offsets[:-1], offsets[1:], prompt_lengths)):
            mask = torch.zeros(hi - lo, dtype=torch.bool)
            mask[p:] = True
            result.append((ids[lo:hi], mask, p, hidden[lo - c : hi - c - 1], aux[lo - c : hi - c - 1]))
    return result

"""Self-distillation data for the drafter: the target answers prompts greedily, and we keep its features.

For every conversation we store the token ids of prompt + answer (L tokens), a loss mask (True on answer
tokens) and the target's post-final-norm last hidden state (`hidden_states[-1]`) of the first L - 1 tokens
(the last generated token is never fed back to the target, so it has no hidden state). The features are
captured during generation (a forward hook on the final norm, or `output_hidden_states=True`): no second
feature pass is run.

On disk: `shard_00000.safetensors`, ... each holding flat tensors
    input_ids (N,) int32, loss_mask (N,) uint8, hidden (N - n, d) fp16/bf16, offsets (n + 1,) int64
for n conversations of N tokens in all (conversation c's tokens are input_ids[offsets[c]:offsets[c+1]] and
its hidden states hidden[offsets[c] - c : offsets[c+1] - c - 1]), plus `index.json` (shards, hashes of the
prompts already done: a rerun skips them).

    python -c "
    import torch; torch.set_num_threads(1); from hf_dynaspec.targets import load_target
    from hf_dynaspec.training.data import generate_dataset, load_dataset
    t, tok = load_target('tiny'); generate_dataset(t, tok, ['hi', 'hello'], '/tmp/ds', max_new_tokens=8, batch_size=2)
    print([c.input_ids.shape for c in load_dataset('/tmp/ds')])"
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..targets import encode_prompt
from .corpus import eos_token_ids, left_pad, pad_token_id, prompt_key, read_versioned_json, trim_at_eos
from .features import load_feature_shards, read_features_index

INDEX_NAME = "index.json"
FORMAT_VERSION = 1
PROMPT_FIELDS = ("turns", "prompt", "question", "instruction")


@dataclass
class Conversation:
    """One self-distilled conversation: input_ids (L,), loss_mask (L,) bool, hidden (L - 1, d) the target's final
    normed states; aux (L - 1, k * d) the target layers an EAGLE-3 drafter reads (None in folders written by
    `generate_dataset`, which keep the final state only: see `features.py`). Both None: token ids only, the states
    computed when a window is drawn (`online.py`); filled, they may hold only the first states a window needs."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    hidden: torch.Tensor | None
    aux: torch.Tensor | None = None
    layer_ids: tuple[int, ...] = (-1,)

    @property
    def num_states(self) -> int:
        """Positions with a target state: the stored ones, else L - 1 (the last token is never fed back)."""
        return self.input_ids.numel() - 1 if self.hidden is None else self.hidden.shape[0]

    @property
    def features(self) -> torch.Tensor:
        """What the drafter reads at the first draft step (L - 1, k * d): aux when stored, else hidden."""
        return self.hidden if self.aux is None else self.aux

    @property
    def prompt_length(self) -> int:
        answer = self.loss_mask.nonzero()
        return int(answer[0]) if answer.numel() else int(self.loss_mask.numel())


# ----------------------------------------------------------------------------------------------- prompts
def load_prompts(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Prompts from JSON / JSONL files: field `turns` (first turn), `prompt`, `question` or `instruction`
    (+ `input`). Records with none of these are skipped. Spec-Bench is the evaluation set: refused."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    prompts: list[str] = []
    for path in paths:
        _refuse_eval_set(path)
        prompts.extend(p for p in (prompt_of(r) for r in _read_records(Path(path))) if p)
    return prompts


def _refuse_eval_set(path: str | os.PathLike) -> None:
    name = Path(path).as_posix().lower().replace("-", "_")
    held_out = ("spec_bench", "code_slice", "tuning_prompts")
    if any(part in name for part in held_out) or ("gsm8k" in name and "test" in Path(name).name):
        raise ValueError(
            f"{path} looks like an evaluation set (Spec-Bench, GSM8K test, the code slice, the tree-tuning prompts): "
            "training on it would contaminate "
            "the measurements. Use other prompt sets (e.g. ShareGPT, UltraChat, GSM8K train, code)."
        )


def _read_records(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("data", data.get("rows", [data]))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records (or JSONL), got {type(data).__name__}.")
    return data


def prompt_of(record: Any) -> str | None:
    """The prompt text of one record, or None."""
    if isinstance(record, str):
        return record.strip() or None
    if not isinstance(record, dict):
        return None
    turns = record.get("turns")
    if isinstance(turns, list) and turns:
        first = turns[0]
        return (first.get("content") if isinstance(first, dict) else str(first)) or None
    for field in ("prompt", "question"):
        if isinstance(record.get(field), str) and record[field].strip():
            return record[field]
    instruction = record.get("instruction")
    if isinstance(instruction, str) and instruction.strip():
        extra = record.get("input")
        return f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
    return None


# ----------------------------------------------------------------------------------------------- generation
def generate_dataset(
    target,
    tokenizer,
    prompts: Sequence[str],
    out_dir: str | os.PathLike,
    max_new_tokens: int,
    batch_size: int,
    chat_template: bool = True,
    prompts_per_shard: int = 256,
    hidden_dtype: torch.dtype = torch.float16,
    max_prompt_tokens: int = 1024,
    capture: str = "hook",
    progress: bool = True,
) -> dict[str, Any]:
    """Answer `prompts` with `target` (batched greedy, left padding) and write shards under `out_dir`.

    Resumable: prompts whose hash is in `index.json` are skipped. Prompts are sorted by length so batches
    carry little padding. `capture="hook"` keeps only the final norm's output per step (little memory);
    `"outputs"` uses `output_hidden_states=True` (every layer is kept until the batch ends). Returns the index.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = _read_index(out) or _new_index(target, hidden_dtype)
    done = set(index["done"])
    todo: dict[str, list[int]] = {}
    for prompt in prompts:
        key = prompt_key(prompt)
        if key not in done and key not in todo:
            todo[key] = encode_prompt(tokenizer, prompt, chat_template)[0].tolist()[-max_prompt_tokens:]
    order = sorted(todo, key=lambda k: len(todo[k]))
    pad_id = pad_token_id(tokenizer, target)
    eos_ids = eos_token_ids(target)
    pending: list[tuple[str, Conversation]] = []
    bar = tqdm(total=len(order), desc="self-distillation", unit="prompt", disable=not progress)
    for start in range(0, len(order), batch_size):
        keys = order[start : start + batch_size]
        convs = generate_batch(target, [todo[k] for k in keys], max_new_tokens, pad_id, eos_ids, capture)
        for key, conv in zip(keys, convs):
            pending.append((key, Conversation(conv.input_ids, conv.loss_mask, conv.hidden.to(hidden_dtype))))
        bar.update(len(keys))
        bar.set_postfix(tokens=sum(int(c.input_ids.numel()) for _, c in pending))
        if len(pending) >= prompts_per_shard:
            _write_shard(out, index, pending)
            pending = []
    if pending:
        _write_shard(out, index, pending)
    bar.close()
    return index


@torch.no_grad()
def generate_batch(
    target,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    pad_id: int,
    eos_ids: set[int],
    capture: str = "hook",
) -> list[Conversation]:
    """Greedy answers of one left-padded batch, with the target's last hidden state of every fed token."""
    device = target.get_output_embeddings().weight.device
    input_ids, attention_mask = left_pad(prompt_ids, pad_id)  # (B, P) each
    width = input_ids.shape[1]
    kwargs = dict(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), max_new_tokens=max_new_tokens,
        min_new_tokens=1, do_sample=False, pad_token_id=pad_id, return_dict_in_generate=True,
    )
    steps: list[torch.Tensor] = []  # per step (B, T_step, d): the prefill, then one token each
    if capture == "hook":
        handle = _final_norm(target).register_forward_hook(lambda _m, _i, o: steps.append(o.detach()))
        try:
            out = target.generate(**kwargs)
        finally:
            handle.remove()
    elif capture == "outputs":
        out = target.generate(**kwargs, output_hidden_states=True)
        steps = [layers[-1] for layers in out.hidden_states]
    else:
        raise ValueError(f"capture must be 'hook' or 'outputs', not {capture!r}.")
    hidden = torch.cat(steps, dim=1).cpu()  # (B, P + S - 1, d)
    answers = out.sequences[:, width:].cpu()  # (B, S)
    return [
        _conversation(ids, answers[row], hidden[row, width - len(ids):], eos_ids)
        for row, ids in enumerate(prompt_ids)
    ]


def _conversation(prompt: list[int], answer: torch.Tensor, hidden: torch.Tensor, eos_ids: set[int]) -> Conversation:
    """Trim the answer after its first EOS; hidden: (len(prompt) + S - 1, d) -> (L - 1, d)."""
    input_ids = torch.cat([torch.tensor(prompt, dtype=torch.long), trim_at_eos(answer, eos_ids)])  # (L,)
    loss_mask = torch.zeros(input_ids.numel(), dtype=torch.bool)
    loss_mask[len(prompt):] = True
    return Conversation(input_ids, loss_mask, hidden[: input_ids.numel() - 1].clone())


def _final_norm(target) -> torch.nn.Module:
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise ValueError(
            f"{type(target).__name__} has no `model.norm` to hook: use capture='outputs' "
            "(output_hidden_states=True, more memory)."
        )
    return norm


# ----------------------------------------------------------------------------------------------- shards
def _new_index(target, hidden_dtype: torch.dtype) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "target": str(getattr(target.config, "_name_or_path", "") or target.config.model_type),
        "hidden_size": int(target.config.get_text_config().hidden_size),
        "hidden_dtype": str(hidden_dtype).removeprefix("torch."),
        "shards": [],
        "done": [],
    }


def _read_index(out: Path) -> dict[str, Any] | None:
    return read_versioned_json(out / INDEX_NAME, "format_version", FORMAT_VERSION)


def _write_shard(out: Path, index: dict[str, Any], items: list[tuple[str, Conversation]]) -> None:
    """Write one shard, then the index (atomically): an interrupted run loses at most this shard."""
    convs = [c for _, c in items]
    lengths = torch.tensor([c.input_ids.numel() for c in convs], dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])  # (n + 1,)
    tensors = {
        "input_ids": torch.cat([c.input_ids for c in convs]).to(torch.int32),  # (N,)
        "loss_mask": torch.cat([c.loss_mask for c in convs]).to(torch.uint8),  # (N,)
        "hidden": torch.cat([c.hidden for c in convs]).contiguous(),  # (N - n, d)
        "offsets": offsets,
    }
    name = f"shard_{len(index['shards']):05d}.safetensors"
    save_file(tensors, str(out / name))
    index["shards"].append({"file": name, "num_conversations": len(convs), "num_tokens": int(offsets[-1])})
    index["done"].extend(k for k, _ in items)
    tmp = out / (INDEX_NAME + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / INDEX_NAME)


def load_dataset(data_dir: str | os.PathLike) -> list[Conversation]:
    """Every conversation of a dataset written by `generate_dataset` (hidden states keep their dtype) or by
    `features.write_features` (memory-mapped float16 features with their layer ids)."""
    out = Path(data_dir)
    feature_index = read_features_index(out)
    if feature_index is not None:
        layers = tuple(feature_index["layer_ids"])
        return [Conversation(ids, mask, hidden, aux, layers)
                for ids, mask, _, hidden, aux in load_feature_shards(out, feature_index)]
    index = _read_index(out)
    if index is None:
        raise FileNotFoundError(f"{out / INDEX_NAME} is missing: make the data with `generate_dataset` first.")
    convs: list[Conversation] = []
    for shard in index["shards"]:
        tensors = load_file(str(out / shard["file"]))
        offsets = tensors["offsets"].tolist()
        for c, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
            convs.append(Conversation(
                tensors["input_ids"][lo:hi].long(),
                tensors["loss_mask"][lo:hi].bool(),
                tensors["hidden"][lo - c : hi - c - 1],
            ))
    return convs


def as_folders(data_dirs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str | os.PathLike]:
    """One dataset folder or several, as a list."""
    return [data_dirs] if isinstance(data_dirs, (str, os.PathLike)) else list(data_dirs)


def frequent_tokens(
    data_dirs: str | os.PathLike | Sequence[str | os.PathLike], size: int, vocab_size: int
) -> torch.Tensor:
    """The `size` most frequent answer tokens of one or several datasets (the FR-Spec / VocabTrim static
    shortlist), counted on the target's own answers, most frequent first (ties: lower token id first)."""
    return most_frequent([c for d in as_folders(data_dirs) for c in load_dataset(d)], size, vocab_size)


def most_frequent(convs: Iterable[Conversation], size: int, vocab_size: int) -> torch.Tensor:
    """(size,) the most frequent answer tokens of `convs`, most frequent first (ties: lower token id first)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)  # (V,)
    for conv in convs:
        counts += torch.bincount(conv.input_ids[conv.loss_mask], minlength=vocab_size)[:vocab_size]
    order = torch.argsort(counts, descending=True, stable=True)  # (V,)
    return order[:size]

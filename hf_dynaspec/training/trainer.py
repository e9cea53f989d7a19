"""Training loop for the DynaSpec drafter on self-distilled data (see `data.py`): batches of windows, the
losses of each (`losses.py`), AdamW, checkpoints, and the held-out evaluation and learning curve.

Checkpoints in `ckpt_dir`: the drafter (`save_pretrained`, safetensors), the AdamW moments
(`optimizer.safetensors`) and `trainer_state.json` (step, losses, hyper-parameters); no pickle anywhere.

    python -c "
    import torch; torch.set_num_threads(1); from hf_dynaspec import DynaSpecDrafter; from hf_dynaspec.targets import load_target
    from hf_dynaspec.training import TrainingArguments, generate_dataset, train_drafter
    t, tok = load_target('tiny'); generate_dataset(t, tok, ['hi', 'hello there'], '/tmp/ds', max_new_tokens=8, batch_size=2)
    d = DynaSpecDrafter.from_target(t, num_clusters=8)
    args = TrainingArguments(steps=10, lr=1e-3, batch_size=2, seq_len=16)
    print(train_drafter(d, t, '/tmp/ds', '/tmp/ck', args)['eval'])"
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..clustering import cluster_vocabulary
from .arguments import TrainingArguments
from .data import Conversation, as_folders, load_dataset, most_frequent
from .losses import Batch, Candidates, DenseHead, drafter_losses, unrolled_steps
from .online import TargetFeatures, with_features

STATE_NAME = "trainer_state.json"
HELDOUT_EVAL_NAME = "heldout_eval.json"  # `hf-dynaspec train` writes the final held-out evaluation here
OPTIMIZER_NAME = "optimizer.safetensors"
FINAL_EVAL_POSITIONS = 4096  # held-out answer positions of the evaluation at the end of `train_drafter`


# ----------------------------------------------------------------------------------------------- batches
def split_heldout(convs: list[Conversation], fraction: float, seed: int = 0) -> tuple[list, list]:
    """(train, heldout) split by conversation; at least one of each when there are two or more."""
    order = torch.randperm(len(convs), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = min(max(1 if len(convs) > 1 and fraction > 0 else 0, round(fraction * len(convs))), len(convs) - 1)
    return [convs[i] for i in order[n_held:]], [convs[i] for i in order[:n_held]]


def window(conv: Conversation, start: int, length: int) -> dict[str, torch.Tensor]:
    """Drafter positions start .. start + length - 1 of one conversation (fewer at its end)."""
    stop = window_stop(conv, start, length)
    return {
        "input_ids": conv.input_ids[start + 1 : stop + 1],  # (t,)
        "features": conv.features[start:stop],  # (t, k * d)
        "target_hidden": conv.hidden[start + 1 : stop + 1],  # (t, d)
        "position_ids": torch.arange(start, stop),  # (t,)
        "valid": conv.loss_mask[start + 2 : stop + 2],  # (t,)
    }


def window_stop(conv: Conversation, start: int, length: int) -> int:
    """The end (exclusive) of the window at `start`: positions with a target h_{i+1} are i = 0 .. num_states - 2;
    the window reads states start .. stop (its features and the next position's target state)."""
    return min(start + length, conv.num_states - 1)


def random_span(convs: list[Conversation], seq_len: int, generator: torch.Generator) -> tuple[Conversation, int]:
    """A random conversation and the start of its last `seq_len` positions: the whole answer (where the loss is)
    with as much of the prompt before it as fits, so the drafter attends to context as it does when decoding."""
    conv = convs[int(torch.randint(len(convs), (1,), generator=generator))]
    latest = max(0, conv.num_states - 1 - seq_len)
    # answers longer than the window: a random window inside the answer
    lo = min(latest, max(0, conv.prompt_length - 2))
    start = latest if lo >= latest else int(torch.randint(lo, latest + 1, (1,), generator=generator))
    return conv, start


def random_window(convs: list[Conversation], seq_len: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The window of a random span (`random_span`) of conversations that hold their states."""
    return window(*random_span(convs, seq_len, generator), seq_len)


def length_grouped_batches(
    convs: list[Conversation], batch_size: int, seq_len: int, generator: torch.Generator, pool: int = 16,
    featurize: TargetFeatures | None = None,
) -> Iterator[Batch]:
    """Endless random batches that pad little: `pool` batches' worth of random windows are drawn at once, sorted
    by length, cut into batches and served in random order. Each window is still drawn uniformly (with
    replacement); only which windows share a batch changes. `pool=1`: plain random batches. Conversations of token
    ids only get the states their window reads from `featurize`, one target forward per batch (`online.py`)."""
    while True:
        spans = sorted((random_span(convs, seq_len, generator) for _ in range(pool * batch_size)),
                       key=lambda span: window_stop(*span, seq_len) - span[1])
        for i in torch.randperm(pool, generator=generator).tolist():
            chosen = spans[i * batch_size : (i + 1) * batch_size]
            yield collate([window(conv, start, seq_len) for conv, start in filled_spans(chosen, seq_len, featurize)])


def filled_spans(spans: list[tuple[Conversation, int]], seq_len: int,
                 featurize: TargetFeatures | None) -> list[tuple[Conversation, int]]:
    """The spans with the states their windows read (states 0 .. stop): unchanged where the conversations hold
    them, else computed in one batch by `featurize`."""
    if all(conv.hidden is not None for conv, _ in spans):
        return spans
    if featurize is None:
        raise ValueError("These conversations carry token ids only: pass featurize (training.online.TargetFeatures).")
    filled = featurize([(conv, window_stop(conv, start, seq_len) + 1) for conv, start in spans])
    return [(conv, start) for conv, (_, start) in zip(filled, spans)]


def collate(parts: list[dict[str, torch.Tensor]]) -> Batch:
    """Right-pad the windows to the longest of them (not to `seq_len`: conversations are often shorter, and
    padding past the longest is work whose outputs no loss reads; a causal row never sees the padding after it)."""
    width = max(part["input_ids"].shape[0] for part in parts)

    def pad(key: str, fill: float | int = 0) -> torch.Tensor:
        rows = []
        for part in parts:
            value = part[key]
            extra = width - value.shape[0]
            rows.append(torch.cat([value, value.new_full((extra, *value.shape[1:]), fill)]) if extra else value)
        return torch.stack(rows)

    return Batch(pad("input_ids"), pad("features"), pad("target_hidden"), pad("position_ids"), pad("valid", False))


# ----------------------------------------------------------------------------------------------- schedule
def lr_at(step: int, total: int, base_lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warmup then cosine decay to `min_ratio * base_lr`."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(ckpt_dir: Path, drafter, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Drafter + AdamW moments (safetensors) + state JSON, the JSON last (it marks a complete checkpoint)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    drafter.save_pretrained(ckpt_dir)
    tensors = {}
    for idx, param_state in optimizer.state_dict()["state"].items():
        for key, value in param_state.items():
            tensors[f"{idx}.{key}"] = torch.as_tensor(value).detach().contiguous().cpu()
    save_file(tensors, str(ckpt_dir / OPTIMIZER_NAME))
    tmp = ckpt_dir / (STATE_NAME + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, ckpt_dir / STATE_NAME)


def finished_step(ckpt_dir: str | os.PathLike, steps: int, settings: dict[str, Any]) -> int | None:
    """The saved step when `ckpt_dir` holds a checkpoint trained to at least `steps` and the final held-out
    evaluation (`HELDOUT_EVAL_NAME`) of that step by a command of these `settings`; else None (training or its
    evaluation is still to run, or another command is asked for: it runs, and checks its arguments, as usual)."""
    ckpt = Path(ckpt_dir)
    if not (ckpt / STATE_NAME).is_file() or not (ckpt / HELDOUT_EVAL_NAME).is_file():
        return None
    step = int(json.loads((ckpt / STATE_NAME).read_text())["step"])
    record = json.loads((ckpt / HELDOUT_EVAL_NAME).read_text())
    same = record.get("settings") == json.loads(json.dumps(settings, default=str))  # as the record stores them
    return step if step >= steps and record.get("step") == step and same else None


def load_checkpoint(ckpt_dir: Path, drafter, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """Restore drafter parameters and AdamW moments in place; the saved state dict, or None."""
    if not (ckpt_dir / STATE_NAME).is_file():
        return None
    state = json.loads((ckpt_dir / STATE_NAME).read_text())
    weights = {}
    for file in sorted(ckpt_dir.glob("model*.safetensors")):
        weights.update(load_file(str(file)))
    own = drafter.state_dict()
    for name in ("cluster_permutation", "cluster_offsets"):
        if name in weights and not torch.equal(weights[name].to(own[name].device), own[name]):
            raise ValueError(f"{ckpt_dir} was trained with other vocabulary clusters ({name} differs).")
    params = dict(drafter.named_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise ValueError(f"{ckpt_dir} lacks drafter parameters {missing[:5]}: not a checkpoint of this drafter.")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(weights[name])
    opt_state = optimizer.state_dict()
    tensors = load_file(str(ckpt_dir / OPTIMIZER_NAME))
    restored: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        restored.setdefault(int(idx), {})[name] = value
    opt_state["state"] = restored
    optimizer.load_state_dict(opt_state)
    return state


class TrainingStopped(KeyboardInterrupt):
    """Training was asked to stop (SIGINT / SIGTERM) and checkpointed the last finished step first."""


class StopRequest:
    """Set by a signal handler (`stop_signals`): the name of the signal received, or None."""

    requested: str | None = None


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM, inside the block, ask the loop to stop after the step under way (so a checkpoint is
    written from whole steps, never from an optimizer update cut in half) instead of killing it. Outside the main
    thread, where Python cannot take signals, nothing changes."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def request(signum: int, _frame) -> None:
        stop.requested = signal.Signals(signum).name

    previous = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def frozen(module: torch.nn.Module) -> Iterator[None]:
    """Turn off gradients of `module` (the target: its embeddings and head are borrowed) for the block."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in flags:
            param.requires_grad_(flag)


# ----------------------------------------------------------------------------------------------- training
def optimizer_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], loss: torch.Tensor,
                   grad_clip: float) -> float:
    """One update: gradients of `loss`, their global norm clipped to `grad_clip`, the optimizer's step. Returns
    the loss as a float."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return float(loss.detach())


def trainable(drafter, args: TrainingArguments) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """The parameters to train (the router's alone with `router_only`, the rest frozen) and their AdamW."""
    if args.router_only:
        drafter.requires_grad_(False)
        drafter.router.requires_grad_(True)
    params = [p for p in drafter.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))


@dataclass
class RunState:
    """What a run carries from step to step and across resumes (trainer_state.json)."""

    start: int  # the step this call started from
    curve: list[dict[str, Any]]  # learning-curve points, kept across resumes
    seen_before: int  # training positions seen by earlier calls
    tokens: int = 0  # training positions seen by this call
    history: list[float] = field(default_factory=list)  # this call's per-step losses

    @classmethod
    def resumed(cls, saved: dict[str, Any] | None) -> RunState:
        saved = saved or {}
        return cls(int(saved.get("step", 0)), list(saved.get("curve", [])), int(saved.get("positions_seen", 0)))

    def record(self, args: TrainingArguments, step: int, sizes: list[int]) -> dict[str, Any]:
        """trainer_state.json after `step` steps."""
        return {"step": step, **args.state(), "last_losses": self.history[-20:], "started_this_run_at": self.start,
                "curve": self.curve, "positions_seen": self.seen_before + self.tokens, "data_conversations": sizes}


@dataclass
class CurveData:
    """The held-out conversations a learning-curve point reads (`curve_point`), their states computed once where
    the data holds token ids only, and the target's tokens kept between points."""

    heldout: list[Conversation]  # scored as one set (one data folder)
    groups: dict[str, list[Conversation]]  # scored per folder (several)
    gold_cache: dict = field(default_factory=dict)

    @classmethod
    def of(cls, groups: dict[str, list[Conversation]], heldout: list[Conversation], args: TrainingArguments,
           featurize: TargetFeatures | None) -> CurveData:
        """`heldout`: every group's held-out conversations together (or a stand-in where there are none); only the
        set a curve point reads gets its states: `heldout` for one group, each group's for several."""
        if not args.eval_every:
            return cls([], groups)
        if len(groups) < 2:
            return cls(with_features(heldout, featurize, args.eval_positions), groups)
        per_group = positions_per_group(args.eval_positions, len(groups))
        return cls([], {name: with_features(held, featurize, per_group) for name, held in groups.items()})

    def point(self, drafter, args: TrainingArguments, step: int, seen: int) -> dict[str, Any]:
        point = curve_point(drafter, self.heldout, args.seq_len, step, seen, args.unroll, args.eval_positions,
                            self.groups, self.gold_cache)
        drafter.train()
        return point


def train_drafter(
    drafter,
    target,
    data_dir: str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, list[Conversation]],
    ckpt_dir: str | os.PathLike,
    args: TrainingArguments,
    *,
    featurize: TargetFeatures | None = None,
    resume: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `drafter` (bound to `target`) as `args` says, checkpointing into `ckpt_dir` (resumed from there unless
    `resume` is False). `data_dir`: one dataset folder or several (each split into train / held-out on its own, so
    adding a folder later never moves a conversation of an earlier one across the split), or conversation lists of
    token ids only (`online.corpus_groups`): `featurize` (`online.TargetFeatures`) then computes each batch's
    states, and the held-out ones once. SIGINT / SIGTERM stop it after the step under way, checkpointed
    (`TrainingStopped`). Returns {"step", "start_step", "losses" (this call's per-step totals), "tokens_per_s",
    "curve", "eval": evaluate_drafter(...) on the held-out conversations}."""
    args.check_drafter(drafter)
    drafter.bind(target)
    prepare_router(drafter, target, args.seed)
    train, groups, sizes = load_split_groups(data_dir, args.heldout_fraction, args.seed)
    check_data_layers(train, drafter.config.feature_layer_ids)
    candidates = None if args.head_vocab is None else Candidates(
        most_frequent(train, args.head_vocab, drafter.config.vocab_size), args.head_target_top)
    heldout = [c for held in groups.values() for c in held] or train[:1]
    params, optimizer = trainable(drafter, args)
    ckpt = Path(ckpt_dir)
    saved = load_checkpoint(ckpt, drafter, optimizer) if resume else None
    check_same_split(saved, sizes, ckpt)
    run = RunState.resumed(saved)
    generator = torch.Generator().manual_seed(args.seed + run.start)
    batches = length_grouped_batches(train, args.batch_size, args.seq_len, generator, args.length_pool, featurize)
    curve_data = CurveData.of(groups, heldout, args, featurize)
    drafter.train()
    t0 = time.perf_counter()
    with frozen(target), stop_signals() as stop:
        training_steps(drafter, batches, (params, optimizer), candidates, generator, args, run,
                       (ckpt, sizes), curve_data, stop, progress)
    drafter.eval()
    elapsed = time.perf_counter() - t0
    final = with_features(heldout, featurize, FINAL_EVAL_POSITIONS)
    return {
        "step": max(run.start, args.steps),
        "start_step": run.start,
        "losses": run.history,
        "tokens_per_s": run.tokens / elapsed if elapsed > 0 else 0.0,
        "curve": run.curve,
        "eval": evaluate_drafter(drafter, final, args.seq_len, max_positions=FINAL_EVAL_POSITIONS,
                                 unroll=max(args.unroll, 3)),
    }


def prepare_router(drafter, target, seed: int) -> None:
    """A router never fitted (an imported EAGLE-3 checkpoint) gets its vocabulary clusters from the target's LM head
    now; the training that follows fits it (a resumed checkpoint then loads its own clusters over these)."""
    if drafter.config.router_fitted:
        return
    weight = target.get_output_embeddings().weight.detach()
    drafter.set_clusters(cluster_vocabulary(weight, drafter.config.num_clusters, seed=seed))
    drafter.config.router_fitted = True


def training_steps(drafter, batches: Iterator[Batch], optimized: tuple[list[torch.Tensor], torch.optim.Optimizer],
                   candidates: Candidates | None, generator: torch.Generator, args: TrainingArguments, run: RunState,
                   saving: tuple[Path, list[int]], curve_data: CurveData, stop: StopRequest, progress: bool) -> None:
    """Steps run.start .. args.steps - 1: each batch's losses (`drafter_losses`) and one update, a curve point every
    `eval_every` steps, a checkpoint every `ckpt_every` (and at the end, and when a stop signal came: then
    `TrainingStopped`). Updates `run` in place."""
    params, optimizer = optimized
    ckpt, sizes = saving
    dense = DenseHead.of(drafter, args.autocast_dtype)  # cast once, not per call (`DenseHead`)
    bar = tqdm(range(run.start, args.steps), desc="train drafter", unit="step", disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup_steps)
        batch = next(batches)
        with torch.autocast(drafter.fc.weight.device.type, dtype=args.autocast_dtype or torch.bfloat16,
                            enabled=args.autocast_dtype is not None):
            parts = drafter_losses(drafter, batch, args.head_positions, args.router_top_l, args.soft_targets,
                                   generator, args.unroll, args.unroll_decay, dense, candidates)
        run.history.append(optimizer_step(optimizer, params, args.loss_weights.total(parts), args.grad_clip))
        run.tokens += int(batch.valid.sum())
        bar.set_postfix(loss=f"{run.history[-1]:.3f}", top1=f"{float(parts['top1']):.2f}")
        done = step + 1
        if args.eval_every and (done % args.eval_every == 0 or done == args.steps):
            run.curve.append(curve_data.point(drafter, args, done, run.seen_before + run.tokens))
        if done % args.ckpt_every == 0 or done == args.steps or stop.requested:
            save_checkpoint(ckpt, drafter, optimizer, run.record(args, done, sizes))
        if stop.requested:
            raise TrainingStopped(f"stopped by {stop.requested} after step {done} of {args.steps}: checkpoint in "
                                  f"{ckpt}; rerun the same command to resume")

def load_split(
    data_dirs: str | os.PathLike | Sequence[str | os.PathLike], heldout_fraction: float, seed: int
) -> tuple[list[Conversation], list[Conversation], list[int]]:
    """(train, heldout, conversations per folder) of one or several dataset folders (`load_split_groups`)."""
    train, groups, sizes = load_split_groups(data_dirs, heldout_fraction, seed)
    return train, [c for held in groups.values() for c in held], sizes


def load_split_groups(
    data_dirs: str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, list[Conversation]],
    heldout_fraction: float, seed: int,
) -> tuple[list[Conversation], dict[str, list[Conversation]], list[int]]:
    """(train, {folder name: its held-out conversations}, conversations per folder) of one or several dataset
    folders, or of named conversation lists (`online.corpus_groups`), each split on its own (a permutation of its
    usable conversations: the split moves if a folder gains or loses any)."""
    if isinstance(data_dirs, Mapping):
        named = list(data_dirs.items())
    else:
        folders = as_folders(data_dirs)
        names = [Path(d).name for d in folders]
        names = names if len(set(names)) == len(names) else [str(d) for d in folders]
        named = [(name, load_dataset(folder)) for name, folder in zip(names, folders)]
    train: list[Conversation] = []
    groups: dict[str, list[Conversation]] = {}
    sizes: list[int] = []
    for name, convs in named:
        usable = [c for c in convs if c.num_states >= 2 and bool(c.loss_mask[2:].any())]
        part_train, groups[name] = split_heldout(usable, heldout_fraction, seed)
        train += part_train
        sizes.append(len(usable))
    if not train:
        raise ValueError(f"{', '.join(name for name, _ in named)} holds no training conversations.")
    return train, groups, sizes


def check_same_split(saved: dict[str, Any] | None, sizes: list[int], ckpt: Path) -> None:
    """Refuse to resume on data whose held-out split moved: each folder's split is a permutation of its
    conversations, so a folder that grew would put conversations already trained on into the held-out set
    (and inflate every held-out figure). Added folders are fine: they are split on their own."""
    before = (saved or {}).get("data_conversations")
    if before is not None and list(sizes[: len(before)]) != list(before):
        raise ValueError(
            f"{ckpt} was trained on data folders of {before} conversations, now {sizes[: len(before)]}: a folder "
            "that changed moves the held-out split onto conversations already trained on. Keep those folders as "
            "they were and pass new data as another --data folder (it is split on its own), or start anew "
            "(--no-resume)."
        )


def positions_per_group(positions: int, num_groups: int) -> int:
    """Held-out positions a curve point scores per group (`curve_point`): all of them for one group, half for several."""
    return positions if num_groups < 2 else max(1, positions // 2)


def curve_point(drafter, heldout: list[Conversation], seq_len: int, step: int, seen: int, unroll: int,
                positions: int, groups: dict[str, list[Conversation]] | None = None,
                gold_cache: dict | None = None) -> dict[str, Any]:
    """One learning-curve point: held-out top-1 at draft depths 1..max(unroll, 3) after `step` steps. With several
    `groups` (data folders), each is evaluated on up to `positions` // 2 of its positions ("by_group") and the
    overall figure is their position-weighted mean (every group counted, no second pass over the first ones).
    `gold_cache`: the target's tokens kept between points (`evaluate_drafter`)."""
    depths = max(unroll, 3)
    if not groups or len(groups) < 2:
        ev = evaluate_drafter(drafter, heldout, seq_len, max_positions=positions, unroll=depths, gold_cache=gold_cache)
        return {"step": step, "positions_seen": seen, "top1_at_depth": [round(v, 4) for v in ev["top1_at_depth"]],
                "heldout_positions": ev["positions"]}
    budget = positions_per_group(positions, len(groups))
    per_group = {name: evaluate_drafter(drafter, held, seq_len, max_positions=budget, unroll=depths, gold_cache=gold_cache)
                 for name, held in groups.items() if held}
    total = max(sum(g["positions"] for g in per_group.values()), 1)
    overall = [sum(g["top1_at_depth"][d] * g["positions"] for g in per_group.values()) / total for d in range(depths)]
    return {"step": step, "positions_seen": seen, "top1_at_depth": [round(v, 4) for v in overall],
            "heldout_positions": total,
            "by_group": {name: {"top1_at_depth": [round(v, 4) for v in g["top1_at_depth"]],
                                "heldout_positions": g["positions"]} for name, g in per_group.items()}}


def check_data_layers(convs: list[Conversation], layer_ids: list[int]) -> None:
    """Refuse data whose stored target features are not the layers the drafter reads."""
    stored = list(convs[0].layer_ids)
    if stored != list(layer_ids) and not (stored == [-1] and len(layer_ids) == 1 and layer_ids[0] == -1):
        raise ValueError(
            f"The drafter reads the target's hidden states {layer_ids}, but this data stores {stored}: compute "
            "the features it needs from the corpus (`hf-dynaspec features --layers ...`, training/features.py)."
        )


def target_tokens(drafter, batch: Batch, cache: dict | None, key: tuple) -> torch.Tensor:
    """The target's token at each answer position of a one-window batch (every draft step's positions are among
    these), -1 elsewhere: (1, T); read from `cache` under `key` when there, stored there when computed."""
    if cache is not None and key in cache:
        return cache[key]
    gold = torch.full_like(batch.input_ids, -1)  # (1, T)
    answer = batch.target_hidden.to(drafter.fc.weight.dtype)[batch.valid]  # (n, d)
    gold[batch.valid] = drafter.dense_logits(answer).argmax(-1)
    if cache is not None:
        cache[key] = gold
    return gold


@torch.no_grad()
def evaluate_drafter(
    drafter, convs: list[Conversation], seq_len: int = 512, budgets: tuple[int, ...] | None = None,
    max_positions: int = 4096, unroll: int = 2, gold_cache: dict | None = None,
) -> dict[str, Any]:
    """Held-out metrics on answer positions: top-1 agreement of the drafter's full head with the target's
    greedy token ("top1": teacher-forced, as at the first draft position; "top1_at_depth": at draft depth
    1..unroll, the drafter reading its own features as when decoding) and router recall (the target token's
    cluster among the router's top-k, first draft position) per k. The target's tokens (argmax of its stored
    states through the frozen head) do not change as the drafter trains: a `gold_cache` dict keeps them between
    calls on the same conversations (a learning curve), keyed by conversation and window."""
    num_clusters = drafter.config.num_clusters
    budgets = budgets or tuple(sorted({k for k in (1, 2, 4, 8, 16, 32, num_clusters) if k <= num_clusters}))
    cluster_of_token = drafter.clusters.cluster_of_token
    hits, totals = [0] * unroll, [0] * unroll
    recall_hits = dict.fromkeys(budgets, 0)
    for conv in convs:
        for start in range(0, conv.num_states - 1, seq_len):
            batch = collate([window(conv, start, seq_len)])
            if not batch.valid.any():
                continue
            gold_all = target_tokens(drafter, batch, gold_cache, (id(conv), start))  # (1, T)
            for depth, (features, router_logits, valid_mask) in enumerate(unrolled_steps(drafter, batch, unroll)):
                valid = valid_mask.nonzero(as_tuple=True)
                pred = drafter.dense_logits(features[valid]).argmax(-1)  # (n,)
                gold = gold_all[valid]  # (n,)
                hits[depth] += int((pred == gold).sum())
                totals[depth] += int(gold.numel())
                if depth == 0:
                    order = router_logits[valid].argsort(-1, descending=True)  # (n, M)
                    rank = (order == cluster_of_token.to(gold.device)[gold][:, None]).float().argmax(-1)  # (n,)
                    for k in budgets:
                        recall_hits[k] += int((rank < k).sum())
            if totals[0] >= max_positions:
                break
        if totals[0] >= max_positions:
            break
    denom = max(totals[0], 1)
    return {
        "positions": totals[0],
        "top1": hits[0] / denom,
        "top1_at_depth": [h / max(t, 1) for h, t in zip(hits, totals)],
        "router_recall": {k: recall_hits[k] / denom for k in budgets},
    }

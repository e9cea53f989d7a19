"""Step 3 (speculators venv): train speculators' draft on a CPU through its own forward and loss, briefly.

`speculators train` itself cannot run on a CPU in 0.9.0 (README.md of this folder, with file:line): its Trainer
moves the model and every batch to the integer device `local_rank` = 0, i.e. cuda:0 (train/trainer.py:348, 533;
train/distributed.py:24), its default loss is a Triton kernel (losses/fused.py), its checkpoint loader maps to
"cuda:0" (utils/util.py:13-19, train/checkpointer.py:306), and its data are hidden states written by a vLLM
server (train/data.py:274-333). So this loop replaces only the Trainer and the hidden-state source; everything
else is speculators' own:

- the model: `Eagle3DraftModel.from_pretrained(WORK/init)` as `speculators train --from-pretrained` loads it
  (train/cli.py:525-533), the draft attention implementation re-applied the same way;
- the data pipeline: its `BaseDataset` (train/data.py:98), its packing sampler `MultipackDistributedBatchSamplerV2`
  (train/distributed_batch_sampler.py:165, seeded per epoch, resumed by slicing its batch list as its Trainer does,
  trainer.py:456), its `CollateFn` (train/data.py:336, documents packed into one row with document_ids) and
  EAGLE-3's `shift_batch` (models/eagle3/data.py:8). Only `_get_raw_data` differs from its `ArrowDataset`: the
  verifier's hidden states come from transformers (the aux layers `eagle_aux_hidden_state_layer_ids` as HF
  `output_hidden_states[i]`, the state entering layer i as vLLM captures it, and the final layer's output before
  the final norm, which its forward normalises with `verifier_norm` to get the targets, core.py:250-253) instead
  of a vLLM `extract_hidden_states` file;
- the step: its forward with its loss (`get_trainer_kwargs`, core.py:429: kl_div, ttt_steps 3, decay 1.0, the
  "eager" loss implementation: the PyTorch one of losses/eager.py instead of the Triton kernel), then as its
  Trainer: backward, `clip_grad_norm_(1.0)`, optimizer and scheduler steps (trainer.py:545-560);
- the optimizer and schedule: its `build_optimizers` (train/optimizers.py:69) and `_resolve_scheduler_steps`
  (trainer.py:169) with `get_linear_schedule_with_warmup`, its defaults: lr 1e-3, weight decay 0.01, linear, 1%
  warmup. `--optimizer` defaults to adamw here (0.9.0's CLI default is muon: pass `--optimizer muon` for it);
- the save: `save_pretrained` of the state dict in bf16 with its `convert_float_dtype` / `patch_config_dtype`,
  as its checkpointer writes every checkpoint (train/checkpointer.py:339-351).

Resumable: WORK/train/state.pt (trainable weights, optimizer and scheduler states, step) every `--save-every`
steps; a rerun continues from it. At the end the trained draft is saved to WORK/trained/.

    .venv-speculators/bin/python recipes/speculators/train.py --max-steps 300
    .venv-speculators/bin/python recipes/speculators/train.py --verifier /tmp/spec-toy/verifier \\
        --corpus /tmp/spec-toy/corpus --work-dir /tmp/spec-toy/work --max-steps 2 --total-seq-len 256
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from common import add_folder_arguments, read_corpus  # recipes/speculators/common.py
from speculators.models.eagle3 import Eagle3DraftModel, shift_batch
from speculators.train.checkpointer import convert_float_dtype, patch_config_dtype
from speculators.train.data import BaseDataset, CollateFn
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
from speculators.train.optimizers import build_optimizers
from speculators.train.trainer import TrainerConfig, _resolve_scheduler_steps
from tqdm import tqdm
from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup


class VerifierStatesDataset(BaseDataset):
    """speculators' dataset with transformers as the hidden-state source. Each item is what its `ArrowDataset`
    returns from a vLLM file (train/data.py:324-333): hidden_states (T, k d) of the aux layers, input_ids (T,),
    verifier_last_hidden_states (T, d) (the last layer's output, before the final norm), loss_mask (T,)."""

    def __init__(self, rows: list[dict[str, torch.Tensor]], verifier, layer_ids: list[int], max_len: int):
        self.rows, self.verifier, self.layer_ids = rows, verifier, layer_ids
        decoder = verifier.get_decoder()
        self._final: list[torch.Tensor] = []
        decoder.norm.register_forward_pre_hook(lambda _module, inputs: self._final.append(inputs[0]))
        super().__init__(max_len, torch.float32)

    def _compute_approx_lengths(self) -> list[int]:
        return [int(r["input_ids"].numel()) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    @torch.no_grad()
    def _get_raw_data(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        ids = row["input_ids"][: self.max_len]
        self._final.clear()
        states = self.verifier.get_decoder()(input_ids=ids[None], output_hidden_states=True).hidden_states
        aux = torch.cat([states[i][0] for i in self.layer_ids], dim=-1)  # (T, k d)
        return {"hidden_states": aux, "input_ids": ids, "verifier_last_hidden_states": self._final.pop()[0],
                "loss_mask": row["loss_mask"][: self.max_len]}


def load_draft(init_dir: Path, attn_impl: str) -> Eagle3DraftModel:
    """As `speculators train --from-pretrained DIR` (train/cli.py:525-533), in float32."""
    config = Eagle3DraftModel.config_class.from_pretrained(str(init_dir))
    config.transformer_layer_config._attn_implementation = attn_impl
    verifier = config.speculators_config.verifier.name_or_path
    model = Eagle3DraftModel.from_pretrained(str(init_dir), config=config, verifier=verifier, dtype=torch.float32)
    return model.float()


def save_state(path: Path, step: int, model, optimizers, schedulers) -> None:
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    state = {"step": step, "trainable": trainable, "optimizers": [o.state_dict() for o in optimizers],
             "schedulers": [s.state_dict() for s in schedulers]}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path, model, optimizers, schedulers) -> int:
    if not path.is_file():
        return 0
    state = torch.load(path, weights_only=True)
    missing = set(state["trainable"]) - {n for n, _ in model.named_parameters()}
    if missing:
        raise SystemExit(f"{path} does not fit this draft ({sorted(missing)[:3]}...): delete it to start over.")
    model.load_state_dict(state["trainable"], strict=False)
    for obj, sd in zip([*optimizers, *schedulers], [*state["optimizers"], *state["schedulers"]], strict=True):
        obj.load_state_dict(sd)
    print(f"resumed from {path} at step {state['step']}")
    return int(state["step"])


def save_trained(model, out: Path, dtype: torch.dtype) -> None:
    """As speculators' checkpointer writes a checkpoint (train/checkpointer.py:349-351)."""
    model.save_pretrained(out, state_dict=convert_float_dtype(model.state_dict(), dtype))
    patch_config_dtype(out / "config.json", dtype)


def accuracies(metrics: dict[str, torch.Tensor], ttt_steps: int) -> str:
    acc = [float(metrics[f"full_acc_{k}_sum"]) / max(float(metrics[f"full_acc_{k}_total"]), 1.0)
           for k in range(ttt_steps)]
    return "/".join(f"{a:.2f}" for a in acc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_folder_arguments(parser)
    parser.add_argument("--max-steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--total-seq-len", type=int, default=2048,
                        help="tokens per packed step (speculators' default is 8192; 2048 here for a CPU)")
    parser.add_argument("--max-conversations", type=int, default=None, help="use only the first N conversations")
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "muon"])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--loss-fn", default="kl_div", help="speculators loss spec (default kl_div, its eagle3 one)")
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--ttt-step-loss-decay", type=float, default=1.0)
    parser.add_argument("--draft-attn-impl", default="sdpa",
                        choices=["simple_flex_attention", "sdpa", "eager"],
                        help="draft attention in training only (not saved). speculators defaults to flex attention, which has no backward on a CPU (torch 2.13): sdpa here, with its boolean mask")
    parser.add_argument("--autocast", default="none", choices=["none", "bfloat16"],
                        help="CPU autocast dtype (speculators autocasts to bf16 on GPUs; fp32 is faster on CPUs "
                             "without bf16 matrix units)")
    parser.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="dtype of the saved draft (speculators' checkpoints: bf16)")
    parser.add_argument("--save-every", type=int, default=25, help="write the resume state every N steps")
    parser.add_argument("--seed", type=int, default=42, help="sampler seed (speculators' default 42)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    init_dir, train_dir, out_dir = args.work_dir / "init", args.work_dir / "train", args.work_dir / "trained"
    if not (init_dir / "model.safetensors").is_file():
        raise SystemExit(f"{init_dir} is missing: run build.py first.")
    train_dir.mkdir(parents=True, exist_ok=True)

    model = load_draft(init_dir, args.draft_attn_impl)
    layer_ids = list(model.target_layer_ids)
    hidden = model.config.transformer_layer_config.hidden_size
    verifier = AutoModelForCausalLM.from_pretrained(str(args.verifier), dtype=torch.float32).eval()
    verifier.requires_grad_(False)
    rows = read_corpus(args.corpus, args.max_conversations)
    dataset = VerifierStatesDataset(rows, verifier, layer_ids, args.total_seq_len)
    sampler = MultipackDistributedBatchSamplerV2(batch_max_length=args.total_seq_len, lengths=dataset.approx_lengths,
                                                 num_replicas=1, rank=0, seed=args.seed)
    collate = CollateFn(args.total_seq_len, hidden, num_target_layers=len(layer_ids), dtype=torch.float32,
                        preprocess=shift_batch)
    per_epoch = len(sampler._generate_batches(0))  # noqa: SLF001 (as speculators' Trainer does)

    config = TrainerConfig(lr=args.lr, num_epochs=1, save_path=str(train_dir), optimizer=args.optimizer,
                           weight_decay=args.weight_decay, muon_lr=args.lr, max_steps=args.max_steps)
    optimizers = build_optimizers(model, config)
    warmup, total = _resolve_scheduler_steps(config, per_epoch)
    schedulers = [get_linear_schedule_with_warmup(o, num_warmup_steps=warmup, num_training_steps=total)
                  for o in optimizers]
    call_kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(loss_fn=args.loss_fn, loss_implementation="eager",
                                                         ttt_steps=args.ttt_steps,
                                                         ttt_step_loss_decay=args.ttt_step_loss_decay)
    state_path = train_dir / "state.pt"
    step = load_state(state_path, model, optimizers, schedulers)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"draft: {trainable} trainable parameters; aux layers {layer_ids}; {len(rows)} conversations, "
          f"{per_epoch} packed steps of {args.total_seq_len} tokens per epoch; warmup {warmup}, total {total}")
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast == "bfloat16" else nullcontext())
    model.train()
    log = (train_dir / "log.jsonl").open("a")
    bar = tqdm(total=args.max_steps, initial=step, desc="train", unit="step")
    batches: dict[int, list] = {}  # epoch -> its packed batches (the sampler packs a whole epoch at once)
    while step < args.max_steps:
        epoch, position = divmod(step, per_epoch)
        if epoch not in batches:
            batches = {epoch: sampler._generate_batches(epoch)}  # noqa: SLF001
        indices = batches[epoch][position]
        t0 = time.perf_counter()
        batch = collate([dataset[int(i)] for i in indices])
        tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        t1 = time.perf_counter()
        with autocast:
            _draft_tokens, loss, metrics = model(**tensors, **call_kwargs)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
        for scheduler in schedulers:
            scheduler.step()
        step += 1
        record = {"step": step, "loss": round(float(loss), 4), "acc": accuracies(metrics, args.ttt_steps),
                  "lr": schedulers[0].get_last_lr()[0], "docs": len(indices),
                  "target_s": round(t1 - t0, 2), "draft_s": round(time.perf_counter() - t1, 2)}
        log.write(json.dumps(record) + "\n")
        log.flush()
        bar.set_postfix(loss=record["loss"], acc=record["acc"])
        bar.update(1)
        if step % args.save_every == 0 or step == args.max_steps:
            save_state(state_path, step, model, optimizers, schedulers)
    bar.close()
    save_trained(model, out_dir, getattr(torch, args.save_dtype))
    print(f"saved the trained draft to {out_dir} ({args.save_dtype}) after {step} steps")


if __name__ == "__main__":
    main()

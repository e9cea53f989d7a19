"""TrainingArguments: every setting of one drafter training run (`trainer.train_drafter`), typed and checked when
built, so a wrong value is refused before any data or model loads.

    python -c "from hf_dynaspec.training.arguments import TrainingArguments as A; print(A(steps=10, lr=1e-3, batch_size=2, seq_len=16))"
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .losses import LossWeights

HELDOUT_FRACTION = 0.05  # of each data folder's conversations, never trained on
EVAL_POSITIONS = 2048  # held-out answer positions of a learning-curve point (half of it per group: `curve_point`)


@dataclass(frozen=True)
class TrainingArguments:
    """Args:
        steps: optimizer steps in all (a resumed run continues from its saved step up to `steps`).
        lr, batch_size, seq_len: AdamW's peak learning rate; windows per batch; drafter positions per window.
        heldout_fraction: of each data folder's conversations, split off on its own and never trained on.
        unroll, unroll_decay: draft steps trained per position on the drafter's own features
            (`losses.unrolled_steps`), step s weighted by `unroll_decay ** (s - 1)`.
        warmup: linear warmup steps before the cosine decay (None: 5% of `steps`, at least 1).
        weight_decay, grad_clip: AdamW's decay; the global gradient norm's limit.
        weights: the losses' weights (`losses.LossWeights`); `router_only` overrides them.
        head_positions, router_top_l, soft_targets: the head loss's positions per batch, the router's multi-label
            top-L, soft (target distribution) or hard CE targets (`losses.drafter_losses`).
        ckpt_every: steps between checkpoints (one is written at the end and on a stop signal too).
        seed: the split's and the batches' seed.
        autocast_dtype: torch.bfloat16 runs forward and loss under autocast (weights and optimizer stay fp32).
        eval_every, eval_positions: a learning-curve point (held-out top-1 at depths 1..max(unroll, 3)) every that
            many steps (0: none), on that many held-out positions.
        router_only: train the router alone (its loss only, every other parameter frozen).
        length_pool: batches drawn at once and grouped by length (`length_grouped_batches`; 1: no grouping).
        head_vocab, head_target_top: score the CE over the training data's `head_vocab` most frequent answer tokens
            and each position's `head_target_top` most likely under the target (`losses.Candidates`); None: the
            whole vocabulary.
    """

    steps: int
    lr: float
    batch_size: int
    seq_len: int
    heldout_fraction: float = HELDOUT_FRACTION
    unroll: int = 1
    unroll_decay: float = 0.8
    warmup: int | None = None
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    weights: LossWeights = field(default_factory=LossWeights)
    head_positions: int = 256
    router_top_l: int = 8
    soft_targets: bool = True
    ckpt_every: int = 200
    seed: int = 0
    autocast_dtype: torch.dtype | None = None
    eval_every: int = 0
    eval_positions: int = EVAL_POSITIONS
    router_only: bool = False
    length_pool: int = 16
    head_vocab: int | None = None
    head_target_top: int = 16

    def __post_init__(self) -> None:
        at_least_one = {"steps": "optimizer steps", "batch_size": "windows per batch",
                        "seq_len": "drafter positions per window", "unroll": "draft steps trained per position",
                        "length_pool": "batches drawn at once and grouped by length",
                        "head_target_top": "the target's greedy token is always a candidate",
                        "ckpt_every": "steps between checkpoints"}
        for name, meaning in at_least_one.items():
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 ({meaning}), got {getattr(self, name)}.")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}.")
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}.")
        if self.head_vocab is not None and self.head_vocab < 1:
            raise ValueError(f"head_vocab must be >= 1 (tokens always scored) or None, got {self.head_vocab}.")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: no learning curve), got {self.eval_every}.")

    @property
    def warmup_steps(self) -> int:
        return max(1, self.steps // 20) if self.warmup is None else self.warmup

    @property
    def loss_weights(self) -> LossWeights:
        return LossWeights(regression=0.0, ce=0.0, router=1.0) if self.router_only else self.weights

    def check_drafter(self, drafter) -> None:
        """The settings that depend on the drafter, refused before any data loads."""
        if self.head_vocab is not None and self.head_vocab > drafter.config.vocab_size:
            raise ValueError(f"head_vocab must be in 1..{drafter.config.vocab_size} (tokens always scored), got "
                             f"{self.head_vocab}.")

    def state(self) -> dict:
        """What trainer_state.json records of these settings (`trainer.RunState.record`)."""
        return {"lr": self.lr, "batch_size": self.batch_size, "seq_len": self.seq_len, "unroll": self.unroll,
                "length_pool": self.length_pool, "head_vocab": self.head_vocab,
                "head_target_top": self.head_target_top}

"""Speculative statistics of one generate() call (`return_dict_in_generate=True`), and the one timer.

Every field is a count or a sum, so statistics of many calls merge by addition (`merge`), and a record
saved with `to_dict` reloads with `from_dict`: the bench keeps one dict per run and merges them per category.
Means are properties computed from the sums. Timed sections go through `timer(name)`, which on CUDA
synchronises before and after when `synchronize` is set (otherwise a section measures kernel launches, not
work); section names are `SECTIONS`.

    python -c "from hf_dynaspec.generation.loop.stats import SpeculativeStats as S; s = S(steps=2, accepted_tokens=4); print(s.merge(s).summary())"
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

# Timed sections. "draft": growing the tree (drafter layer, router, head, bookkeeping); "extend": the drafter
# over newly accepted tokens (and the head at the new root); "router" and "head": their parts of both;
# "verify": the target's forward over the tree and the walk; "prefill": the target over the prompt; "setup": the
# call's one-time work before its first drafted step (binding the drafter, the LM head's layout and the verification
# costs, measured or read from disk: `calibration`).
SECTIONS = ("setup", "prefill", "draft", "router", "head", "extend", "verify")
LEGACY_FIELDS = {"gated_steps": "plain_steps"}  # records written before the step policy
NOT_SUMMED = ("seconds", "synchronize", "_pending_shortlist", "_pending_recall")


@dataclass
class SpeculativeStats:
    """steps: target verification steps; accepted_tokens: tokens they emitted (accepted drafts + one bonus
    token each); tree_nodes: draft nodes verified (root excluded); shortlist_total / shortlist_positions:
    shortlist sizes summed over drafted positions / those positions; recall_hits / recall_checks: steps whose
    first token (the target's own choice after the root) lay in the root's shortlist / steps checked;
    lookup_tokens: accepted drafts that came from the lookup branch; plain_steps / lookup_steps: steps the step
    policy verified without a drafted tree (the root alone / the lookup branch alone: `policy.py`); tree_steps:
    steps that verified the whole configured tree in its turn against the policy's (`step_arms.py`);
    predicted_steps: steps that verified at least one draft node, with the policy's expected accepted length of
    each summed in predicted_tokens, its variance under the policy's own model in predicted_variance (so a run's
    deviation can be told from the noise the model itself expects) and the realised one in realized_tokens;
    host_reads / target_host_reads: reads of device values on the host
    (each a GPU synchronisation) in the decoding steps, outside / inside the target's own forward, counted
    with `count_host_reads=True` (`syncs.HostSyncCounter`; 0 when not counted); seconds: wall time per
    section."""

    steps: int = 0
    accepted_tokens: int = 0
    tree_nodes: int = 0
    shortlist_total: int = 0
    shortlist_positions: int = 0
    recall_hits: int = 0
    recall_checks: int = 0
    lookup_tokens: int = 0
    plain_steps: int = 0
    lookup_steps: int = 0
    tree_steps: int = 0  # steps that verified the whole configured tree in its A/B turn (`step_arms`)
    predicted_steps: int = 0
    predicted_tokens: float = 0.0
    predicted_variance: float = 0.0
    realized_tokens: int = 0
    host_reads: int = 0
    target_host_reads: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    synchronize: bool = False  # CUDA: synchronise around timed sections (not a statistic; not merged or saved)
    # shortlist sizes and recall hits summed on their device, not yet read (`settle`): decoding never waits for them
    _pending_shortlist: torch.Tensor | None = field(default=None, repr=False, compare=False)
    _pending_recall: torch.Tensor | None = field(default=None, repr=False, compare=False)

    # ----------------------------------------------------------------- recording
    @contextmanager
    def timer(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        """Add the wall time of the `with` block to `seconds[name]`."""
        if name not in SECTIONS:
            raise ValueError(f"Unknown timed section {name!r}: one of {SECTIONS}.")
        sync = self.synchronize and device is not None and device.type == "cuda"
        if sync:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync:
                torch.cuda.synchronize(device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def add_step(self, accepted: int, tree_nodes: int, lookup_tokens: int) -> None:
        self.steps += 1
        self.accepted_tokens += accepted
        self.tree_nodes += tree_nodes
        self.lookup_tokens += lookup_tokens

    def add_shortlist(self, sizes: torch.Tensor) -> None:
        """Shortlist sizes (T,) of T drafted positions, summed where they are: read once, by `settle`."""
        self.shortlist_positions += sizes.numel()
        total = sizes.sum()
        self._pending_shortlist = total if self._pending_shortlist is None else self._pending_shortlist + total

    def settle(self) -> SpeculativeStats:
        """Fold the sums still on the device into the fields (one read); every reader calls it."""
        if self._pending_shortlist is not None:
            self.shortlist_total += int(self._pending_shortlist)
            self._pending_shortlist = None
        if self._pending_recall is not None:
            self.recall_hits += int(self._pending_recall)
            self._pending_recall = None
        return self

    def add_recall(self, hit: bool | torch.Tensor) -> None:
        """One recall check: a host bool, or a 0-dim device bool summed where it is (read by `settle`)."""
        self.recall_checks += 1
        if isinstance(hit, torch.Tensor):
            hit = hit.to(torch.int64)
            self._pending_recall = hit if self._pending_recall is None else self._pending_recall + hit
        else:
            self.recall_hits += int(hit)

    # ----------------------------------------------------------------- merging and records
    def merge(self, other: SpeculativeStats) -> SpeculativeStats:
        """The statistics of both runs together (a new object)."""
        self.settle(), other.settle()
        merged = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name not in
                  NOT_SUMMED}
        seconds = dict(self.seconds)
        for name, value in other.seconds.items():
            seconds[name] = seconds.get(name, 0.0) + value
        return SpeculativeStats(**merged, seconds=seconds)

    @classmethod
    def merged(cls, stats: list[SpeculativeStats]) -> SpeculativeStats:
        total = cls()
        for item in stats:
            total = total.merge(item)
        return total

    def to_dict(self) -> dict:
        out = asdict(self.settle())
        out.pop("synchronize")
        out.pop("_pending_shortlist")
        out.pop("_pending_recall")
        return out

    @classmethod
    def from_dict(cls, data: dict) -> SpeculativeStats:
        data = {LEGACY_FIELDS.get(name, name): value for name, value in data.items()}
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"Unknown SpeculativeStats fields {sorted(unknown)}.")
        return cls(**data)

    # ----------------------------------------------------------------- means
    def time(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted_tokens / max(1, self.steps)

    @property
    def mean_shortlist_size(self) -> float:
        return self.settle().shortlist_total / max(1, self.shortlist_positions)

    @property
    def shortlist_recall(self) -> float:
        return self.settle().recall_hits / max(1, self.recall_checks)

    @property
    def mean_tree_size(self) -> float:
        return self.tree_nodes / max(1, self.steps)

    @property
    def lookup_share(self) -> float:
        """Share of the emitted tokens (after the prefill's) that the lookup branch drafted."""
        return self.lookup_tokens / max(1, self.accepted_tokens)

    @property
    def predicted_accepted_length(self) -> float:
        """The step policy's mean expected accepted length over the steps that verified a draft."""
        return self.predicted_tokens / max(1, self.predicted_steps)

    @property
    def realized_accepted_length(self) -> float:
        """The mean accepted length of the same steps (`predicted_accepted_length`'s counterpart)."""
        return self.realized_tokens / max(1, self.predicted_steps)

    def add_prediction(self, kind: str, predicted: float | None, realized: int, draft_nodes: int,
                       variance: float = 0.0) -> None:
        """One step of the policy: its kind ("plain", "lookup" or "draft") and, where it verified draft nodes,
        its expected (None: no policy) and realised accepted length, and the expected one's variance."""
        self.plain_steps += kind == "plain"
        self.lookup_steps += kind == "lookup"
        if predicted is not None and draft_nodes > 0:
            self.predicted_steps += 1
            self.predicted_tokens += predicted
            self.predicted_variance += variance
            self.realized_tokens += realized

    @property
    def host_reads_per_step(self) -> float:
        """Host reads per decoding step outside the target's forward (when counted)."""
        return self.host_reads / max(1, self.steps)

    def summary(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_shortlist_size": self.mean_shortlist_size,
            "shortlist_recall": self.shortlist_recall,
            "lookup_tokens": self.lookup_tokens,
            "plain_steps": self.plain_steps,
            "lookup_steps": self.lookup_steps,
            "tree_steps": self.tree_steps,
            "predicted_accepted_length": self.predicted_accepted_length,
            "realized_accepted_length": self.realized_accepted_length,
            "mean_tree_size": self.mean_tree_size,
            "host_reads_per_step": self.host_reads_per_step,
            "target_host_reads_per_step": self.target_host_reads / max(1, self.steps),
            **{f"{name}_time_s": self.time(name) for name in SECTIONS},
        }


@dataclass
class DynaSpecGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `speculative_stats` (a `SpeculativeStats`: of the whole call, every row
    summed) and, for a batch of several rows, `speculative_stats_per_row` (one per row, in input order)."""

    speculative_stats: SpeculativeStats | None = None
    speculative_stats_per_row: list[SpeculativeStats] | None = None

"""`verify_head="auto"` on the CPU walk path: the LM head's layout learned from the call's own verifications.

Every verification applies the target's LM head to a few final hidden states (the walk rows, `verify.py`), and
which weight layout does that fastest (`walk_head.LAYOUTS`: the model's own "rows", transposed "columns", the
greedy-only bf16 "prefilter") depends on the machine, the row count and, for the prefilter, on the hidden states
themselves (how many candidates its error bound leaves). None wins everywhere: on one AMD EPYC the model's own
layout cost 3x the prefilter's at 3 rows, on Intel Xeons the two were close. So nothing is timed up front:
`HeadLearner` times the head applications of each verification (`WalkHead.timed`: the walk rows of the pass
and any row the walk reaches beyond them), per layout and the step's walk row count r (bucketed as the batch's
head timings are: `head_times.grid_rows`), on the call's real hidden states, and

- explores: a layout with fewer than `EXPLORE_SAMPLES` timings at the step's r is used for that step (its first
  step in a process is a warm-up, not counted: a fresh weight copy pays its page faults);
- exploits: otherwise the layout with the lowest median of its recent timings at r;
- keeps checking: a layout not chosen at r is used again once `RECHECK_EVERY` steps at r have passed
  without it (a machine's load changes; at most 1 / RECHECK_EVERY of the steps pay for it).

Every layout is exact (the prefilter's picks are the fp32 argmax), so exploring never changes the output, only
the step's time. What it learned is kept on disk with the other measurements (`measured`, per target shape,
layouts and machine), so the next process starts from it (`HeadLearner.of`); `hf-dynaspec calibrate` times the
layouts up front instead, as an option.

    python -m pytest tests/test_head_learner.py -q
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..planning import measured
from .head_times import grid_rows
from .walk_head import WalkHead

EXPLORE_SAMPLES = 2  # timed steps per layout and row count before the layouts are compared there
RECHECK_EVERY = 32  # steps at a row count after which a layout not chosen there is tried again once
KEEP = 8  # recent timings kept per layout and row count (their median is the estimate)


@dataclass
class HeadLearner:
    """The walk head's layout per row count, learned from timed steps (module docstring). `make(layout)`
    gives the target's head in that layout (its weight copy made once per process, `calibration.layout_head`;
    None: not exact on this machine); the first of `layouts` is used until others are timed;
    `rows`: the walk rows every layout computes at once in the verification pass (the same for all, so the
    verifier's walk rows do not depend on the layout); `key`: where its timings are kept on disk (None: not)."""

    layouts: tuple[str, ...]
    make: Callable[[str], WalkHead | None]
    rows: int
    key: str | None = None
    samples: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (layout, r bucket) -> seconds
    warm: set[str] = field(default_factory=set)  # layouts applied once in this process
    count: dict[int, int] = field(default_factory=dict)  # r bucket -> steps timed
    last_used: dict[tuple[str, int], int] = field(default_factory=dict)  # (layout, bucket) -> count then
    heads: dict[str, WalkHead] = field(default_factory=dict, repr=False)
    open: tuple[str, int] | None = None  # the step being verified: (layout, rows at once), `pick` to `close`
    spent: float = 0.0  # its head seconds so far

    @classmethod
    def of(cls, layouts: tuple[str, ...], make: Callable[[str], WalkHead | None], rows: int, key: str | None
           ) -> HeadLearner:
        """A learner starting from what an earlier process learned under `key` (`measured`), else from nothing."""
        learner = cls(tuple(layouts), make, rows, key)
        stored = measured.load(key) if key is not None else None
        if isinstance(stored, dict):
            for name, values in stored.items():
                layout, _, bucket = name.partition(":")
                if layout in learner.layouts and bucket.isdigit() and _are_seconds(values):
                    learner.samples[(layout, int(bucket))] = [float(v) for v in values][-KEEP:]
        return learner

    def pick(self, rows: int) -> tuple[WalkHead, bool]:
        """The head to apply for a verification whose walk computes `rows` rows at once (`next_layout`: a layout
        still to be explored at that row count, else one due a re-check, else the fastest there), and whether it
        is other than the `choice` there (exploring or re-checking). A layout that cannot be made here
        (`make` gives None) is dropped."""
        while True:
            layout = self.next_layout(rows)
            head = self.head_in(layout)
            if head is not None:
                self.open, self.spent = (layout, rows), 0.0
                return head, layout != self.choice(rows)

    def next_layout(self, rows: int) -> str:
        """The layout `head` applies at `rows` rows (module docstring: explore, re-check, exploit)."""
        bucket = grid_rows(rows)
        under = [layout for layout in self.layouts if len(self.samples.get((layout, bucket), ())) < EXPLORE_SAMPLES]
        if under:
            return under[0]
        best = self.choice(rows)
        now = self.count.get(bucket, 0)
        due = [layout for layout in self.layouts
               if layout != best and now - self.last_used.get((layout, bucket), 0) >= RECHECK_EVERY]
        return min(due, key=lambda layout: self.last_used.get((layout, bucket), 0)) if due else best

    def knows(self, rows: int) -> bool:
        """Whether every layout is timed at `rows` rows (nothing left to explore there)."""
        return all(self.samples.get((layout, grid_rows(rows))) for layout in self.layouts)

    def choice(self, rows: int) -> str:
        """The layout with the lowest median timing at `rows` rows (those timed there; none timed: the first)."""
        bucket = grid_rows(rows)
        timed = {layout: statistics.median(self.samples[(layout, bucket)]) for layout in self.layouts
                 if self.samples.get((layout, bucket))}
        return min(timed, key=timed.get) if timed else self.layouts[0]

    def estimate(self, layout: str, rows: int) -> float | None:
        """Median seconds of `layout` at `rows` rows (None: not timed there)."""
        values = self.samples.get((layout, grid_rows(rows)))
        return statistics.median(values) if values else None

    def walk_seconds(self, layout: str, batch: int = 1) -> list[float] | None:
        """`layout`'s seconds for a step of `batch` rows of w = 1..rows walk rows each (`estimate` at batch * w, else
        at the nearest row count timed; None: `layout` not timed at all)."""
        timed = sorted(bucket for (name, bucket) in self.samples if name == layout and self.samples[(name, bucket)])
        if not timed:
            return None
        wanted = [grid_rows(batch * w) for w in range(1, self.rows + 1)]
        nearest = [min(timed, key=lambda b, r=r: (abs(b - r), b)) for r in wanted]
        return [statistics.median(self.samples[(layout, bucket)]) for bucket in nearest]

    def observe(self, layout: str, rows: int, seconds: float) -> None:
        """One application of `layout`'s head to `rows` rows took `seconds`: added to the open step's
        (`WalkHead.timed` calls this)."""
        if self.open is not None and self.open[0] == layout:
            self.spent += seconds

    def close(self) -> None:
        """The step opened by `pick` is verified: its head seconds (every application of its walk, the rows made on
        demand included) are one timing of its layout at its row count (`record`)."""
        if self.open is not None:
            self.record(*self.open, self.spent)
        self.open, self.spent = None, 0.0

    def record(self, layout: str, rows: int, seconds: float) -> None:
        """A step's walk with `layout` at `rows` rows at once took `seconds` of head applications (the first step of
        a layout in this process: a warm-up, not kept)."""
        if layout not in self.warm:
            self.warm.add(layout)
            return
        bucket = grid_rows(rows)
        kept = self.samples.setdefault((layout, bucket), [])
        kept.append(seconds)
        del kept[:-KEEP]
        self.count[bucket] = self.count.get(bucket, 0) + 1
        self.last_used[(layout, bucket)] = self.count[bucket]

    def save(self) -> None:
        """Keep the timings on disk (`measured`) for the next process."""
        if self.key is not None and self.samples:
            measured.save(self.key, {f"{layout}:{bucket}": values for (layout, bucket), values in self.samples.items()},
                          f"walk head timings learned on real verifications, per layout:row bucket ({self.rows} rows"
                          " at once)")

    def head_in(self, layout: str) -> WalkHead | None:
        """The head in `layout` with `rows` rows at once, its applications timed into `observe` (made once; None,
        and the layout dropped, where `make` cannot make it)."""
        if layout not in self.heads:
            made = self.make(layout)
            if made is None:
                if len(self.layouts) == 1:
                    raise ValueError(f"The walk head's last layout {layout!r} cannot be made here.")
                self.layouts = tuple(name for name in self.layouts if name != layout)
                return None
            self.heads[layout] = dataclasses.replace(made, rows=self.rows, observe=self.observe)
        return self.heads[layout]


def _are_seconds(values: object) -> bool:
    return isinstance(values, list) and bool(values) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values)


def learner_key(target: torch.nn.Module, layouts: tuple[str, ...], rows: int) -> str:
    """Where a target's learned walk head timings are kept (`measured.measurement_key`)."""
    return measured.measurement_key(target, "walk_head_learned", dict(layouts=list(layouts), rows=rows,
                                                                      threads=torch.get_num_threads()))

"""How long the target's LM head takes here for r rows at once, on a grid of row counts: what a batch's verification
reads to choose between the walk rows and every node's logits.

A batch verifies B trees in one pass and then applies the head to the rows the walks need, gathered
(`verifier.Verifier.node_logits`). How much r rows cost is the BLAS's business, and it is not linear, nor even
monotone, in r: with a 262,144 x 640 head one Intel Xeon took longer for 8 or 12 rows than for 16 or 32 (its GEMM
picks another kernel past a row count). So the rows of a batch are padded with zero rows to the cheapest count of
`ROW_GRID` between r and max(2 r, 16) (`HeadTimes.padded`, `pad_rows`), each grid count is timed the first time a batch needs
it (three applications on random hidden states, the faster two's mean), and the verifier computes every node's
logits when that costs no more than the walk rows alone (then no walk row is ever made on demand:
`verify.walk_trees`). The timings are kept on disk per target shape, layout and machine (`measured`), as
calibration's are.

    python -c "from hf_dynaspec.generation.verification.head_times import grid_rows; print([grid_rows(r) for r in (5, 13, 40)])"
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..loop.syncs import wall_seconds
from ..planning import measured
from .walk_head import WalkHead

ROW_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
HEAD_REPEATS = 3  # timed applications per grid count (after one untimed)
SMALL_ROWS = 16  # a few rows may be padded up to this many (BLAS kernels change at small row counts)


def grid_rows(rows: int) -> int:
    """The smallest count of `ROW_GRID` holding `rows` rows (beyond the grid: `rows`)."""
    return next((size for size in ROW_GRID if size >= rows), rows)


def pad_rows(hidden: torch.Tensor, size: int) -> torch.Tensor:
    """Hidden states (r, d) padded with zero rows to (size, d), size >= r."""
    extra = size - hidden.shape[0]
    return hidden if extra == 0 else torch.cat([hidden, hidden.new_zeros(extra, hidden.shape[1])])


@dataclass
class HeadTimes:
    """Seconds of `head.apply` over r rows padded to the grid (`__call__`), timed once per grid count and kept on
    disk under `key` (`measured`). Only for layouts that make logits: a greedy layout's cost depends on the rows'
    values (`walk_head.PrefilterHead`), which padding and random rows do not have."""

    head: WalkHead
    key: str
    device: torch.device
    seconds: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, target: torch.nn.Module, head: WalkHead) -> HeadTimes:
        if head.greedy_only:
            raise ValueError(f"HeadTimes times layouts that make logits; {head.layout!r} makes greedy picks.")
        key = measured.measurement_key(target, "head_rows", dict(layout=head.layout, repeats=HEAD_REPEATS,
                                                                 threads=torch.get_num_threads()))
        stored = measured.load(key)
        seconds = {int(r): float(s) for r, s in stored.items()} if isinstance(stored, dict) else {}
        return cls(head, key, target.device, seconds)

    def __call__(self, rows: int) -> float:
        """Seconds of the head over `rows` rows (0 rows: 0), padded as `padded` says."""
        return 0.0 if rows == 0 else self.timed(self.padded(rows))

    def padded(self, rows: int) -> int:
        """The row count to apply the head at for `rows` rows: the cheapest grid count from grid_rows(rows) to
        max(2 rows, `SMALL_ROWS`) (each timed when first asked: a few rows may cost more than 16)."""
        sizes = [size for size in ROW_GRID if rows <= size <= max(2 * rows, SMALL_ROWS)] or [grid_rows(rows)]
        return min(sizes, key=lambda size: (self.timed(size), size))

    def timed(self, size: int) -> float:
        """Seconds of the head over `size` rows: stored, else timed now and stored."""
        if size not in self.seconds:
            self.seconds[size] = self._time(size)
            measured.save(self.key, {str(r): s for r, s in sorted(self.seconds.items())},
                          f"seconds of the LM head ({self.head.layout}) over r rows at once, grid counts timed so far")
        return self.seconds[size]

    def _time(self, size: int) -> float:
        """The faster two's mean of `HEAD_REPEATS` applications on random rows, after an untimed one."""
        weight = self.head.head.weight
        hidden = torch.randn(size, weight.shape[1], device=self.device, dtype=weight.dtype)
        with torch.no_grad():
            times = wall_seconds(lambda: self.head.apply(hidden), HEAD_REPEATS + 1, self.device)[1:]
        fastest = sorted(times)[:2]
        return sum(fastest) / len(fastest)

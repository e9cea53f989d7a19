"""The target's LM head as verification applies it on the CPU walk path: which weight layout, how many rows at once.

On a CPU, verification computes target logits only along the walk (a few rows per step, `verify.NodeLogits`).
With a large vocabulary those rows are a large share of a step (Gemma 3 270M: a 262,144 x 640 head, 168M of its
268M parameters), and how fast a BLAS computes them depends on the machine, the row count and the weight's
layout. Each layout is a `WalkHead` (`LAYOUTS` names them, `WalkHead.of` makes one):

- `RowsHead` ("rows"):           logits = h @ W.T with W (V, d) as the model keeps it (the model's own `lm_head`,
                                 which computes the walk rows inside the verification pass);
- `ColumnsHead` ("columns"):     logits = h @ W_t with W_t = W.T made contiguous once (d, V): one extra copy of the
                                 head's weights;
- `PrefilterHead` ("prefilter"): greedy only (no sampling, logits processors or kept scores): no logits, only each
                                 row's argmax, exact, from a bf16 copy of the head and an fp32 rescoring of the few
                                 tokens its error bound leaves (`prefilter.py`): one extra half-size copy.

None wins everywhere (on one AMD EPYC the columns layout was faster for 1-3 rows and slower for 4-16), so
`calibration.measure_walk_head` times those the call may use and keeps the layout and the number of rows r computed
at once in the verification pass that make a walk of w rows cheapest: cost(r) = t(r) + max(0, w - r) * t(1) (rows
past r priced one by one: an upper bound, as the walk makes them r at a time, `verify.walk_trees`).

    python -c "from hf_dynaspec.generation.verification.walk_head import WalkHead; help(WalkHead)"
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...head import LogitTransform
from .prefilter import Prefilter, unsupported_reason

Made = torch.Tensor | list[int]  # what a head makes of r rows: their logits (r, V) fp32, or their picks (r ids)


@dataclass(frozen=True)
class WalkHead(ABC):
    """The target's output embedding `head` (weight (V, d), optional bias) then its logit `transform`, applied
    in one layout (the subclass; `layout` its name); `rows`: how many walk rows the verification pass computes at
    once; `seconds`: the timings behind the choice, per layout, for 1..max rows (empty when not measured).
    `greedy_only`: the layout gives each row's greedy pick, not its logits."""

    layout: ClassVar[str]
    greedy_only: ClassVar[bool] = False

    head: torch.nn.Module
    transform: LogitTransform = LogitTransform()
    rows: int = 1
    seconds: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)
    observe: Callable[[str, int, float], None] | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def of(target: torch.nn.Module, rows: int = 1, layout: str = "rows") -> WalkHead:
        """The target's head in `layout`, one of `LAYOUTS` (its copy of the weights made here)."""
        return head_class(layout).made(target, rows)

    @classmethod
    def made(cls, target: torch.nn.Module, rows: int = 1) -> WalkHead:
        """The target's head in this layout."""
        return cls(target.get_output_embeddings(), LogitTransform.of(target.config), rows)

    @classmethod
    def blocker(cls, target: torch.nn.Module, greedy_only: bool) -> str | None:
        """Why this layout cannot verify `target` (None: it can); `greedy_only`: the call needs greedy picks only
        (no sampling, logits processors or kept scores)."""
        return None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw target logits (r, V) fp32 from final (normed) hidden states (r, d): the model's own head."""
        return self.transform(self.head(hidden).float())

    def logits_to_keep(self, rows: list[int], device: torch.device) -> torch.Tensor:
        """What the verification pass asks the model for: no logits (the walk rows are made here from the final
        hidden states)."""
        return torch.tensor([], dtype=torch.long, device=device)

    def walk(self, out, rows: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        """From the output of a verification pass asked with `logits_to_keep(rows)` (final hidden states kept):
        the walk rows' raw logits, each (1, V) fp32, and their greedy picks where the layout makes picks instead
        (`split`)."""
        return self.split(rows, self.timed(out.hidden_states[-1][0, rows]))  # (r, d) -> r rows

    def timed(self, hidden: torch.Tensor) -> Made:
        """`apply`, its wall seconds told to `observe` when set (the CPU walk path: `apply` returns computed values,
        nothing is left queued on a device)."""
        if self.observe is None:
            return self.apply(hidden)
        start = time.perf_counter()
        made = self.apply(hidden)
        self.observe(self.layout, hidden.shape[0], time.perf_counter() - start)
        return made

    @abstractmethod
    def apply(self, hidden: torch.Tensor) -> Made:
        """Rows (r, d) -> what the walk reads of them: their raw logits (r, V) fp32, or their greedy picks."""

    @abstractmethod
    def split(self, nodes: list[int], made: Made) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        """`apply`'s output for the r tree `nodes` as (logits (1, V) per node, greedy pick per node)."""

    @abstractmethod
    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's greedy picks (r,) from final hidden states (r, d): exact in every layout."""

    def reproduces(self, hidden: torch.Tensor, logits: torch.Tensor) -> bool:
        """Does this head, applied to final hidden states (1, d), give the target's logits (1, V)? False for
        targets that post-process logits in ways `LogitTransform` does not know: those verify with full logits."""
        with torch.no_grad():
            mine = self(hidden)  # (1, V)
            return mine.shape == logits.shape and torch.allclose(mine, logits.float(), rtol=1e-4, atol=1e-4)

    def error_over_bound(self, hidden: torch.Tensor) -> float:
        """The largest error of this layout's picks over the bound their exactness rests on, for hidden (n, d):
        0 for the fp32 layouts (exact by construction)."""
        return 0.0


@dataclass(frozen=True)
class LogitsHead(WalkHead, ABC):
    """A layout that makes the walk rows' logits (the picks are their argmax)."""

    def apply(self, hidden: torch.Tensor) -> torch.Tensor:
        return self(hidden)  # (r, V)

    def split(self, nodes: list[int], made: torch.Tensor) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        return {node: made[i : i + 1] for i, node in enumerate(nodes)}, {}

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        return self(hidden).argmax(dim=-1)


@dataclass(frozen=True)
class RowsHead(LogitsHead):
    """logits = h @ W.T, W (V, d) as the model keeps it: the model's own head computes the walk rows in the
    verification pass (`logits_to_keep`), and any other row the walk reaches."""

    layout: ClassVar[str] = "rows"

    def logits_to_keep(self, rows: list[int], device: torch.device) -> torch.Tensor:
        """The walk rows: the model's own head computes them in the verification pass (when timed, `observe`: after
        it, on the final hidden states, as the other layouts do)."""
        return super().logits_to_keep(rows, device) if self.observe else torch.tensor(rows, dtype=torch.long,
                                                                                      device=device)

    def walk(self, out, rows: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        if self.observe:
            return super().walk(out, rows)
        return self.split(rows, out.logits[0].float())  # (r, V) the rows the pass kept


@dataclass(frozen=True)
class ColumnsHead(LogitsHead):
    """logits = h @ W_t (+ bias), W_t = W.T (d, V) made contiguous once (`weight_t`)."""

    layout: ClassVar[str] = "columns"

    weight_t: torch.Tensor = field(kw_only=True)  # (d, V)

    @classmethod
    def made(cls, target: torch.nn.Module, rows: int = 1) -> ColumnsHead:
        head = target.get_output_embeddings()
        return cls(head, LogitTransform.of(target.config), rows, weight_t=head.weight.detach().t().contiguous())

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden @ self.weight_t  # (r, d) @ (d, V)
        if getattr(self.head, "bias", None) is not None:
            logits = logits + self.head.bias
        return self.transform(logits.float())


@dataclass(frozen=True)
class PrefilterHead(WalkHead):
    """Greedy picks without logits: each row's exact fp32 argmax from the bf16 copy `prefilter` of the head and
    an fp32 rescoring of the few tokens its error bound leaves (`prefilter.Prefilter`). Its logits (`__call__`,
    for `reproduces` only) are the model's own head's."""

    layout: ClassVar[str] = "prefilter"
    greedy_only: ClassVar[bool] = True

    prefilter: Prefilter = field(kw_only=True)

    @classmethod
    def made(cls, target: torch.nn.Module, rows: int = 1) -> PrefilterHead:
        reason = prefilter_blocker(target)
        if reason is not None:
            raise ValueError(f"The prefilter head cannot give this target's greedy picks exactly: {reason}.")
        head = target.get_output_embeddings()
        return cls(head, LogitTransform.of(target.config), rows, prefilter=Prefilter.of(head.weight))

    @classmethod
    def blocker(cls, target: torch.nn.Module, greedy_only: bool) -> str | None:
        if not greedy_only:
            return ("it gives greedy picks only: do_sample=False with no logits processors (such as "
                    "repetition_penalty) and no output_scores / output_logits")
        return prefilter_blocker(target)

    def apply(self, hidden: torch.Tensor) -> list[int]:
        return self.prefilter.argmax(hidden).tolist()  # r ids on the host

    def split(self, nodes: list[int], made: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        return {}, dict(zip(nodes, made))

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.prefilter.argmax(hidden)  # (r,)

    def reproduces(self, hidden: torch.Tensor, logits: torch.Tensor) -> bool:
        """The model's head gives the target's logits, and the prefilter their argmax."""
        with torch.no_grad():
            return super().reproduces(hidden, logits) and bool((self.argmax(hidden) == logits.argmax(dim=-1)).all())

    def error_over_bound(self, hidden: torch.Tensor) -> float:
        return self.prefilter.error_over_bound(hidden)


HEADS: dict[str, type[WalkHead]] = {head.layout: head for head in (RowsHead, ColumnsHead, PrefilterHead)}
LAYOUTS = tuple(HEADS)  # ("rows", "columns", "prefilter")


def head_class(layout: str) -> type[WalkHead]:
    """The `WalkHead` of the layout named `layout`."""
    if layout not in HEADS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    return HEADS[layout]


def prefilter_blocker(target: torch.nn.Module) -> str | None:
    """Why the "prefilter" layout cannot give `target`'s greedy picks exactly (None: it can)."""
    transform = LogitTransform.of(target.config)
    return unsupported_reason(target.get_output_embeddings(), transform.scale, transform.softcap)


def gathered_seconds(seconds: tuple[float, ...], rows: int) -> float:
    """Seconds of `rows` rows at once: measured up to len(seconds) rows, beyond that the largest measurement scaled
    by the rows (a GEMM over many rows costs about linearly in them)."""
    if rows <= len(seconds):
        return seconds[rows - 1]
    return seconds[-1] * rows / len(seconds)


def walk_cost(seconds: tuple[float, ...], rows: int, walk: int, batch: int = 1) -> float:
    """Seconds to get the walks of `batch` rows of `walk` rows each with `rows` per row computed at once, gathered
    into one application of the head: t(batch * rows) + batch * max(0, walk - rows) * t(1), pricing each walk row
    past `rows` as one row on its own (an upper bound: verification makes them `rows` at a time, for every row
    waiting at once, `verify.walk_trees`)."""
    return gathered_seconds(seconds, batch * rows) + batch * max(0, walk - rows) * seconds[0]


def choose_walk_head(seconds: dict[str, tuple[float, ...]], walk: int, columns_margin: float, batch: int = 1
                     ) -> tuple[str, int]:
    """(layout, rows) with the cheapest `walk_cost` for `batch` rows (ties: more rows) among the `seconds`
    measured; a layout other than "rows" only when it is cheaper than the best "rows" choice (if measured) by the
    factor `columns_margin` (< 1: its extra weight copy must pay)."""
    best = {}
    for layout, times in seconds.items():
        rows = min(range(1, len(times) + 1), key=lambda r, t=times: (walk_cost(t, r, walk, batch), -r))
        best[layout] = (walk_cost(times, rows, walk, batch), rows)
    baseline = best["rows"][0] if "rows" in best else math.inf
    others = [layout for layout in best if layout != "rows" and best[layout][0] < columns_margin * baseline]
    if others:
        layout = min(others, key=lambda name: best[name][0])
        return layout, best[layout][1]
    return "rows", best["rows"][1]

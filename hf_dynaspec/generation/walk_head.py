"""The target's LM head as verification applies it on the CPU walk path: which weight layout, how many rows at once.

On a CPU, verification computes target logits only along the walk (a few rows per step, `verify.NodeLogits`).
With a large vocabulary those rows are a large share of a step (Gemma 3 270M: a 262,144 x 640 head, 168M of its
268M parameters), and how fast a BLAS computes them depends on the machine, the row count and the weight's
layout:

- "rows":      logits = h @ W.T with W (V, d) as the model keeps it (the model's own `lm_head`);
- "columns":   logits = h @ W_t with W_t = W.T made contiguous once (d, V): one extra copy of the head's weights;
- "prefilter": greedy only (no sampling, logits processors or kept scores): no logits, only each row's argmax,
               exact, from a bf16 copy of the head and an fp32 rescoring of the few tokens its error bound leaves
               (`prefilter.py`): one extra half-size copy of the head's weights.

None wins everywhere (on one AMD EPYC the columns layout was faster for 1-3 rows and slower for 4-16), so
`calibration.measure_walk_head` times those the call may use and keeps the layout and the number of rows r computed
at once in the verification pass that make a walk of w rows cheapest: cost(r) = t(r) + max(0, w - r) * t(1) (rows
past r are made one at a time when the walk reaches them).

    python -c "from hf_dynaspec.generation.walk_head import WalkHead; help(WalkHead)"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..head import LogitTransform
from .prefilter import Prefilter, unsupported_reason

LAYOUTS = ("rows", "columns", "prefilter")
GREEDY_LAYOUTS = ("prefilter",)  # layouts that give each row's argmax only


@dataclass(frozen=True)
class WalkHead:
    """The target's output embedding `head` (weight (V, d), optional bias) then its logit `transform`, applied
    in one layout; `rows`: how many walk rows the verification pass computes at once; `weight_t` (d, V): the
    contiguous transposed weight of the "columns" layout; `prefilter`: the bf16 copy of the "prefilter" layout
    (neither: "rows"); `seconds`: the timings behind the choice, per layout, for 1..max rows (empty when not
    measured)."""

    head: torch.nn.Module
    transform: LogitTransform = LogitTransform()
    rows: int = 1
    weight_t: torch.Tensor | None = None
    prefilter: Prefilter | None = None
    seconds: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, target: torch.nn.Module, rows: int = 1, layout: str = "rows") -> WalkHead:
        """The target's head in `layout` (the "columns" or "prefilter" copy is made here)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
        head, transform = target.get_output_embeddings(), LogitTransform.of(target.config)
        if layout == "prefilter":
            reason = prefilter_blocker(target)
            if reason is not None:
                raise ValueError(f"The prefilter head cannot give this target's greedy picks exactly: {reason}.")
            return cls(head, transform, rows, prefilter=Prefilter.of(head.weight))
        weight_t = head.weight.detach().t().contiguous() if layout == "columns" else None  # (d, V)
        return cls(head, transform, rows, weight_t)

    @property
    def layout(self) -> str:
        return "prefilter" if self.prefilter is not None else "rows" if self.weight_t is None else "columns"

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw target logits (r, V) fp32 from final (normed) hidden states (r, d)."""
        if self.weight_t is None:
            return self.transform(self.head(hidden).float())
        logits = hidden @ self.weight_t  # (r, d) @ (d, V)
        if getattr(self.head, "bias", None) is not None:
            logits = logits + self.head.bias
        return self.transform(logits.float())

    def logits_to_keep(self, rows: list[int], device: torch.device) -> torch.Tensor:
        """What the verification pass asks the model for: the walk rows in the "rows" layout (the model's own head
        computes them), none in the others (made here from the final hidden states)."""
        return torch.tensor(rows if self.layout == "rows" else [], dtype=torch.long, device=device)

    def walk(self, out, rows: list[int]) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        """From the output of a verification pass asked with `logits_to_keep(rows)` (final hidden states kept):
        the walk rows' raw logits, each (1, V) fp32 ("rows": the model's own head made them; "columns": made here),
        or, in the "prefilter" layout, their greedy picks (token ids) instead."""
        if self.prefilter is not None:
            return {}, dict(zip(rows, self.argmax(out.hidden_states[-1][0, rows]).tolist()))
        made = out.logits[0].float() if self.weight_t is None else self(out.hidden_states[-1][0, rows])  # (r, V)
        return {node: made[i : i + 1] for i, node in enumerate(rows)}, {}

    def apply(self, hidden: torch.Tensor) -> torch.Tensor | list[int]:
        """Rows (r, d) -> their raw logits (r, V) fp32, or in the "prefilter" layout their greedy picks (a host
        list of r token ids) instead."""
        if self.prefilter is not None:
            return self.prefilter.argmax(hidden).tolist()
        return self(hidden)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's greedy picks (r,) from final hidden states (r, d): exact in every layout."""
        if self.prefilter is not None:
            return self.prefilter.argmax(hidden)
        return self(hidden).argmax(dim=-1)

    def reproduces(self, hidden: torch.Tensor, logits: torch.Tensor) -> bool:
        """Does this head, applied to final hidden states (1, d), give the target's logits (1, V)? False for
        targets that post-process logits in ways `LogitTransform` does not know: those verify with full logits."""
        with torch.no_grad():
            mine = self(hidden)  # (1, V)
            same = mine.shape == logits.shape and torch.allclose(mine, logits.float(), rtol=1e-4, atol=1e-4)
            return same and (self.prefilter is None or bool((self.argmax(hidden) == logits.argmax(dim=-1)).all()))


def prefilter_blocker(target: torch.nn.Module) -> str | None:
    """Why the "prefilter" layout cannot give `target`'s greedy picks exactly (None: it can)."""
    transform = LogitTransform.of(target.config)
    return unsupported_reason(target.get_output_embeddings(), transform.scale, transform.softcap)


def walk_cost(seconds: tuple[float, ...], rows: int, walk: int) -> float:
    """Seconds to get a walk of `walk` rows with `rows` computed at once: t(rows) + max(0, walk - rows) * t(1)."""
    return seconds[rows - 1] + max(0, walk - rows) * seconds[0]


def choose_walk_head(seconds: dict[str, tuple[float, ...]], walk: int, columns_margin: float) -> tuple[str, int]:
    """(layout, rows) with the cheapest `walk_cost` (ties: more rows) among the `seconds` measured; a layout other
    than "rows" only when it is cheaper than the best "rows" choice (if measured) by the factor `columns_margin`
    (< 1: its extra weight copy must pay)."""
    best = {}
    for layout, times in seconds.items():
        rows = min(range(1, len(times) + 1), key=lambda r, t=times: (walk_cost(t, r, walk), -r))
        best[layout] = (walk_cost(times, rows, walk), rows)
    baseline = best["rows"][0] if "rows" in best else math.inf
    others = [layout for layout in best if layout != "rows" and best[layout][0] < columns_margin * baseline]
    if others:
        layout = min(others, key=lambda name: best[name][0])
        return layout, best[layout][1]
    return "rows", best["rows"][1]

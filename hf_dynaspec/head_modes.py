"""Head modes: which columns of the LM head the drafter scores, one small object per mode, chosen in one place.

A mode answers four questions: its logits at T draft positions (`logits`, over the machinery of a bound
`ShortlistHead`), what it reads (the router's clusters, the context's tokens, the static shortlist), whether its
shape stays fixed from one draft step to the next (what draft-step graphs need), and whether a drafter can run
it. `HEADS` holds the modes by name; `register_head` adds one, so a new mode is one class in its own module (see
tests/test_head_modes.py, which registers a toy mode and decodes exactly with it).

- "dynamic": DynaSpec, each position's top-k router clusters (their union in one GEMM, or fixed-size lanes).
- "full": the whole vocabulary (the EAGLE baseline).
- "static": a fixed token set (the FR-Spec / VocabTrim baseline), its `static_size` most frequent tokens.
- "context": the context's tokens plus the static set as a frequent core (NanoSpec).
- "union": each position's router clusters plus the context's tokens.
- "trained": the drafter's own head over its draft vocabulary (an EAGLE-3 checkpoint trained elsewhere).

    python -c "from hf_dynaspec.head_modes import HEADS; print({n: type(m).__name__ for n, m in HEADS.items()})"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .head_output import ContextColumns, HeadOutput

__all__ = ["HEADS", "ContextColumns", "HeadMode", "HeadOutput", "HeadRequest", "head_modes", "head_named", "register_head"]
from .router import UnionLimit, select_clusters

if TYPE_CHECKING:
    from .configuration import DynaSpecConfig
    from .head import ShortlistHead


@dataclass(frozen=True)
class HeadRequest:
    """What one head call passes besides the features: router_logits (T, M) or None; k: clusters per position;
    context: the step's context columns; static_size: the static prefix (None: all of it); layout: of the
    router's shortlists ("union" / "lanes"); union_limit: the cap on the union's tokens (None: no cap)."""

    router_logits: torch.Tensor | None = None
    k: int | list[int] | torch.Tensor = 1
    context: ContextColumns | None = None
    static_size: int | None = None
    layout: str = "union"
    union_limit: UnionLimit | None = None


class HeadMode(ABC):
    """One head mode; subclasses set `name` and the flags, and implement `logits`."""

    name: str = ""
    reads_router = False  # the router's clusters (a drafter whose router was not fitted cannot run it)
    reads_context = False  # the step's context columns (`ShortlistHead.context_columns`)
    reads_static = False  # the stored static shortlist, sized by `static_size`

    @abstractmethod
    def logits(self, head: ShortlistHead, features: torch.Tensor, request: HeadRequest) -> HeadOutput:
        """features (T, d) -> HeadOutput over this mode's columns."""

    def graph_blocker(self, layout: str) -> str | None:
        """Why a draft step with this head cannot be a captured graph (its shapes change from step to step), or
        None when it can."""
        return None

    def check_drafter(self, config: DynaSpecConfig) -> None:
        """`ValueError` saying what to do when a drafter with this config cannot run the mode."""
        if self.reads_router and not config.router_fitted:
            raise ValueError(
                f"head_mode={self.name!r} reads the drafter's router, which was not trained (a drafter imported from "
                "an EAGLE-3 checkpoint): fit it first (`hf-dynaspec router-fit --drafter <folder> ...`), or use "
                "head_mode 'trained' (the checkpoint's own head), 'static' or 'full'."
            )


HEADS: dict[str, HeadMode] = {}


def register_head(mode: HeadMode) -> HeadMode:
    """Make `mode` available as `head_mode=mode.name` everywhere a head mode is read; returns it."""
    if not mode.name or not isinstance(mode, HeadMode):
        raise ValueError(f"register_head takes a named HeadMode, got {mode!r}.")
    HEADS[mode.name] = mode
    return mode


def head_named(name: str) -> HeadMode:
    if name not in HEADS:
        raise ValueError(f"Unknown head_mode {name!r}: choose one of {head_modes()}.")
    return HEADS[name]


def head_modes() -> tuple[str, ...]:
    """The registered modes' names."""
    return tuple(HEADS)


def needs_router(request: HeadRequest, name: str) -> torch.Tensor:
    if request.router_logits is None:
        raise ValueError(f"head_mode={name!r} needs router logits.")
    return request.router_logits


def needs_context(request: HeadRequest, name: str) -> ContextColumns:
    if request.context is None:
        raise ValueError(f"head_mode={name!r} needs the step's context columns (`context_columns`).")
    return request.context


class Dynamic(HeadMode):
    name, reads_router = "dynamic", True

    def logits(self, head, features, request):
        router = needs_router(request, self.name)
        if request.layout == "lanes":
            return head.lanes(features, router, request.k)
        return head.clusters_union(features, select_clusters(router, request.k, request.union_limit))

    def graph_blocker(self, layout):
        return None if layout == "lanes" else "the 'dynamic' head needs shortlist_layout='lanes' (fixed-size shortlists)"


class Union(HeadMode):
    name, reads_router, reads_context = "union", True, True

    def logits(self, head, features, request):
        router, context = needs_router(request, self.name), needs_context(request, self.name)
        if request.layout == "lanes":
            return head.lanes(features, router, request.k, context)
        return head.clusters_union(features, select_clusters(router, request.k, request.union_limit), context)

    def graph_blocker(self, layout):
        return "head_mode 'union' changes shape every step (its context columns grow)"


class Context(HeadMode):
    name, reads_context, reads_static = "context", True, True

    def logits(self, head, features, request):
        context = needs_context(request, self.name)
        return HeadOutput.dense(context.token_ids, head.transform(F.linear(features, context.weight).float()))

    def graph_blocker(self, layout):
        return "head_mode 'context' changes shape every step (its context columns grow)"


class Full(HeadMode):
    name = "full"

    def logits(self, head, features, request):
        logits = head.transform(F.linear(features, head.weight).float())  # (T, V)
        return HeadOutput.dense(torch.arange(logits.shape[-1], device=logits.device), logits)


class Static(HeadMode):
    name, reads_static = "static", True

    def logits(self, head, features, request):
        ids, weight = head.static_prefix(request.static_size)
        return HeadOutput.dense(ids, head.transform(F.linear(features, weight).float()))  # (T, S)


NO_TRAINED_HEAD = ("head_mode='trained' needs a drafter with its own trained head (an EAGLE-3 checkpoint's lm_head, "
                   "loaded with `DynaSpecDrafter.from_pretrained(<checkpoint>)`); this drafter borrows the target's "
                   "LM-head rows: use head_mode 'dynamic', 'static' or 'full'.")


class Trained(HeadMode):
    name = "trained"

    def logits(self, head, features, request):
        if head.trained is None:
            raise ValueError(NO_TRAINED_HEAD)
        return head.trained(features)

    def check_drafter(self, config):
        if not config.draft_vocab_size:
            raise ValueError(NO_TRAINED_HEAD)


for _mode in (Dynamic(), Full(), Static(), Context(), Union(), Trained()):
    register_head(_mode)

"""Captured draft steps: one CUDA graph per step shape, replayed from static buffers.

A drafter step is a few dozen small kernels (layer, router, gathered head, top-k); launched one by one from
Python they cost more than they compute. A CUDA graph records them once and replays them in one launch. What a
graph asks of the step, and how the draft step meets it:

- static shapes: a graph is captured per key (frontier width F, cluster budget K), which fixes every shape (the
  "lanes" head pads each position's shortlist to K clusters);
- static addresses: the step's inputs are copied into buffers captured with it; its outputs are the graph's own
  buffers, cloned after each replay (the next replay overwrites them);
- nothing read on the host and no tensor made from Python data inside: the drafter's KV cache is transformers'
  `StaticLayer`, whose write position is a device tensor, and the attention mask is an input built before;
- the state the step mutates (the cache's write position, passed as `state`) is snapshot when a graph is made and
  put back after warm-up and capture, which run the step without it counting.

The router stays on its CUDA side stream inside the graph: `run_router_beside` forks and joins it on the
capturing stream, and the graph records both branches.

Backends: `CudaGraphs` (`torch.cuda.graph`, one private memory pool for every key of a run) and
`ReplayEmulation`, the same discipline on any device for tests: it captures the step as a graph of aten ops
(`make_fx`: Python values baked in, as a CUDA graph bakes them) under a check that refuses what CUDA capture
refuses (host reads, tensors made from Python data), and replays that graph on the static inputs, copying into the
captured outputs. A step whose capture fails runs eagerly from then on; the reason is logged once and kept in
`StepGraphs.fallbacks`.

    python -m pytest tests/test_graphs.py -q
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode

from ..loop.syncs import SYNCING

logger = logging.getLogger(__name__)

Step = Callable[..., tuple[torch.Tensor, ...]]  # static-shape tensors in -> a flat tuple of tensors out
Reset = Callable[[], None]  # puts back the state a step mutates (made by `StepGraphs` from its snapshot)

# what CUDA stream capture refuses beyond host reads: tensors made from Python data (a host-to-device copy)
FROM_HOST_DATA = frozenset({"tensor", "as_tensor", "from_numpy"})


class Backend(Protocol):
    def capture(self, step: Step, inputs: tuple[torch.Tensor, ...], reset: Reset
                ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        """(the step's output buffers, replay): replay() recomputes them from the current contents of `inputs`."""
        ...


class CaptureCheck(TorchFunctionMode):
    """Raises on what CUDA stream capture refuses: a host read (`syncs.SYNCING`) or a tensor made from Python
    data, so a CPU test fails where a GPU capture would."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNCING or name in FROM_HOST_DATA:
            raise RuntimeError(f"`{name}` inside a captured step: a CUDA graph cannot hold it (host read or "
                               "host-to-device copy); move it out of the step or make it a device op.")
        return func(*args, **(kwargs or {}))


class CudaGraphs:
    """`torch.cuda.graph` capture after `warmup` eager runs on a side stream (Triton compiles and autotunes, the
    allocator settles), as the CUDA graphs notes of PyTorch prescribe."""

    def __init__(self, warmup: int = 2) -> None:
        self.warmup = warmup
        self.pool: Any = None  # one private pool for every graph of a run: they never replay at once

    def capture(self, step: Step, inputs: tuple[torch.Tensor, ...], reset: Reset
                ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                step(*inputs)
                reset()
        main.wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):  # records; runs nothing
            outputs = step(*inputs)
        return outputs, graph.replay


class ReplayEmulation:
    """CUDA-graph semantics on any device, for tests: the step traced once into aten ops (`make_fx`, which runs
    it: `reset` follows) under `CaptureCheck`; replay runs that trace on the static inputs and copies its results
    into the captured outputs. Tensors the step reads or mutates besides its inputs (weights, the KV cache and its
    write position) are the trace's constants: the same objects, as a graph's fixed addresses."""

    def capture(self, step: Step, inputs: tuple[torch.Tensor, ...], reset: Reset
                ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        from torch.fx.experimental.proxy_tensor import make_fx  # tests only: not imported with the package

        with CaptureCheck():
            traced = make_fx(step)(*inputs)
        reset()
        outputs = tuple(out.clone() for out in traced(*inputs))
        reset()

        def replay() -> None:
            for out, new in zip(outputs, traced(*inputs), strict=True):
                out.copy_(new)

        return outputs, replay


@dataclass
class _Graph:
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    replay: Callable[[], None]


def backend_for(device: torch.device) -> Backend:
    """The capture backend of a device type ("cuda" only: graphs are a CUDA feature)."""
    if device.type != "cuda":
        raise ValueError(f"Draft-step graphs are CUDA graphs; the drafter is on {device.type!r}. Set "
                         "draft_graphs='off' (or 'auto') there.")
    return CudaGraphs()


class StepGraphs:
    """One captured graph per key, made on the key's first call; keys whose capture failed run eagerly."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.graphs: dict[Hashable, _Graph] = {}
        self.fallbacks: dict[Hashable, str] = {}  # key -> why it runs eagerly
        self.replays = 0

    def __call__(self, key: Hashable, step: Step, inputs: tuple[torch.Tensor, ...],
                 state: tuple[torch.Tensor, ...] = ()) -> tuple[torch.Tensor, ...]:
        """step(*inputs) through the key's graph: outputs are fresh tensors (clones of the graph's buffers).
        `step` must compute the same thing for every call with this key: it is captured once. `state`: the tensors
        the step mutates besides its outputs (the drafter cache's write position), put back after the untimed runs
        of a capture; nothing is copied on a replay."""
        if key in self.fallbacks:
            return step(*inputs)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key, step, inputs, state)
            if graph is None:
                return step(*inputs)
        for buffer, value in zip(graph.inputs, inputs, strict=True):
            buffer.copy_(value)
        graph.replay()
        self.replays += 1
        return tuple(out.clone() for out in graph.outputs)

    def _capture(self, key: Hashable, step: Step, inputs: tuple[torch.Tensor, ...],
                 state: tuple[torch.Tensor, ...]) -> _Graph | None:
        buffers = tuple(value.clone() for value in inputs)
        saved = tuple(value.clone() for value in state)

        def reset() -> None:
            for value, before in zip(state, saved, strict=True):
                value.copy_(before)

        try:
            outputs, replay = self.backend.capture(step, buffers, reset)
        except Exception as err:  # noqa: BLE001 - any capture failure leaves the step eager, said once
            reset()
            self.fallbacks[key] = f"{type(err).__name__}: {err}"
            logger.warning("Draft step %s runs eagerly: its graph capture failed (%s).", key, self.fallbacks[key])
            return None
        self.graphs[key] = _Graph(buffers, tuple(outputs), replay)
        return self.graphs[key]

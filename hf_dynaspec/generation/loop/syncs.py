"""Host synchronisations: `synchronize` waits for a device's queued work (timing needs it: `wall_seconds`);
`HostSyncCounter` counts the places where Python reads a tensor's value, which on CUDA wait for the GPU.

`HostSyncCounter` is a `TorchFunctionMode` that counts, by name, the conversions of tensors to Python values
(`.item()`, `.tolist()`, `int(t)`, `bool(t)`, `float(t)`, indexing a Python list with a tensor) and the ops whose
output shape depends on values (`nonzero`, `unique`, `masked_select`, ...). It works on any device, so a CPU
test can bound what a GPU step would wait for.

    python -c "
    import torch; from hf_dynaspec.generation.loop.syncs import HostSyncCounter
    with HostSyncCounter() as c: int(torch.tensor(3)); torch.arange(4).nonzero()
    print(c.total, dict(c.counts))"
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Tensor -> Python conversions, and ops whose result size depends on tensor values (both wait on CUDA)
SYNCING = frozenset({
    "item", "tolist", "__int__", "__bool__", "__float__", "__index__",
    "nonzero", "nonzero_static_unsafe", "unique", "unique_consecutive", "masked_select", "argwhere",
})


class HostSyncCounter(TorchFunctionMode):
    """Counts host synchronisations inside its `with` block: `.counts` by name, `.total`."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNCING:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (a no-op on the CPU), so that a wall-clock timing measures work done."""
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def wall_seconds(fn: Callable[[], object], repeats: int, device: torch.device,
                 after: Callable[[], object] | None = None) -> list[float]:
    """Wall seconds of each of `repeats` runs of `fn()`, the device synchronised before and after each;
    `after()` (untimed) runs after each one (e.g. cropping a cache back)."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return times

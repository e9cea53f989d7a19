"""Draft-step timing inside vLLM: how long its speculative proposer takes per step, for any draft model.

vLLM reports acceptance but not what drafting costs. With `HF_DYNASPEC_DRAFT_TIMES=PREFIX` in the environment,
`register()` (the plugin hook, run in every vLLM process) wraps the EAGLE proposer's `propose`
(`vllm/v1/spec_decode/llm_base_proposer.py`, `SpecDecodeBaseProposer.propose`: the draft model's forwards,
`compute_logits` and sampling of one speculative step) so that each process keeps its totals in
`PREFIX.<pid>.json`, rewritten after every call (vLLM may kill its workers at shutdown, before any exit hook).
It times vLLM's own draft class as well as the plugin's, so static exports and DynaSpec compare in one run
(`benchmarks/serving/vllm_bench.py`). Off (the default), nothing is wrapped.

    HF_DYNASPEC_DRAFT_TIMES=/tmp/draft python serve.py; python -c "from hf_dynaspec.vllm_plugin.timing import \
read_times; print(read_times('/tmp/draft'))"
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

ENV = "HF_DYNASPEC_DRAFT_TIMES"


def timed(method: Callable, prefix: str, synchronize: Callable[[], None] | None = None) -> Callable:
    """`method` with its calls counted and timed into `prefix.<pid>.json` ({"calls", "seconds"}).
    `synchronize` (an accelerator's) runs before the clock is read at the end, so queued work is counted."""
    totals = {"calls": 0, "seconds": 0.0}

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = method(*args, **kwargs)
        if synchronize is not None:
            synchronize()
        totals["calls"] += 1
        totals["seconds"] += time.perf_counter() - start
        path = Path(f"{prefix}.{os.getpid()}.json")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(totals))
        os.replace(tmp, path)  # a reader never sees half a file
        return out

    wrapper.draft_timer = True
    return wrapper


def read_times(prefix: str) -> dict[str, float]:
    """{"calls", "seconds"} summed over every process that wrote `prefix.<pid>.json`."""
    calls, seconds = 0, 0.0
    for file in Path(prefix).parent.glob(f"{Path(prefix).name}.*.json"):
        totals = json.loads(file.read_text())
        calls, seconds = calls + totals["calls"], seconds + totals["seconds"]
    return {"calls": calls, "seconds": seconds}


def install_draft_timer(proposer_class: type, prefix: str | None) -> bool:
    """Wrap `proposer_class.propose` once when `prefix` is given; whether it is wrapped now."""
    if not prefix:
        return False
    if not getattr(proposer_class.propose, "draft_timer", False):
        import torch

        sync = torch.cuda.synchronize if torch.cuda.is_available() else None
        proposer_class.propose = timed(proposer_class.propose, prefix, sync)
    return True

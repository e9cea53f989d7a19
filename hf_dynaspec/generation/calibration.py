"""Calibration: what the target's work costs on this machine, measured, never assumed.

- `measure_verify_costs`: how much a target forward over n tokens costs here, in decoding steps (the c(n) of
  `cost.py`), timing forwards shaped as verifications (4D mask, explicit positions, hidden states, walk logits
  as `verify.verify_forward` computes them); `verify_costs_for` turns the `verify_costs` setting into a model.
- `measure_walk_rows`: how many LM-head rows the verification pass computes at once on the CPU walk path: the
  most rows r <= 8 whose head product costs at most `tolerance` more than one row (BLAS streams the weights
  once for a few rows; how many, and whether it pays at all, depends on the machine and the head's shape).
Both are memoised per target, device, dtype and thread count.

    python -c "from hf_dynaspec.generation.calibration import measure_verify_costs; help(measure_verify_costs)"
"""

from __future__ import annotations

import statistics
import time
import weakref

import torch
from transformers import DynamicCache

from ..masks import target_masks
from .config import DraftSettings
from .cost import VerifyCosts
from .verify import crop_cache

CALIBRATION_CONTEXT = 128  # cached tokens under the timed forwards (the cost barely moves with context)
CALIBRATION_REPEATS = 3  # median of this many timed forwards per size
MAX_MEASURED = 32  # sizes timed by "auto"; beyond, c grows by its last step
MAX_WALK_ROWS = 8
WALK_ROWS_TOLERANCE = 0.15  # a row is "free" when r rows cost at most 15% more than one
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: costs}
_WALK_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: rows}


@torch.no_grad()
def measure_walk_rows(target: torch.nn.Module, max_rows: int = MAX_WALK_ROWS, repeats: int = 5,
                      tolerance: float = WALK_ROWS_TOLERANCE) -> int:
    """The most LM-head rows (1..max_rows) that cost at most (1 + tolerance) x one row here (median timings of
    the target's own output embedding, as the verification pass applies it). Memoised per target and setting."""
    key = (max_rows, str(target.device), target.dtype, torch.get_num_threads())
    memo = _WALK_ROWS.setdefault(target, {})
    if key not in memo:
        head = target.get_output_embeddings()
        hidden = torch.randn(max_rows, head.weight.shape[1], device=target.device, dtype=head.weight.dtype)
        head(hidden)  # warm-up
        seconds = [_median_seconds(lambda r=r: head(hidden[:r]), repeats, target.device)
                   for r in range(1, max_rows + 1)]
        memo[key] = max(r for r in range(1, max_rows + 1) if seconds[r - 1] <= (1 + tolerance) * seconds[0])
    return memo[key]


def _median_seconds(fn, repeats: int, device: torch.device, after=None) -> float:
    """Median wall time of `fn()` over `repeats` runs, synchronised on accelerators; `after()` (untimed) runs
    after each one (e.g. cropping a cache back)."""
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return statistics.median(times)


@torch.no_grad()
def time_forward(
    target: torch.nn.Module, cache: DynamicCache, context: int, n: int, repeats: int, walk_rows: int = 0
) -> float:
    """Median seconds of a target forward over n new tokens after `context` cached ones, shaped as a
    verification (4D mask, explicit positions, last hidden state; with `walk_rows` > 0 logits for the first
    `walk_rows` tokens only, as `verify_forward`). The cache is cropped back after each run."""
    device = target.device
    ids = torch.randint(0, target.config.get_text_config().vocab_size, (1, n), device=device)
    allowed = torch.ones(n, context + n, dtype=torch.bool, device=device).tril(diagonal=context)
    key_positions = torch.arange(context + n, device=device)
    mask = target_masks(target.config, allowed, key_positions[context:], key_positions, target.dtype)
    positions = key_positions[None, context:]  # (1, n)
    keep = {"logits_to_keep": torch.arange(min(n, walk_rows), device=device)} if walk_rows else {}

    def forward() -> None:
        target(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
               output_hidden_states=True, **keep)

    return _median_seconds(forward, repeats, device, after=lambda: crop_cache(cache, context))  # drop the n tokens


def measure_verify_costs(
    target: torch.nn.Module, max_tokens: int = 17, walk_rows: int | None = None
) -> VerifyCosts:
    """c(1..max_tokens) of `target` as it verifies here (same device, dtype, threads), relative to c(1);
    `walk_rows` as verification computes logits (default: `measure_walk_rows` on CPU, all rows elsewhere).
    Memoised per target and setting: the first call costs about 4 * max_tokens forwards. `.costs` is what
    `verify_costs=[...]` takes."""
    if walk_rows is None:
        walk_rows = measure_walk_rows(target) if target.device.type == "cpu" else 0
    key = (max_tokens, walk_rows, str(target.device), target.dtype, torch.get_num_threads())
    memo = _MEASURED.setdefault(target, {})
    if key not in memo:
        cache = DynamicCache()
        ids = torch.randint(0, target.config.get_text_config().vocab_size, (1, CALIBRATION_CONTEXT))
        with torch.no_grad():
            target(input_ids=ids.to(target.device), cache=cache, use_cache=True)
        time_forward(target, cache, CALIBRATION_CONTEXT, max_tokens, 1, walk_rows)  # warm-up
        seconds = [
            time_forward(target, cache, CALIBRATION_CONTEXT, n, CALIBRATION_REPEATS, walk_rows)
            for n in range(1, max_tokens + 1)
        ]
        # timing noise must not make a bigger forward look cheaper: c is made non-decreasing
        costs = [max(seconds[: n + 1]) / seconds[0] for n in range(len(seconds))]
        memo[key] = VerifyCosts(tuple(costs))
    return memo[key]


def verify_costs_for(settings: DraftSettings, target: torch.nn.Module, walk_rows: int) -> VerifyCosts | None:
    """The cost model of `settings.verify_costs` ("off": None; "auto": measured here, once per target)."""
    if settings.verify_costs == "off":
        return None
    if settings.verify_costs == "auto":
        largest = 1 + settings.num_draft_nodes + settings.lookup_num_tokens  # root + drafts + lookup branch
        return measure_verify_costs(target, min(largest, MAX_MEASURED), walk_rows)
    return VerifyCosts(settings.verify_costs)  # a tuple: resolve_draft_settings made it one


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)

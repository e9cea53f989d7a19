"""Calibration: how much a target forward over n tokens costs here, in decoding steps (the c(n) of `cost.py`).

`measure_verify_costs` times target forwards shaped as verifications (4D mask, explicit positions, hidden
states, walk logits as `verify.verify_forward` computes them) on this device, dtype and thread count, and
memoises the result per target; `verify_costs_for` turns the `verify_costs` setting into a cost model.

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
from .verify import WALK_ROWS, crop_cache

CALIBRATION_CONTEXT = 128  # cached tokens under the timed forwards (the cost barely moves with context)
CALIBRATION_REPEATS = 3  # median of this many timed forwards per size
MAX_MEASURED = 32  # sizes timed by "auto"; beyond, c grows by its last step
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: costs}


@torch.no_grad()
def time_forward(
    target: torch.nn.Module, cache: DynamicCache, context: int, n: int, repeats: int, walk_logits: bool = False
) -> float:
    """Median seconds of a target forward over n new tokens after `context` cached ones, shaped as a
    verification (4D mask, explicit positions, last hidden state; with `walk_logits` logits for the first
    `WALK_ROWS` tokens only, as `verify_forward`). The cache is cropped back after each run."""
    device = target.device
    ids = torch.randint(0, target.config.get_text_config().vocab_size, (1, n), device=device)
    allowed = torch.ones(n, context + n, dtype=torch.bool, device=device).tril(diagonal=context)
    key_positions = torch.arange(context + n, device=device)
    mask = target_masks(target.config, allowed, key_positions[context:], key_positions, target.dtype)
    positions = key_positions[None, context:]  # (1, n)
    keep = {"logits_to_keep": torch.arange(min(n, WALK_ROWS), device=device)} if walk_logits else {}
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        target(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
               output_hidden_states=True, **keep)
        _synchronize(device)
        times.append(time.perf_counter() - start)
        crop_cache(cache, context)  # drop the n tokens again
    return statistics.median(times)


def measure_verify_costs(
    target: torch.nn.Module, max_tokens: int = 17, walk_logits: bool | None = None
) -> VerifyCosts:
    """c(1..max_tokens) of `target` as it verifies here (same device, dtype, threads), relative to c(1);
    `walk_logits` as verification computes logits (default: on CPU). Memoised per target and setting: the
    first call costs about 4 * max_tokens forwards. `.costs` is what `verify_costs=[...]` takes."""
    if walk_logits is None:
        walk_logits = target.device.type == "cpu"
    key = (max_tokens, walk_logits, str(target.device), target.dtype, torch.get_num_threads())
    memo = _MEASURED.setdefault(target, {})
    if key not in memo:
        cache = DynamicCache()
        ids = torch.randint(0, target.config.get_text_config().vocab_size, (1, CALIBRATION_CONTEXT))
        with torch.no_grad():
            target(input_ids=ids.to(target.device), cache=cache, use_cache=True)
        time_forward(target, cache, CALIBRATION_CONTEXT, max_tokens, 1, walk_logits)  # warm-up
        seconds = [
            time_forward(target, cache, CALIBRATION_CONTEXT, n, CALIBRATION_REPEATS, walk_logits)
            for n in range(1, max_tokens + 1)
        ]
        # timing noise must not make a bigger forward look cheaper: c is made non-decreasing
        costs = [max(seconds[: n + 1]) / seconds[0] for n in range(len(seconds))]
        memo[key] = VerifyCosts(tuple(costs))
    return memo[key]


def verify_costs_for(settings: DraftSettings, target: torch.nn.Module, walk_logits: bool) -> VerifyCosts | None:
    """The cost model of `settings.verify_costs` ("off": None; "auto": measured here, once per target)."""
    if settings.verify_costs == "off":
        return None
    if settings.verify_costs == "auto":
        largest = 1 + settings.num_draft_nodes + settings.lookup_num_tokens  # root + drafts + lookup branch
        return measure_verify_costs(target, min(largest, MAX_MEASURED), walk_logits)
    return VerifyCosts(settings.verify_costs)  # a tuple: resolve_draft_settings made it one


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)

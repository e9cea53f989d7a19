"""Calibration: what the target's work costs on this machine, measured, never assumed.

- `measure_verify_costs`: how much a target forward over n tree tokens per row of a batch costs here, in
  decoding steps (the c(n) of `policy.py`), timing the verifier's own forward (`verifier.Verifier.forward` and
  its walk logits); `step_costs` gives the step policy its table.
- `walk_head_for`: which layout verification applies the LM head in (measured by `measure_walk_head`).
- `measure_walk_head`: how the CPU walk path applies the target's LM head (`walk_head.WalkHead`): in which
  weight layout, and how many rows the verification pass computes at once, from both layouts timed for 1..8
  rows (how BLAS fares with a few rows, and which layout it prefers, depends on the machine and the head's shape).
Both are kept on disk per target shape, dtype and machine (`measured`: the next process skips the timing) and
memoised per target, device, dtype and thread count.

    python -c "from hf_dynaspec.generation.planning.calibration import measure_verify_costs; help(measure_verify_costs)"
"""

from __future__ import annotations

import dataclasses
import statistics
import weakref

import torch
from transformers import DynamicCache

from ...generation_config import DraftSettings
from ..drafting.tree import lookup_tree
from ..loop.syncs import wall_seconds
from ..verification.cache import KeyLayout, crop_cache
from ..verification.head_learner import HeadLearner, learner_key
from ..verification.head_times import HeadTimes
from ..verification.verifier import Verifier
from ..verification.walk_head import HEADS, LAYOUTS, WalkHead, choose_walk_head, head_class
from . import measured
from .policy import VerifyCosts, are_positive_costs, batch_bucket

CALIBRATION_CONTEXT = 128  # cached tokens under the timed forwards (the cost barely moves with context)
CALIBRATION_REPEATS = 3  # median of this many timed forwards per size
WALK_REPEATS = 3  # median of this many timed head applications per row count and layout
QUICK_SIZES = (1, 2, 4, 8)  # a cold first call times these sizes and the largest one (`quick_sizes`)
QUICK_REPEATS = 2
MAX_MEASURED = 32  # sizes timed by "auto"; beyond, c grows by its last step
MAX_WALK_ROWS = 8
EXPECTED_WALK = 3  # rows a step's walk reads (accepted drafts + bonus token), the prior behind the rows at once
PREFILTER_SAFETY = 0.5  # the prefilter is used where its bf16 error reaches at most half its bound (prefilter.py)
COLUMNS_MARGIN = 0.9  # the "columns" layout's weight copy must make the walk at least 10% cheaper
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: costs}
_WALK_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: WalkHead}
_LAYOUT_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(layout, weights): WalkHead}
_HEAD_TIMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(layout, threads): HeadTimes}
_LEARNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {setting: HeadLearner}


@torch.no_grad()
def measure_walk_head(target: torch.nn.Module, max_rows: int = MAX_WALK_ROWS, repeats: int = WALK_REPEATS,
                      walk: int = EXPECTED_WALK, columns_margin: float = COLUMNS_MARGIN,
                      layouts: tuple[str, ...] = ("rows", "columns"), batch: int = 1) -> WalkHead:
    """The target's head in the layout of `layouts`, and with the rows at once, that make the walks of `batch`
    rows of `walk` rows each cheapest here (median timings of 1..max_rows rows in each layout, of its logits or,
    "prefilter", its greedy picks; a batch applies the head once to every row's rows, `walk_head.choose_walk_head`).
    The timings are kept on disk per target shape and machine (`measured`); the choice is memoised per target,
    setting and head weights, and a layout's copy of the weights is made once for all of them (`layout_head`; an
    in-place update of the weights makes it anew)."""
    unknown = [layout for layout in layouts if layout not in LAYOUTS]
    if unknown or not layouts:
        raise ValueError(f"layouts must be some of {LAYOUTS}, got {layouts!r}.")
    weights = head_weights(target)
    key = (max_rows, walk, batch, columns_margin, tuple(layouts), str(target.device), target.dtype,
           torch.get_num_threads(), weights)
    memo = _WALK_HEADS.setdefault(target, {})
    if key not in memo:
        if any(old[-1] != weights for old in memo):
            memo.clear()  # an older key holds a stale copy of the weights
        seconds = walk_head_seconds(target, layouts, max_rows, repeats, untimed_ok=len(layouts) > 1)
        memo[key] = (exact_walk_head(target, seconds, walk, columns_margin, batch) if seconds is not None
                     else default_walk_head(target, layouts, walk))
    return memo[key]


def default_walk_head(target: torch.nn.Module, layouts: tuple[str, ...], walk: int) -> WalkHead:
    """The head a cold first call uses without timing a layout: the model's own ("rows"), `walk` rows at once."""
    layout = "rows" if "rows" in layouts else layouts[0]
    return WalkHead.of(target, rows=walk, layout=layout)


def walk_head_seconds(target: torch.nn.Module, layouts: tuple[str, ...], max_rows: int, repeats: int,
                      untimed_ok: bool = False) -> dict[str, tuple[float, ...]] | None:
    """Median seconds of 1..max_rows rows through the head in each layout: from disk when this target shape and
    machine were timed before (`measured`), else timed now and stored; None (not timed) where `untimed_ok` and
    the call is cold (`measured.thorough()` is False: the default, measure-as-you-go mode)."""
    stored_key = measured.measurement_key(target, "walk_head", dict(layouts=list(layouts), max_rows=max_rows,
                                                                    repeats=repeats))
    stored = measured.load(stored_key)
    if isinstance(stored, dict) and set(stored) == set(layouts):
        return {layout: tuple(stored[layout]) for layout in layouts}
    if untimed_ok and not measured.thorough():
        return None
    weight = target.get_output_embeddings().weight
    hidden = torch.randn(max_rows, weight.shape[1], device=target.device, dtype=weight.dtype)
    seconds = {}
    for layout in layouts:
        head = WalkHead.of(target, layout=layout)
        apply = head.argmax if head.greedy_only else head  # its picks, or its logits
        apply(hidden)  # warm-up
        seconds[layout] = tuple(_median_seconds(lambda r=r, f=apply: f(hidden[:r]), repeats, target.device)
                                for r in range(1, max_rows + 1))
    measured.save(stored_key, {k: list(v) for k, v in seconds.items()},
                  f"walk head timings of {type(target).__name__}, {target.dtype}, 1..{max_rows} rows per layout")
    return seconds


def exact_walk_head(target: torch.nn.Module, seconds: dict[str, tuple[float, ...]], walk: int,
                    columns_margin: float, batch: int = 1) -> WalkHead:
    """The cheapest layout of `seconds` for `batch` rows (`choose_walk_head`), its copy made (`layout_head`); the
    "prefilter" one only where this machine's bf16 GEMM stays within the bound its exactness rests on (else the next
    cheapest)."""
    seconds = dict(seconds)
    while True:
        layout, rows = choose_walk_head(seconds, walk, columns_margin, batch)
        head = exact_layout_head(target, layout)
        if head is not None:
            return dataclasses.replace(head, rows=rows, seconds=seconds)
        if len(seconds) == 1:
            raise ValueError(f"verify_head={layout!r}: this machine's bf16 GEMM errs beyond the bound the "
                             "prefilter's exactness rests on (not fp32 accumulation?). Use 'auto'.")
        del seconds[layout]  # not exact here: left out


def layout_head(target: torch.nn.Module, layout: str) -> WalkHead:
    """The target's head in `layout`, its copy of the weights ("columns": transposed; "prefilter": bf16) made once
    per process and head weights: every choice of that layout (each batch size, greedy or not) shares it."""
    weights = head_weights(target)
    heads = _LAYOUT_HEADS.setdefault(target, {})
    if (layout, weights) not in heads:
        for stale in [key for key in heads if key[1] != weights]:
            del heads[stale]
        heads[(layout, weights)] = WalkHead.of(target, layout=layout)
    return heads[(layout, weights)]


def head_weights(target: torch.nn.Module) -> tuple[int, int]:
    """Which head weights a layout's copy is made from (their storage and in-place version): the memos of heads
    holding copies drop those made from other weights."""
    weight = target.get_output_embeddings().weight
    return weight.data_ptr(), weight._version


def head_times(target: torch.nn.Module, walk_head: WalkHead | None) -> HeadTimes | None:
    """The seconds of `walk_head` over r gathered rows (`head_times.HeadTimes`: each grid count timed when first
    asked, kept on disk), one per target, layout and thread count; None without a walk head or for a layout that
    makes greedy picks (its cost depends on the rows' values)."""
    if walk_head is None or walk_head.greedy_only:
        return None
    memo = _HEAD_TIMES.setdefault(target, {})
    key = (walk_head.layout, torch.get_num_threads())
    if key not in memo:
        memo[key] = HeadTimes.of(target, walk_head)
    return memo[key]


def measured_walk_heads(target: torch.nn.Module) -> list[str]:
    """The walk heads measured for `target` in this process, as "layout (r rows at once; of the layouts timed)",
    and what its layout learners chose per walk row count ("learned: prefilter at 1 row, ...")."""
    heads = [f"{head.layout} ({head.rows} rows at once; " + (f"of {' / '.join(head.seconds)})" if head.seconds
                                                              else "not timed: a cold call's default)")
             for head in _WALK_HEADS.get(target, {}).values()]
    for learner in _LEARNERS.get(target, {}).values():
        buckets = sorted({bucket for _, bucket in learner.samples})
        if buckets:
            heads.append("learned: " + ", ".join(f"{learner.choice(b)} at {b} rows" for b in buckets))
    return heads


def _median_seconds(fn, repeats: int, device: torch.device, after=None) -> float:
    """Median wall time of `fn()` over `repeats` runs (`syncs.wall_seconds`: synchronised on accelerators, `after()`
    untimed after each one)."""
    return statistics.median(wall_seconds(fn, repeats, device, after))


@torch.no_grad()
def time_forward(
    target: torch.nn.Module, cache: DynamicCache, context: int, n: int, repeats: int,
    walk_head: WalkHead | None = None, batch: int = 1,
) -> float:
    """Median seconds of the verifier's own forward (`Verifier.forward`, then its walk logits) over a chain of n
    nodes per row for `batch` rows after `context` cached ones. The cache is cropped back after each run.

    The "prefilter" layout's picks cost what its rescoring finds to rescore, which depends on how peaked the
    logits are: the hidden states of random tokens are far flatter than a real context's and leave thousands of
    candidates. So its rows are not timed on them: the forward is timed without them and the layout's own timing
    of those rows (`walk_head.seconds`, measured on a fixed input, or timed here on one) is added per row."""
    device = target.device
    tokens = torch.randint(0, target.config.get_text_config().vocab_size, (n,)).tolist()
    trees = [lookup_tree(tokens[0], tokens[1:])] * batch  # a chain of n nodes per row
    verifier = Verifier(target, cache, KeyLayout.dense(batch, context, device), walk_head,
                        head_times=head_times(target, walk_head))
    walk_rows = verifier.walk_rows(trees)
    greedy_rows = walk_head is not None and walk_head.greedy_only
    picks_seconds = batch * greedy_pick_seconds(target, walk_head, len(walk_rows[0]), repeats) if greedy_rows else 0.0

    def forward() -> None:
        out = verifier.forward(trees, walk_rows)
        if walk_head is not None and not greedy_rows:
            verifier.node_logits(out, trees, walk_rows)  # the walk rows' logits, as verification reads them

    seconds = _median_seconds(forward, repeats, device, after=lambda: crop_cache(cache, context))  # drop the n tokens
    return seconds + picks_seconds


def greedy_pick_seconds(target: torch.nn.Module, walk_head: WalkHead, rows: int, repeats: int) -> float:
    """Seconds of `rows` greedy picks in `walk_head`'s layout: its measured timing (`walk_head_seconds`, on a
    fixed random input), else timed here on one (0 rows: 0)."""
    if rows == 0:
        return 0.0
    measured_rows = walk_head.seconds.get(walk_head.layout, ())
    if len(measured_rows) >= rows:
        return measured_rows[rows - 1]
    weight = target.get_output_embeddings().weight
    hidden = torch.randn(rows, weight.shape[1], device=target.device, dtype=weight.dtype,
                         generator=torch.Generator(device=target.device).manual_seed(0))
    return _median_seconds(lambda: walk_head.argmax(hidden), repeats, target.device)


def measure_verify_costs(
    target: torch.nn.Module, max_tokens: int = 17, walk_head: WalkHead | None | str = "auto", batch: int = 1,
) -> VerifyCosts:
    """c(1..max_tokens) of `target` as it verifies `batch` rows here (same device, dtype, threads): a forward over
    n tree tokens per row, relative to c(1) (one plain batched step); `walk_head` as verification computes
    logits ("auto": `measure_walk_head` on CPU, all rows elsewhere). Forwards over `timed_sizes` tokens are timed
    (c linear between them); kept on disk per target shape, batch size and machine (`measured`) and memoised per
    target and setting."""
    if walk_head == "auto":
        walk_head = measure_walk_head(target) if target.device.type == "cpu" else None
    walk = (walk_head.layout, walk_head.rows) if walk_head else None
    key = (max_tokens, walk, str(target.device), target.dtype, torch.get_num_threads(), batch)
    memo = _MEASURED.setdefault(target, {})
    if key not in memo:
        memo[key] = VerifyCosts(tuple(_stored_or_timed_costs(target, max_tokens, walk_head, batch)))
    return memo[key]


def _stored_or_timed_costs(target: torch.nn.Module, max_tokens: int, walk_head: WalkHead | None, batch: int
                           ) -> list[float]:
    """c(1..max_tokens) from disk (a full measurement before a quick one), else timed: in full (`timed_sizes`,
    CALIBRATION_REPEATS each) when `measured.thorough()`, else quickly (`quick_sizes`, QUICK_REPEATS each: a cold
    first call), and stored under its own key."""
    walk = (walk_head.layout, walk_head.rows) if walk_head else None
    keys = {quick: measured.measurement_key(target, "verify_costs", dict(
        max_tokens=max_tokens, walk=walk, context=CALIBRATION_CONTEXT,
        repeats=QUICK_REPEATS if quick else CALIBRATION_REPEATS, quick=quick,
        greedy_picks="timed apart", **({"batch": batch, "rows_read": "walk or every node"} if batch > 1 else {})))
        for quick in (False, True)}  # how "prefilter" rows enter c(n) (`time_forward`); which rows a batch reads
    for quick in (False, True):
        stored = measured.load(keys[quick])
        if are_positive_costs(stored) and len(stored) == max_tokens:
            return stored
    quick = not measured.thorough()
    sizes = quick_sizes(max_tokens) if quick else timed_sizes(max_tokens)
    costs = _time_verify_costs(target, max_tokens, walk_head, sizes, QUICK_REPEATS if quick else CALIBRATION_REPEATS,
                               batch)
    measured.save(keys[quick], costs, f"verify costs c(1..{max_tokens}) of {type(target).__name__}, {target.dtype}, "
                  f"batch {batch}, walk head {walk}, {'quick: sizes ' + str(sizes) if quick else 'full'}")
    return costs


def quick_sizes(max_tokens: int) -> list[int]:
    """The forward sizes a cold first call times: QUICK_SIZES below max_tokens, then max_tokens."""
    return [*(n for n in QUICK_SIZES if n < max_tokens), max_tokens]


def timed_sizes(max_tokens: int) -> list[int]:
    """The forward sizes timed for c(1..max_tokens): every size up to 6, then about a third apart."""
    sizes, n = [], 1
    while n < max_tokens:
        sizes.append(n)
        n = n + 1 if n < 6 else max(n + 1, round(n * 1.33))
    return [*sizes, max_tokens]


def _time_verify_costs(target: torch.nn.Module, max_tokens: int, walk_head: WalkHead | None, sizes: list[int],
                       repeats: int, batch: int = 1) -> list[float]:
    """c(1..max_tokens): forwards of `sizes` (ascending, 1 and max_tokens among them) timed `repeats` times after
    CALIBRATION_CONTEXT cached tokens, the rest interpolated linearly, made non-decreasing from above: each size
    costs at most what any bigger one was timed at (noise only ever adds time, so a burst of load during one
    size's timing must not raise every size above it, as a running maximum would)."""
    cache = DynamicCache()
    ids = torch.randint(0, target.config.get_text_config().vocab_size, (batch, CALIBRATION_CONTEXT))
    with torch.no_grad():
        target(input_ids=ids.to(target.device), cache=cache, use_cache=True)
    time_forward(target, cache, CALIBRATION_CONTEXT, max_tokens, 1, walk_head, batch)  # warm-up
    timed = [time_forward(target, cache, CALIBRATION_CONTEXT, n, repeats, walk_head, batch) for n in sizes]
    seconds = []
    for n in range(1, max_tokens + 1):
        right = next(i for i, size in enumerate(sizes) if size >= n)
        if sizes[right] == n:
            seconds.append(timed[right])
        else:  # between sizes[right - 1] and sizes[right]
            share = (n - sizes[right - 1]) / (sizes[right] - sizes[right - 1])
            seconds.append(timed[right - 1] + share * (timed[right] - timed[right - 1]))
    floor = [min(seconds[n:]) for n in range(len(seconds))]  # non-decreasing
    return [value / floor[0] for value in floor]


def step_costs(settings: DraftSettings, target: torch.nn.Module, walk_head: WalkHead | None, batch: int = 1
               ) -> VerifyCosts | None:
    """The verification costs the step policy plans with at `batch` rows (None with `step_policy="off"`):
    c(1..n) for the largest tree the settings allow (root + drafts + lookup branch, MAX_MEASURED at most),
    measured at the power of two at or above `batch` (a few sizes cover every batch)."""
    if settings.step_policy == "off":
        return None
    largest = 1 + settings.num_draft_nodes + settings.lookup_num_tokens
    return measure_verify_costs(target, min(largest, MAX_MEASURED), walk_head, batch_bucket(batch))


def walk_head_for(target: torch.nn.Module, wanted: str, greedy_only: bool, hidden: torch.Tensor, raw: torch.Tensor,
                  batch: int = 1) -> tuple[WalkHead | None, HeadLearner | None]:
    """How verification applies the target's LM head to `batch` rows (None: every node's logits in the
    verification pass), and, for "auto" on the walk path, the learner that picks each step's layout.

    On a CPU the head's cost grows with its rows: "auto" applies it only along the walk, in the layout that is
    cheapest here, learned from the call's own verifications (`head_learner.HeadLearner`: from what an earlier
    process learned, else from the model's own layout, or a full timing where one was taken: `measure_walk_head`),
    the greedy-only "prefilter" among the layouts when `greedy_only` (no sampling, logits processors or kept
    scores) and the head qualifies; a target whose logits its head does not reproduce from the final hidden state
    (1, d) (`raw` (1, V): unknown post-processing) verifies with full logits. A named layout is used as asked (no
    learner), or refused with the reason."""
    if wanted == "full":
        return None, None
    walk_path = (target.device.type == "cpu" and target.get_output_embeddings() is not None
                 and target._supports_logits_to_keep())
    if not walk_path:
        if wanted == "auto":
            return None, None
        raise ValueError(f"verify_head={wanted!r} applies the LM head along the walk, for a CPU target whose model "
                         f"takes `logits_to_keep`; this one runs on {target.device.type!r}. Use 'auto' or 'full'.")
    if wanted == "auto":
        layouts = tuple(name for name, head in HEADS.items() if head.blocker(target, greedy_only) is None)
    else:
        blocker = head_class(wanted).blocker(target, greedy_only)
        if blocker is not None:
            raise ValueError(f"verify_head={wanted!r} cannot apply: {blocker}. Use 'auto' or another layout.")
        layouts = (wanted,)
    walk_head = measure_walk_head(target, layouts=layouts, batch=batch)
    if walk_head.reproduces(hidden, raw):
        if wanted != "auto":
            return walk_head, None
        return walk_head, head_learner(target, layouts, walk_head)  # the verifier asks it at every step
    if wanted != "auto":
        raise ValueError(f"verify_head={wanted!r}: this target's logits are not its LM head's output (post-processing"
                         " the walk head does not know). Use 'full' or 'auto'.")
    return None, None


def head_learner(target: torch.nn.Module, layouts: tuple[str, ...], start: WalkHead) -> HeadLearner:
    """The learner of `target`'s walk head layout among `layouts` (`start`'s layout first, its rows at once for
    all), one per process, target, layouts and head weights (its heads hold copies of the weights), starting from
    what is kept on disk."""
    weights = head_weights(target)
    ordered = (start.layout, *(layout for layout in layouts if layout != start.layout))
    key = (ordered, start.rows, torch.get_num_threads(), weights)
    memo = _LEARNERS.setdefault(target, {})
    if key not in memo:
        for stale in [old for old in memo if old[-1] != weights]:
            del memo[stale]
        memo[key] = HeadLearner.of(ordered, lambda layout: exact_layout_head(target, layout), start.rows,
                                   learner_key(target, tuple(sorted(layouts)), start.rows))
    return memo[key]


def forget_learners() -> None:
    """Drop every target's layout learner in this process (the next call starts from what is kept on disk)."""
    _LEARNERS.clear()


def exact_layout_head(target: torch.nn.Module, layout: str) -> WalkHead | None:
    """`layout_head`, or None where its picks are not exact on this machine (the prefilter's bf16 GEMM erring
    beyond `PREFILTER_SAFETY` of the bound its exactness rests on, on random hidden states)."""
    head = layout_head(target, layout)
    weight = target.get_output_embeddings().weight
    hidden = torch.randn(MAX_WALK_ROWS, weight.shape[1], device=target.device, dtype=weight.dtype)
    return head if head.error_over_bound(hidden) < PREFILTER_SAFETY else None

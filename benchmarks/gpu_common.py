"""What every section of the GPU suite shares (`benchmarks/gpu_suite.py`): the package import (guarded: a
section that needs no package still runs when it fails), the shapes, the plan of each run (FULL on the
GPU, QUICK on a CPU), the run context and small helpers (timing, random models, prompts).

    python -c "import sys; sys.path.insert(0, 'benchmarks'); import gpu_common as g; print(g.QUICK)"
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a source checkout
if "--triton-interpret" in sys.argv[1:]:  # triton reads it when first imported (importing hf_dynaspec does)
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "") == "1"

# The package's names the sections use, imported here once. A transformers release the hook refuses must not
# cost the sections that need no package: they are None then, and `require_package` says why.
try:
    import hf_dynaspec  # noqa: F401  (installs the generate() hook)
    from hf_dynaspec import DynaSpecConfig, DynaSpecDrafter, DynaSpecGenerationConfig  # noqa: F401
    from hf_dynaspec import modeling as dynaspec_modeling  # noqa: F401
    from hf_dynaspec.clustering import VocabClusters  # noqa: F401
    from hf_dynaspec.generation.loop import decoding  # noqa: F401
    from hf_dynaspec.generation.loop.syncs import HostSyncCounter  # noqa: F401
    from hf_dynaspec.generation.verification.cache import crop_cache  # noqa: F401
    from hf_dynaspec.masks import target_masks  # noqa: F401

    PACKAGE_ERROR: str | None = None
except Exception as err:  # noqa: BLE001
    PACKAGE_ERROR = f"import hf_dynaspec failed: {type(err).__name__}: {err}"
    DynaSpecConfig = DynaSpecDrafter = DynaSpecGenerationConfig = dynaspec_modeling = VocabClusters = None
    decoding = HostSyncCounter = crop_cache = target_masks = None

SECTIONS = ("head", "verify", "drafter", "steps", "exactness", "syncs", "trees", "batch")
TIMED_HEAD_MODES = ("full", "static", "dynamic", "dynamic-lanes")  # "-lanes": the fixed-shape shortlist layout
# How drafting runs: through the host (the union shortlist layout, each expansion read to pick the next) or on the
# device (fixed-shape lanes and tree growth: the tree read once); CUDA's default is "device"
DRAFTING = {"host": dict(shortlist_layout="union", tree_growth="host"),
            "device": dict(shortlist_layout="lanes", tree_growth="device")}


def head_mode_and_layout(mode: str) -> tuple[str, str]:
    """("dynamic", "lanes") for "dynamic-lanes"; (mode, "union") otherwise."""
    head_mode, _, layout = mode.partition("-")
    return head_mode, layout or "union"
COLD_CACHE_BYTES = 256 * 2**20
ROUTER_PLACEMENTS = ("beside", "sequential")

# Random targets (Llama fields unless a family says otherwise); eos/pad None: generation runs to max_new_tokens.
BASE_FIELDS = dict(max_position_embeddings=8192, bos_token_id=0, eos_token_id=None, pad_token_id=None,
                   tie_word_embeddings=False)
LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256)
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256)
QUICK_SMOLLM2 = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=512, tie_word_embeddings=True)
GEMMA3_270M = dict(hidden_size=640, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                   intermediate_size=2048, vocab_size=262144)
QUICK_GEMMA3 = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    intermediate_size=128, vocab_size=2048)
QUICK_LLAMA = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=256, vocab_size=1024)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
# default: the drafter's own tree for the device (a fresh drafter's on CUDA: DEFAULT_DEVICE_TREES["cuda"])
TREES = {"default": {}, "cpu-tree": {"num_draft_nodes": 12, "draft_depth": 5, "draft_top_k": 4}}


@dataclass(frozen=True)
class Plan:
    """The sizes of every section: FULL for the GPU run, QUICK for a CPU smoke run."""

    head_vocab: tuple[int, ...]
    head_dims: tuple[int, ...]
    head_shares: tuple[float, ...]  # shortlist size / V
    head_rows: tuple[int, ...]
    repeats: int
    warmup: int
    verify_model: dict[str, Any]
    verify_contexts: tuple[int, ...]
    verify_nodes: tuple[int, ...]
    drafter_targets: dict[str, dict[str, Any]]
    drafter_rows: tuple[int, ...]
    drafter_context: int
    step_targets: dict[str, dict[str, Any]]  # the "steps" section's shapes (eager and graphed draft steps)
    num_clusters: int
    exact_targets: dict[str, tuple[str, dict[str, Any]]]  # name -> (family, config fields)
    prompts: int
    prompt_length: int
    new_tokens: int
    sync_targets: tuple[str, ...]
    tune_cases: tuple[tuple[int, int, float], ...]  # (V, d, share) swept over TUNE_CONFIGS at tune_rows rows
    tune_rows: int
    tune_configs: tuple[tuple[int, int, int, int], ...]  # (block_s, block_k, num_warps, num_stages)
    step_context: int  # prompt tokens before the timed steps of the trees section
    step_tokens: int  # tokens generated per timed call there
    batch_sizes: tuple[int, ...]  # the batch section's B (SmolLM2-shaped random target)
    batch_tokens: int  # new tokens per row there
    trees: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(TREES))


FULL = Plan(
    head_vocab=(49152, 128256, 262144), head_dims=(576, 4096), head_shares=(0.02, 0.05, 0.125),
    head_rows=(1, 8, 64), repeats=20, warmup=5,
    verify_model=LLAMA_8B, verify_contexts=(512, 2048), verify_nodes=(1, 2, 4, 8, 16, 32, 48, 64),
    drafter_targets={"smollm2": SMOLLM2, "llama3-8b": LLAMA_8B}, drafter_rows=(1, 8, 32), drafter_context=512,
    step_targets={"smollm2": SMOLLM2, "llama3-8b": LLAMA_8B, "gemma3-270m": GEMMA3_270M},
    num_clusters=64,
    exact_targets={"tiny-llama": ("llama", TINY), "tiny-qwen2": ("qwen2", TINY), "smollm2": ("llama", SMOLLM2)},
    prompts=3, prompt_length=24, new_tokens=48, sync_targets=("tiny-llama", "smollm2"),
    tune_cases=((262144, 4096, 0.05), (262144, 4096, 0.125), (128256, 4096, 0.05), (262144, 576, 0.05)),
    tune_rows=64,
    tune_configs=tuple((bs, bk, w, st) for bs in (64, 128, 256) for bk in (64, 128) for w in (4, 8)
                       for st in (2, 3, 4)),
    step_context=512, step_tokens=33, batch_sizes=(1, 2, 4, 8, 16, 32), batch_tokens=48,
)
QUICK = Plan(
    head_vocab=(1024, 4096), head_dims=(64,), head_shares=(0.02, 0.05, 0.125), head_rows=(1, 8),
    repeats=3, warmup=1,
    verify_model=QUICK_LLAMA, verify_contexts=(16, 32), verify_nodes=(1, 2, 4, 8),
    drafter_targets={"smollm2": QUICK_SMOLLM2, "llama3-8b": QUICK_LLAMA}, drafter_rows=(1, 4), drafter_context=16,
    step_targets={"smollm2": QUICK_SMOLLM2, "llama3-8b": QUICK_LLAMA, "gemma3-270m": QUICK_GEMMA3},
    num_clusters=8,
    exact_targets={"tiny-llama": ("llama", TINY), "tiny-qwen2": ("qwen2", TINY), "smollm2": ("llama", QUICK_SMOLLM2)},
    prompts=2, prompt_length=8, new_tokens=12, sync_targets=("tiny-llama", "smollm2"),
    tune_cases=((1024, 64, 0.125),), tune_rows=8, tune_configs=((16, 16, 4, 2), (32, 32, 4, 3)),
    step_context=16, step_tokens=5, batch_sizes=(1, 3), batch_tokens=6,
)


@dataclass
class Context:
    """What every section reads: the arguments, the plan, the device and dtype; `notes` collect caveats."""

    args: argparse.Namespace
    plan: Plan
    device: torch.device
    dtype: torch.dtype
    notes: list[str] = field(default_factory=list)

    def time_ms(self, fn: Callable[[], object], reset: Callable[[], object] | None = None) -> float:
        return time_ms(fn, self.device, self.plan.repeats, self.plan.warmup, reset)

    def time_cold_ms(self, fn: Callable[[], object]) -> float:
        """`time_ms` with the GPU's L2 cache flushed before every call (as in decoding, where the whole target
        runs between two head calls): a write of COLD_CACHE_BYTES (H200 L2: 60 MB), untimed."""
        if self.device.type != "cuda":
            return self.time_ms(fn)
        scratch = torch.empty(COLD_CACHE_BYTES, dtype=torch.uint8, device=self.device)
        return self.time_ms(fn, reset=scratch.zero_)


# ---------------------------------------------------------------------------------------------- helpers


def time_ms(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int,
    reset: Callable[[], object] | None = None,
) -> float:
    """Median milliseconds of `fn` after `warmup` untimed calls: CUDA events on a GPU (read after one final
    synchronisation), perf_counter with synchronisation elsewhere. `reset` runs after every call, untimed."""
    for _ in range(warmup):
        fn()
        if reset is not None:
            reset()
    times: list[float] = []
    events: list[tuple[Any, Any]] = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        else:
            began = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - began))
        if reset is not None:
            reset()
    if events:
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) for start, end in events]
    return statistics.median(times)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def random_model(family: str, fields: dict[str, Any], dtype: torch.dtype, device: torch.device,
                 seed: int = 0) -> torch.nn.Module:
    """A random-weight causal LM built straight on `device` in `dtype` (no download, no fp32 copy)."""
    config_name, model_name = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**BASE_FIELDS, **fields})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        model = getattr(transformers, model_name)(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def head_only_target(fields: dict[str, Any], dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A Llama target on the meta device with only its embeddings and LM head materialised (random): enough to
    bind a drafter to, at any size."""
    config = transformers.LlamaConfig(**{**BASE_FIELDS, **fields, "tie_word_embeddings": False})
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        target = transformers.LlamaForCausalLM(config)
    for module in (target.get_input_embeddings(), target.get_output_embeddings()):
        module.to_empty(device=device).to(dtype)
        torch.nn.init.normal_(module.weight, std=0.02)
    return target.eval()


def check_cache_length(cache: DynamicCache, expected: int) -> None:
    """Refuse to time on a cache the model did not fill (a `cache=` keyword the model silently ignored)."""
    if cache.get_seq_length() != expected:
        raise RuntimeError(f"the KV cache holds {cache.get_seq_length()} tokens after filling {expected}: the "
                           f"model ignored its cache argument (transformers {transformers.__version__})")


def prompt_ids(index: int, length: int, vocab: int, device: torch.device) -> torch.Tensor:
    """(1, length) random tokens; odd prompts repeat their first half (so the lookup branch has work)."""
    gen = torch.Generator().manual_seed(1000 + index)
    ids = torch.randint(3, vocab, (1, length), generator=gen)
    if index % 2:
        half = ids[:, : length // 2]
        ids = torch.cat([half, half, ids[:, : length - 2 * half.shape[1]]], dim=1)
    return ids.to(device)


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def require_package() -> None:
    if PACKAGE_ERROR is not None:
        raise RuntimeError(PACKAGE_ERROR)


def progress(total: int, name: str) -> tqdm:
    return tqdm(total=total, desc=name, unit="case", file=sys.stderr, dynamic_ncols=True)

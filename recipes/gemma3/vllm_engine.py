"""The corpus stages' answer engines: transformers' `generate`, or greedy continuations from vLLM's CPU build
(the `continue_batch` of `write_answers`), chosen by `--engine` (`answer_engine`).

The corpus answers are generated in segments (`answers_until_loop`: an answer leaves the queue at its end-of-
sequence token, its length cap, or where it starts repeating itself). transformers' `generate` pads each batch and
re-reads every unfinished answer per segment; vLLM batches the whole queue continuously and keeps the prefixes it
has read (prefix caching), so the same greedy answers cost less CPU. It runs in the serving benchmark's vLLM
environment (`benchmarks/serving/run.sh` builds it) on the target saved as a Hugging Face folder
(`benchmarks/serving/save_target.py`); its bfloat16 kernels are not transformers', so an answer may part from
transformers' greedy one where two tokens nearly tie: both are the target's own greedy text (self-distillation).

    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv-vllm/bin/python recipes/gemma3/multilingual.py answer --engine vllm \\
        --engine-model /tmp/hf-dynaspec-serving/gemma3
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Continue = Callable[[list[list[int]], int], list[torch.Tensor]]


def engine_eos_ids(folder: str | Path) -> set[int]:
    """The end-of-sequence ids of a saved target: its generation config's, else its config's."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return set(eos) if isinstance(eos, list) else {eos}
    raise ValueError(f"{folder} names no eos_token_id: save the target with benchmarks/serving/save_target.py.")


def load_engine(folder: str | Path, dtype: str = "bfloat16", max_model_len: int = 2048) -> Any:
    """vLLM's `LLM` on a saved target, prefix caching on (continued answers re-read their prefix)."""
    from vllm import LLM

    return LLM(model=str(folder), dtype=dtype, max_model_len=max_model_len, seed=0, enable_prefix_caching=True,
               enforce_eager=True)


def engine_continuation(load_llm: Callable[[], Any], eos_ids: set[int]) -> Continue:
    """`continue_batch(contexts, steps)`: each context's greedy continuation of at most `steps` tokens, ending with
    its end-of-sequence token when it stopped at one (as `answer_batch` keeps it). The engine is `load_llm()`,
    started on the first call: a stage with nothing left to answer (a rerun resuming) never starts it."""
    from vllm import SamplingParams

    engine = functools.cache(load_llm)

    def continue_batch(contexts: list[list[int]], steps: int) -> list[torch.Tensor]:
        params = SamplingParams(temperature=0.0, max_tokens=steps, stop_token_ids=sorted(eos_ids))
        outs = engine().generate([{"prompt_token_ids": ids} for ids in contexts], params, use_tqdm=False)
        return [torch.tensor(with_eos(o.outputs[0], eos_ids), dtype=torch.long) for o in outs]

    return continue_batch


def with_eos(output: Any, eos_ids: set[int]) -> list[int]:
    """An output's token ids, its stop token appended when vLLM stopped at one without returning it."""
    ids = list(output.token_ids)
    if output.finish_reason == "stop" and (not ids or ids[-1] not in eos_ids):
        stop = output.stop_reason if isinstance(output.stop_reason, int) else min(eos_ids)
        ids.append(stop)
    return ids


ENGINE_MODEL = "/tmp/hf-dynaspec-serving/gemma3"  # where benchmarks/serving/save_target.py gemma3 writes it


def add_engine_arguments(parser: Any) -> None:
    """--engine / --engine-model, for the corpus stages that answer prompts."""
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                        help="what generates the answers: vllm runs in vLLM's environment (vllm_engine.py)")
    parser.add_argument("--engine-model", default=ENGINE_MODEL,
                        help="--engine vllm: the target as a Hugging Face folder (benchmarks/serving/save_target.py)")


def answer_engine(engine: str, engine_model: str | Path, batch_size: int, segment: int) -> tuple[Any, Any, dict]:
    """(the target or None, its tokenizer, the `write_answers` keywords) for `--engine`: transformers' `generate`
    over batches of `batch_size` in segments of `segment` tokens, or vLLM (`engine_answers`)."""
    if engine == "vllm":
        tokenizer, options = engine_answers(engine_model)
        return None, tokenizer, options
    from hf_dynaspec.targets import load_target

    model, tokenizer = load_target("gemma3", dtype=torch.bfloat16)
    return model, tokenizer, dict(batch_size=batch_size, segment=segment)


def engine_answers(folder: str | Path) -> tuple[Any, dict[str, Any]]:
    """(the saved target's tokenizer, the `write_answers` keywords that make vLLM generate): every shard's queue
    is one batch vLLM schedules itself, in short segments (prefix caching keeps what was read)."""
    from transformers import AutoTokenizer

    eos_ids = engine_eos_ids(folder)
    return AutoTokenizer.from_pretrained(folder), dict(
        continue_batch=engine_continuation(lambda: load_engine(folder), eos_ids), eos_ids=eos_ids, batch_size=512,
        segment=48)

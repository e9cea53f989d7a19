"""Where a decoding step's time goes: cProfile of plain `generate()` and of speculative decoding on one Spec-Bench
prompt, after a warm-up of each, with the functions that took the most time of their own.

The bench's shares (draft / extend / verify) say which phase costs; this says what inside it does (a target
forward, the tree mask, cache copies, the walk, Python bookkeeping), to find overhead worth removing.

    OMP_NUM_THREADS=2 python benchmarks/profile_step.py --drafter drafters/smollm2-135m-instruct \
        --question-id 81 --settings '{"lookup_num_tokens": 0}'
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import PROMPT_FORMATS, encode_formatted, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--question-id", default="81", help="Spec-Bench question_id")
    parser.add_argument("--prompt-format", default="chat", choices=list(PROMPT_FORMATS))
    parser.add_argument("--settings", type=json.loads, default={}, help="speculative settings over the drafter's")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--top", type=int, default=30, help="functions listed per run")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target).eval()
    row = next(r for r in load_bench_prompts() if r["question_id"] == args.question_id)
    input_ids = encode_formatted(tokenizer, row["prompt"], args.prompt_format)  # (1, L)
    fields = drafter.generation_config.speculative_fields() | args.settings
    config = DynaSpecGenerationConfig(**fields, max_new_tokens=args.max_new_tokens, do_sample=False)
    runs = {
        "plain": lambda: target.generate(input_ids, max_new_tokens=args.max_new_tokens, do_sample=False),
        "speculative": lambda: target.generate(input_ids, generation_config=config, assistant_model=drafter),
    }
    print(f"{machine_description()}; prompt {args.question_id} ({row['category']}, {input_ids.shape[1]} tokens)")
    for name, run in runs.items():
        run()  # warm-up
        start = time.perf_counter()
        out = run()
        print(f"{name}: {time.perf_counter() - start:.2f} s for {out.shape[1] - input_ids.shape[1]} tokens")
    for name, run in runs.items():
        profile = cProfile.Profile()
        profile.enable()
        run()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
        print(f"\n## {name}\n{text.getvalue()}")


if __name__ == "__main__":
    main()

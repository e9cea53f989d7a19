"""The floor: what a step the policy makes plain costs through the package, against a plain `generate()` step.

Each prompt runs, in alternating rounds, plain greedy `generate()` and the package with every step plain (the step
policy's menu cut to the plain option, its probes and the whole tree's turns off, patched here: the hook, planning, verification of the
root alone in the learned head layout, emitting and statistics all run as in a real call). A step's seconds are
the call's decoding seconds (the prefill and setup taken out) over its steps; the output must equal plain greedy.
Writes `results.json` / `results.md` under --out: per prompt and pooled, the package's plain step over plain's.

    python benchmarks/plain_floor.py --target smollm2 --drafter drafters/smollm2-135m-instruct \
        --out benchmarks/results/cpu-smollm2-plain-floor-amd
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results_io, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a source checkout

import torch  # noqa: E402
from results_io import save_results  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig  # noqa: E402
from hf_dynaspec.bench_prompts import load_bench_prompts, round_robin  # noqa: E402
from hf_dynaspec.generation.loop import decoding  # noqa: E402
from hf_dynaspec.generation.planning import policy, step_arms  # noqa: E402
from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.targets import encode_formatted, load_target  # noqa: E402

LIMIT = 1.01  # the bound: a plain step through the package at most 1.01x plain's


@contextmanager
def only_plain_steps() -> Iterator[None]:
    """Inside the block every step is plain: the policy's menu is the plain option alone, no probe is forced and the
    whole tree gets no turn (`step_arms`); restored after (benchmark only)."""
    plain = [policy.Option(policy.Plan("plain"), 1.0, 1)]
    with (patch.object(policy.StepPolicy, "options", lambda self, *args, **kwargs: plain),
          patch.object(decoding, "probing_rows", lambda *args, **kwargs: []),
          patch.object(step_arms.StepArms, "next_arm", lambda self: "policy")):
        yield


def plain_step_seconds(target, ids: torch.Tensor, tokens: int) -> tuple[float, torch.Tensor]:
    """Seconds per decoding step of plain greedy generate(): (tokens - 1) steps after the prefill's token, the
    prefill timed apart by a one-token call."""
    start = time.perf_counter()
    target.generate(ids, max_new_tokens=1, do_sample=False)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    out = target.generate(ids, max_new_tokens=tokens, do_sample=False)
    return max(0.0, time.perf_counter() - start - prefill) / (out.shape[1] - ids.shape[1] - 1), out


def package_step_seconds(target, drafter, ids: torch.Tensor, tokens: int) -> tuple[float, torch.Tensor]:
    """Seconds per step of the package with every step plain (its setup and prefill taken out)."""
    config = DynaSpecGenerationConfig(max_new_tokens=tokens, do_sample=False, return_dict_in_generate=True)
    start = time.perf_counter()
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    seconds = time.perf_counter() - start
    stats = out.speculative_stats
    spent = seconds - stats.seconds.get("setup", 0.0) - stats.seconds.get("prefill", 0.0)
    return spent / stats.steps, out.sequences


def report(result: dict) -> str:
    rows = "\n".join(f"| {q} | {v['plain_ms']:.1f} | {v['package_ms']:.1f} | {v['ratio']:.3f}x |"
                     for q, v in result["per_prompt"].items())
    return (f"# A plain step through the package against plain generate() ({result['prompts']} prompts, "
            f"{result['rounds']} rounds, {result['max_new_tokens']} tokens)\n\nMachine: {result['machine']}. "
            f"Target: {result['target']}.\n\n| prompt | plain ms / step | package ms / step | ratio |\n"
            "|---|---|---|---|\n"
            f"{rows}\n\nMedian ratio **{result['median_ratio']:.3f}x**, pooled {result['pooled_ratio']:.3f}x "
            f"(bound {LIMIT}x); outputs equal to plain greedy: {result['matches']} of {result['prompts']}.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompt-format", default="chat")
    parser.add_argument("--limit", type=int, default=1, help="Spec-Bench prompts per category")
    parser.add_argument("--prompts", type=int, default=None, help="at most this many prompts in all")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter)
    prompts = round_robin(load_bench_prompts(None, args.limit))[: args.prompts]
    per_prompt, matches = {}, 0
    for row in tqdm(prompts, desc="floor", unit="prompt"):
        ids = encode_formatted(tokenizer, row["prompt"], args.prompt_format)
        plain_s, package_s, same = [], [], True
        for _ in range(args.rounds):
            seconds, plain = plain_step_seconds(target, ids, args.max_new_tokens)
            plain_s.append(seconds)
            with only_plain_steps():
                seconds, sequences = package_step_seconds(target, drafter, ids, args.max_new_tokens)
            package_s.append(seconds)
            same = same and bool(torch.equal(plain, sequences))
        matches += same
        plain_ms, package_ms = 1e3 * statistics.median(plain_s), 1e3 * statistics.median(package_s)
        per_prompt[row["question_id"]] = {"plain_ms": plain_ms, "package_ms": package_ms,
                                          "ratio": package_ms / plain_ms}
    result = {"machine": machine_description(), "target": args.target, "prompts": len(per_prompt),
              "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "per_prompt": per_prompt,
              "median_ratio": statistics.median(v["ratio"] for v in per_prompt.values()),
              "pooled_ratio": sum(v["package_ms"] for v in per_prompt.values())
              / sum(v["plain_ms"] for v in per_prompt.values()), "matches": matches}
    print(save_results(Path(args.out), result, report))
    return 0 if matches == len(per_prompt) else 1


if __name__ == "__main__":
    raise SystemExit(main())

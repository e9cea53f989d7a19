"""Two checks of batched decoding on a real target: `pipeline(..., batch_size=N)` with a drafter returns the texts
the same pipeline returns without one, and the peak memory of a batch of B rows against plain batched generate().

- pipeline: `pipeline("text-generation", model=target, tokenizer=..., batch_size=N)` over the first --prompts
  Spec-Bench prompts (chat-formatted where the tokenizer has a template), greedy, --max-new-tokens, with and
  without `assistant_model=<drafter dir>` (the drafter given as a folder, as a user passes a Hub id): identical
  generated texts per prompt, counted.
- memory: one batch of B left-padded prompts decoded by plain greedy `generate()` and by the drafter's, each in a
  fresh process, after loading the models and resetting the kernel's high-water mark (`/proc/self/clear_refs`:
  loading's transient copies, e.g. a GGUF's de-quantisation, would otherwise hide decoding's own peak); the ratio
  of the two peaks while decoding (first-call setup included: calibration, head copies, caches), and of the two
  growths over the loaded models. Linux only (VmRSS / VmHWM of /proc/self/status).

Writes results.json and results.md under --out.

    python benchmarks/batch_checks.py --target smollm2 --drafter drafters/smollm2-135m-instruct \
        --out benchmarks/results/cpu-smollm2-batch-checks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_speed import left_pad  # noqa: E402
from results_io import save_results  # noqa: E402


def status_mib(field: str) -> float:
    """A field of /proc/self/status (VmRSS: resident now, VmHWM: its peak) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise OSError(f"/proc/self/status has no {field}: the memory check needs Linux.")


def reset_peak() -> float:
    """Set this process's peak (VmHWM) to its resident memory now, and return that (MiB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_mib("VmRSS")


def prompt_texts(count: int) -> list[str]:
    from hf_dynaspec.bench_prompts import load_bench_prompts

    return [p["prompt"] for p in load_bench_prompts(limit=3)[:count]]


def pipeline_check(args: argparse.Namespace) -> dict:
    """Generated texts of the pipeline with and without the drafter, compared per prompt."""
    import torch
    from transformers import pipeline

    from hf_dynaspec.targets import load_target

    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    tokenizer.padding_side = "left"
    texts = prompt_texts(args.prompts)
    inputs = [[{"role": "user", "content": t}] for t in texts] if tokenizer.chat_template else texts
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False, return_full_text=False)
    plain_runner = pipeline("text-generation", model=target, tokenizer=tokenizer, batch_size=args.batch_size)
    spec_runner = pipeline("text-generation", model=target, tokenizer=tokenizer, batch_size=args.batch_size,
                           assistant_model=args.drafter)  # a folder, as a user passes a Hub id
    plain = [out[0]["generated_text"] for out in plain_runner(inputs, **common)]
    spec = [out[0]["generated_text"] for out in spec_runner(inputs, **common)]
    return dict(prompts=len(texts), batch_size=args.batch_size, identical=sum(a == b for a, b in zip(plain, spec)),
                differing=[i for i, (a, b) in enumerate(zip(plain, spec)) if a != b])


def memory_child(method: str, args: argparse.Namespace) -> dict:
    """In this (fresh) process: load, reset the peak, decode one batch by `method`, read the peak."""
    import torch

    from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.targets import encode_formatted, load_target

    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target) if method == "dynaspec" else None
    rows = [encode_formatted(tokenizer, t, "chat")[0].tolist() for t in prompt_texts(args.batch_size)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = left_pad(rows, pad)
    loaded = reset_peak()
    kwargs = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
    if drafter is not None:
        kwargs["assistant_model"] = drafter
    with torch.no_grad():
        target.generate(ids, **kwargs)
    return dict(method=method, loaded_mib=loaded, peak_mib=status_mib("VmHWM"))


def memory_check(args: argparse.Namespace) -> dict:
    """Each method's peaks from its own process."""
    found = {}
    for method in ("plain", "dynaspec"):
        command = [sys.executable, __file__, "--memory-child", method, *sys.argv[1:]]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        found[method] = json.loads(done.stdout.strip().splitlines()[-1])
    plain, spec = found["plain"], found["dynaspec"]
    plain_growth = plain["peak_mib"] - plain["loaded_mib"]
    return dict(batch_size=args.batch_size, plain=plain, dynaspec=spec,
                peak_ratio=spec["peak_mib"] / plain["peak_mib"],
                growth_ratio=(spec["peak_mib"] - spec["loaded_mib"]) / plain_growth if plain_growth >= 1 else None)


def report(result: dict) -> str:
    meta, pipe, memory = result["meta"], result["pipeline"], result["memory"]
    return "\n".join([
        f"# Batch checks: {meta['target']}", "",
        f"Drafter `{meta['drafter']}`, greedy, {meta['max_new_tokens']} new tokens, fp32; machine: {meta['machine']}.",
        "",
        f"- `pipeline(..., batch_size={pipe['batch_size']}, assistant_model=\"{meta['drafter']}\")` on "
        f"{pipe['prompts']} Spec-Bench prompts: {pipe['identical']} / {pipe['prompts']} generated texts identical to "
        f"the same pipeline without an assistant" + (f" (differing: {pipe['differing']})." if pipe["differing"] else "."),
        f"- Peak RSS while decoding at B = {memory['batch_size']} (each method in its own process, the peak reset "
        f"once the models were loaded): plain batched generate() {memory['plain']['peak_mib']:.0f} MiB "
        f"({memory['plain']['loaded_mib']:.0f} MiB loaded), DynaSpec {memory['dynaspec']['peak_mib']:.0f} MiB "
        f"({memory['dynaspec']['loaded_mib']:.0f} MiB loaded, the drafter included): "
        f"{memory['peak_ratio']:.2f}x the plain peak; " + (
            f"decoding's own growth {memory['growth_ratio']:.2f}x plain's." if memory["growth_ratio"] is not None
            else "plain decoding did not grow its process's memory."),
        "", "Regenerate: `" + meta["command"] + "`", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--memory-child", choices=("plain", "dynaspec"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args)))
        return
    from hf_dynaspec.machine import machine_description

    meta = dict(target=args.target, drafter=args.drafter, max_new_tokens=args.max_new_tokens,
                machine=machine_description(),
                command="python benchmarks/batch_checks.py " + " ".join(sys.argv[1:]))
    result = dict(meta=meta, pipeline=pipeline_check(args), memory=memory_check(args))
    print(save_results(args.out, result, report))


if __name__ == "__main__":
    main()

"""Peak memory of batched speculative decoding against plain batched generate() at the same batch size.

Each method runs in a process of its own (peak resident memory is per process): it loads the target (and, for
"dynaspec", the drafter), then resets the kernel's high-water mark (`/proc/self/clear_refs`, so loading's
transient copies, e.g. a GGUF's de-quantisation, do not count) and decodes the same batches of Spec-Bench prompts
(left-padded, greedy, fp32). Reported per method: resident memory once loaded, the peak while generating (every
first-call setup included: calibration, head copies, caches) and the growth between the two; and the peaks' ratio,
speculative over plain (the batch issue asks at most 1.3x at B = 8).

Linux only (VmRSS / VmHWM from /proc/self/status).

    python benchmarks/batch_memory.py --target smollm2 --drafter drafters/smollm2-135m-instruct \
        --out benchmarks/results/cpu-smollm2-batch-memory
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import save_results  # noqa: E402

METHODS = ("plain", "dynaspec")


def status_mib(field: str) -> float:
    """A /proc/self/status field (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise OSError(f"/proc/self/status has no {field}: this benchmark needs Linux.")


def reset_peak() -> None:
    """Set the process's high-water mark (VmHWM) to its current resident memory."""
    Path("/proc/self/clear_refs").write_text("5")


def child(args: argparse.Namespace) -> dict:
    """One method's process: load, reset the peak, decode the batches; its memory figures."""
    import torch
    from batch_speed import left_pad

    from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.bench_prompts import load_bench_prompts
    from hf_dynaspec.targets import encode_formatted, load_target

    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter) if args.child == "dynaspec" else None
    prompts = load_bench_prompts(limit=args.per_category)[: args.batch_size * args.batches]
    rows = [encode_formatted(tokenizer, p["prompt"], args.prompt_format)[0].tolist() for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    reset_peak()
    loaded = status_mib("VmRSS")
    for start in range(0, len(rows), args.batch_size):
        ids, mask = left_pad(rows[start : start + args.batch_size], pad)
        kwargs = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
        with torch.no_grad():
            target.generate(ids, **kwargs, **({"assistant_model": drafter} if drafter is not None else {}))
    peak = status_mib("VmHWM")
    return {"method": args.child, "loaded_mib": loaded, "peak_mib": peak, "growth_mib": peak - loaded}


def measure(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    """Each method in a fresh process (this script with --child), in turn."""
    results = []
    for method in METHODS:
        out = subprocess.run([sys.executable, __file__, *argv, "--child", method], check=True, capture_output=True,
                             text=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def report(result: dict) -> str:
    meta, rows = result["meta"], result["methods"]
    lines = [f"# Peak memory at batch size {meta['batch_size']}\n",
             f"{meta['target']}, {meta['batches']} batches of {meta['batch_size']} Spec-Bench prompts, greedy, "
             f"{meta['max_new_tokens']} new tokens, fp32, on {meta['machine']}; each method in its own process, "
             "the peak reset once the models were loaded.\n",
             "| method | resident once loaded (MiB) | peak while generating (MiB) | growth (MiB) |", "|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['loaded_mib']:.0f} | {r['peak_mib']:.0f} | {r['growth_mib']:.0f} |" for r in rows]
    lines.append(f"\nPeak, speculative over plain: {result['peak_ratio']:.2f}x; growth while generating: "
                 f"{result['growth_ratio']:.2f}x.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompt-format", default="chat")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--per-category", type=int, default=3, help="Spec-Bench prompts taken per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", choices=METHODS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args)))
        return None
    if args.out is None:
        parser.error("--out is required")
    from hf_dynaspec.machine import machine_description

    methods = measure(args, argv)
    by = {r["method"]: r for r in methods}
    meta = dict(target=args.target, drafter=args.drafter, batch_size=args.batch_size, batches=args.batches,
                max_new_tokens=args.max_new_tokens, threads=args.threads, machine=machine_description(),
                command="python benchmarks/batch_memory.py " + " ".join(argv))
    result = {"meta": meta, "methods": methods,
              "peak_ratio": by["dynaspec"]["peak_mib"] / by["plain"]["peak_mib"],
              "growth_ratio": by["dynaspec"]["growth_mib"] / max(by["plain"]["growth_mib"], 1e-9)}
    args.out.mkdir(parents=True, exist_ok=True)
    print(save_results(args.out, result, report))
    return result


if __name__ == "__main__":
    main()

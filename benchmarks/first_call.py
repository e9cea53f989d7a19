"""A fresh process's first generate() call: speculative decoding with all of its setup (binding the drafter, the
LM head's layout timings, the verification costs) against plain decoding's first call, each in a process of its
own, as a user meets it (`python my_script.py` once).

Four conditions, run in alternating rounds (one process per run; the target and drafter load untimed):
- plain: `target.generate(ids, max_new_tokens=N)`, the first call of its process;
- cold: the drafter's first call on a machine with nothing measured (an empty measurement folder, the default
  `HF_DYNASPEC_MEASURE=disk`): it measures what a first call can afford and stores it;
- second: the next process, reading what the cold run of its round stored;
- calibrated: a process after `hf-dynaspec calibrate` (the user's measurement folder, measured in full).

Each speculative run's output is checked against the plain run's (greedy, fp32). Writes records.jsonl (resumable),
results.json and results.md under --out.

    python benchmarks/first_call.py --target gemma3 --drafter drafters/gemma-3-270m --prompt-format qa \
        --out benchmarks/results/cpu-gemma3-first-call
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import save_results  # noqa: E402

CONDITIONS = ("plain", "cold", "second", "calibrated")


def child(args: argparse.Namespace) -> dict:
    """One first call in this process; returns its record (seconds, tokens, setup seconds, the output ids)."""
    import torch

    from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.bench_prompts import load_bench_prompts
    from hf_dynaspec.machine import machine_description
    from hf_dynaspec.targets import encode_formatted, load_target

    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    prompt = load_bench_prompts()[args.prompt_index]["prompt"]
    ids = encode_formatted(tokenizer, prompt, args.prompt_format)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    if args.child != "plain":
        kwargs.update(assistant_model=DynaSpecDrafter.from_pretrained(args.drafter), return_dict_in_generate=True)
    start = time.perf_counter()
    with torch.no_grad():
        out = target.generate(ids, **kwargs)
    seconds = time.perf_counter() - start
    sequences = out if args.child == "plain" else out.sequences
    setup = None if args.child == "plain" else out.speculative_stats.seconds.get("setup", 0.0)
    return dict(condition=args.child, prompt_index=args.prompt_index, seconds=seconds, setup_seconds=setup,
                new_tokens=sequences.shape[1] - ids.shape[1], output=sequences[0, ids.shape[1]:].tolist(),
                machine=machine_description())


def run_child(args: argparse.Namespace, condition: str, scratch: Path) -> dict:
    """One run in a process of its own; "cold" starts `scratch` as an empty measurement folder, "second" reads it."""
    env = {**os.environ, "HF_DYNASPEC_MEASURE": "disk"}
    env.pop("HF_DYNASPEC_MEASUREMENTS", None)
    if condition in ("cold", "second"):
        if condition == "cold":
            shutil.rmtree(scratch, ignore_errors=True)
        env["HF_DYNASPEC_MEASUREMENTS"] = str(scratch)
    command = [sys.executable, __file__, "--child", condition, "--target", args.target, "--drafter", args.drafter,
               "--prompt-format", args.prompt_format, "--max-new-tokens", str(args.max_new_tokens),
               "--threads", str(args.threads), "--prompt-index", str(args.prompt_index)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{condition} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(records: list[dict]) -> dict:
    """Median seconds per condition; each speculative condition's speedup over plain's median (first call, all
    setup included) and its exactness against plain's output."""
    by = {c: [r for r in records if r["condition"] == c] for c in CONDITIONS}
    plain = statistics.median(r["seconds"] for r in by["plain"])
    reference = by["plain"][0]["output"]
    rows = {}
    for condition, runs in by.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        rows[condition] = dict(
            runs=len(runs), median_seconds=seconds, speedup=plain / seconds,
            min_seconds=min(r["seconds"] for r in runs), max_seconds=max(r["seconds"] for r in runs),
            median_setup_seconds=None if condition == "plain" else statistics.median(r["setup_seconds"] for r in runs),
            new_tokens=runs[0]["new_tokens"], identical=all(r["output"] == reference for r in runs))
    return rows


def report(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# First call of a fresh process: {meta['target']}, {meta['max_new_tokens']} new tokens", "",
             f"Machine: {meta['machine']}. Greedy, fp32, Spec-Bench prompt {meta['prompt_index']} "
             f"({meta['prompt_format']} format); one process per run, {meta['rounds']} alternating rounds; the "
             "target and drafter load untimed. Speedup: plain's median first call over the condition's median.", "",
             "| condition | runs | median s (min-max) | setup s (median) | speedup vs plain | identical to plain |",
             "|---|---|---|---|---|---|"]
    for condition, row in result["summary"].items():
        setup = "" if row["median_setup_seconds"] is None else f"{row['median_setup_seconds']:.2f}"
        lines.append(f"| {condition} | {row['runs']} | {row['median_seconds']:.2f} ({row['min_seconds']:.2f}-"
                     f"{row['max_seconds']:.2f}) | {setup} | {row['speedup']:.2f}x | {row['identical']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="gemma3")
    parser.add_argument("--drafter", default="drafters/gemma-3-270m")
    parser.add_argument("--prompt-format", default="qa")
    parser.add_argument("--prompt-index", type=int, default=0, help="which Spec-Bench prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/cpu-gemma3-first-call")
    parser.add_argument("--child", choices=CONDITIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    plan = [c for _ in range(args.rounds) for c in CONDITIONS]  # "second" reads what "cold" stored just before
    if not records:  # the "calibrated" condition's measurements, in full, in the user's folder
        calibrate = ["calibrate", "--target", args.target, "--drafter", args.drafter, "--threads", str(args.threads)]
        subprocess.run([sys.executable, "-c", f"from hf_dynaspec.cli import main; raise SystemExit(main({calibrate!r}))"],
                       check=True, env={k: v for k, v in os.environ.items() if k != "HF_DYNASPEC_MEASUREMENTS"})
    scratch = Path(tempfile.mkdtemp(prefix="first-call-measurements-"))
    for condition in tqdm(plan[len(records):], desc="first calls", initial=len(records), total=len(plan)):
        record = run_child(args, condition, scratch)
        records.append(record)
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    meta = dict(target=args.target, drafter=args.drafter, prompt_format=args.prompt_format,
                prompt_index=args.prompt_index, max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                machine=records[0]["machine"])
    print(save_results(out, dict(meta=meta, summary=summarize(records), records=records), report))


if __name__ == "__main__":
    main()

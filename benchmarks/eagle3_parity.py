"""One EAGLE-3 checkpoint, two readers: vLLM's CPU build serving it with a chain of 3 (`num_speculative_tokens=3`)
and hf-dynaspec running it with a chain of 3 (`tree_policy="chain"`, `draft_depth=3`, no step policy, no lookup
branch), greedy, on the same prompts. A faithful reader drafts what the trainer's model drafts, so the two must
accept the same number of tokens per step (within 3%) and both must return plain greedy's text.

First the vLLM side, in the vLLM environment (`benchmarks/serving/vllm_env.sh`), batch 1:

    .venv-vllm/bin/python benchmarks/serving/vllm_bench.py --runs-only --batches 1 --prompts 20 \
        --target ~/.cache/hf-dynaspec/smollm2-135m-instruct-hf \
        --draft speculators=drafters/smollm2-speculators-eagle3 --out benchmarks/results/cpu-eagle3-parity/vllm

then this script, in the project's environment, which runs hf-dynaspec on the prompts vLLM ran and compares:

    python benchmarks/eagle3_parity.py --vllm-runs benchmarks/results/cpu-eagle3-parity/vllm --name speculators \
        --target ~/.cache/hf-dynaspec/smollm2-135m-instruct-hf --drafter drafters/smollm2-speculators-eagle3 \
        --out benchmarks/results/cpu-eagle3-parity

Accepted tokens per step: vLLM's 1 + accepted draft tokens / draft steps (its spec-decode counters), hf-dynaspec's
`speculative_stats.mean_accepted_length` (accepted drafts + the bonus token per verification step). Writes
results.json and results.md under --out; with --readme, the "eagle3-parity" block of docs/drafters.md too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_dynaspec  # noqa: F401  (the generate() hook)
from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig, SpeculativeStats
from hf_dynaspec.bench import write_doc_block
from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.machine import machine_description

sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))  # vllm_bench.py (imports vLLM only to run it)
from vllm_bench import formatted  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "data" / "tuning_prompts.jsonl"  # vllm_bench.py's default
TOLERANCE = 0.03  # the bar on accepted tokens per step


def chain_config(max_new_tokens: int, head_mode: str, depth: int) -> DynaSpecGenerationConfig:
    """vLLM's proposer as hf-dynaspec settings: one draft per depth, `depth` deep, every step, no lookup branch."""
    return DynaSpecGenerationConfig(
        tree_policy="chain", draft_depth=depth, num_draft_nodes=depth, step_policy="off", lookup_num_tokens=0,
        head_mode=head_mode, do_sample=False, max_new_tokens=max_new_tokens, return_dict_in_generate=True,
    )


def prompt_ids(tokenizer, text: str, prompt_format: str) -> torch.Tensor:
    """(1, L) ids as vLLM's `LLM.generate` makes them from the text vllm_bench.py gave it (`formatted`; special
    tokens added by the tokenizer as its default)."""
    return tokenizer(formatted(tokenizer, [text], prompt_format)[0], return_tensors="pt").input_ids


@torch.no_grad()
def hf_side(target, tokenizer, drafter, texts: list[str], meta: dict, head_mode: str) -> dict:
    """Per prompt: plain greedy's new tokens, the chain's new tokens, and the chain's statistics (merged)."""
    config = chain_config(meta["max_new_tokens"], head_mode, meta["num_speculative_tokens"])
    plain, chained, stats = [], [], []
    for text in tqdm(texts, desc=f"hf-dynaspec chain of {meta['num_speculative_tokens']}", unit="prompt"):
        ids = prompt_ids(tokenizer, text, meta["prompt_format"])
        base = target.generate(ids, do_sample=False, max_new_tokens=meta["max_new_tokens"])
        out = target.generate(ids, generation_config=config, assistant_model=drafter)
        plain.append(base[0, ids.shape[1]:].tolist())
        chained.append(out.sequences[0, ids.shape[1]:].tolist())
        stats.append(out.speculative_stats)
    merged = SpeculativeStats.merged(stats)
    return {"plain": plain, "chain": chained, "steps": merged.steps, "accepted_tokens": merged.accepted_tokens,
            "mean_accepted_length": merged.mean_accepted_length}


def vllm_side(folder: Path, name: str) -> tuple[dict, dict, dict]:
    """(vLLM plain run, the draft's run, the draft's accepted tokens per step) from vllm_bench.py's files."""
    plain = json.loads((folder / "plain-b1.json").read_text())
    draft = json.loads((folder / f"{name}-b1.json").read_text())
    m = draft["metrics"]
    drafts, accepted = m["vllm:spec_decode_num_drafts"], m["vllm:spec_decode_num_accepted_tokens"]
    return plain, draft, {"draft_steps": drafts, "accepted_drafts": accepted,
                          "mean_accepted_length": 1 + accepted / drafts if drafts else float("nan")}


def same(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b))


def compare(hf: dict, vllm_plain: dict, vllm_draft: dict, vllm_accept: dict, meta: dict, head_mode: str) -> dict:
    n = len(hf["chain"])
    ratio = hf["mean_accepted_length"] / vllm_accept["mean_accepted_length"]
    return {
        "machine": machine_description(), "meta": meta, "head_mode": head_mode, "prompts": n,
        "accepted_per_step": {"hf_dynaspec": hf["mean_accepted_length"], "vllm": vllm_accept["mean_accepted_length"],
                              "ratio": ratio, "within_tolerance": abs(ratio - 1) <= TOLERANCE},
        "identical": {"hf_chain_vs_hf_plain": same(hf["chain"], hf["plain"]),
                      "vllm_draft_vs_vllm_plain": same(vllm_draft["tokens"], vllm_plain["tokens"]),
                      "hf_plain_vs_vllm_plain": same(hf["plain"], vllm_plain["tokens"]),
                      "hf_chain_vs_vllm_draft": same(hf["chain"], vllm_draft["tokens"])},
        "counts": {"hf_steps": hf["steps"], "hf_accepted_tokens": hf["accepted_tokens"], **vllm_accept},
    }


def markdown(result: dict) -> str:
    a, same_, meta = result["accepted_per_step"], result["identical"], result["meta"]
    n = result["prompts"]
    lines = [
        "# One EAGLE-3 checkpoint, two readers: vLLM and hf-dynaspec, chain of "
        f"{meta['num_speculative_tokens']}",
        "",
        f"{n} prompts ({meta['prompts_file']}, {meta['prompt_format']}), greedy, {meta['max_new_tokens']} new tokens, "
        f"{meta['dtype']}, batch 1, on {result['machine']}; vLLM {meta['vllm']}; hf-dynaspec head "
        f"`{result['head_mode']}`. Drafter: `{meta['draft']}`.",
        "",
        "| reader | accepted tokens per step |",
        "|---|---|",
        f"| vLLM | {a['vllm']:.3f} |",
        f"| hf-dynaspec | {a['hf_dynaspec']:.3f} |",
        "",
        f"hf-dynaspec / vLLM: {a['ratio']:.3f} ({'within' if a['within_tolerance'] else 'outside'} "
        f"{TOLERANCE:.0%}).",
        "",
        "| greedy outputs identical | prompts |",
        "|---|---|",
        *(f"| {key.replace('_', ' ')} | {value} of {n} |" for key, value in same_.items()),
        "",
    ]
    return "\n".join(lines)


def readme_block(result: dict, out: Path) -> str:
    """The README's summary of a parity run."""
    a, same_, meta, n = result["accepted_per_step"], result["identical"], result["meta"], result["prompts"]
    return (f"Checked on `{meta['draft']}` (written by speculators' own code, `recipes/speculators/`), {n} prompts, "
            f"greedy, {meta['max_new_tokens']} new tokens, chain of {meta['num_speculative_tokens']}, on "
            f"{result['machine']}: accepted tokens per step {a['hf_dynaspec']:.3f} here against {a['vllm']:.3f} in "
            f"vLLM {meta['vllm']} serving the same folder ({a['ratio']:.3f}x); hf-dynaspec's output identical to "
            f"plain greedy on {same_['hf_chain_vs_hf_plain']} of {n} prompts, and to vLLM's speculative output on "
            f"{same_['hf_chain_vs_vllm_draft']} of {n}; `{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}`.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-runs", type=Path, required=True, help="vllm_bench.py --out folder (batch 1 runs)")
    parser.add_argument("--name", required=True, help="the draft's NAME in vllm_bench.py --draft NAME=FOLDER")
    parser.add_argument("--target", required=True, help="the target folder vLLM served")
    parser.add_argument("--drafter", required=True, help="the checkpoint folder vLLM served")
    parser.add_argument("--head-mode", default="trained", help="the hf-dynaspec head (the checkpoint's own)")
    parser.add_argument("--prompts-file", type=Path, default=PROMPTS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", action="store_true", help="write the eagle3-parity block of docs/drafters.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vllm_plain, vllm_draft, vllm_accept = vllm_side(args.vllm_runs, args.name)
    meta = vllm_draft["meta"]
    if args.prompts_file.name != meta["prompts_file"]:
        raise SystemExit(f"vLLM ran {meta['prompts_file']}; pass it as --prompts-file")
    texts = [r["prompt"] for r in load_bench_prompts(args.prompts_file, meta["per_category"])][: meta["prompts"]]
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=getattr(torch, meta["dtype"])).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter, target=target)
    hf = hf_side(target, tokenizer, drafter, texts, meta, args.head_mode)
    result = compare(hf, vllm_plain, vllm_draft, vllm_accept, meta, args.head_mode)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(result))
    print(markdown(result))
    if args.readme:
        write_doc_block(ROOT / "docs" / "drafters.md", "eagle3-parity", readme_block(result, args.out.resolve()))


if __name__ == "__main__":
    main()

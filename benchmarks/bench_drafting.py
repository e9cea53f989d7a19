"""How fast one draft tree is grown, per drafting path, on this machine: through the host (union shortlists, each
expansion read to pick the next: the CPU default), on the device (fixed-shape lanes and growth: CUDA's default),
and on the device with the draft step compiled (`torch.compile` of `DynaSpecCandidateGenerator.draft_step`,
inductor, dynamic shapes: the drafter cache grows every step). Same trees on every path (checked per call).

For each path: median ms per tree over prompts and tree sizes, host reads per tree, and the compile time paid
once. `--out DIR` writes results.json and results.md. The CPU default stays with the fastest path measured here.

    python benchmarks/bench_drafting.py --target smollm2 --drafter drafters/smollm2-135m-instruct \
        --out benchmarks/results/cpu-smollm2-drafting        # a few minutes on 2 cores
    python benchmarks/bench_drafting.py --target tiny --quick  # seconds: a random drafter, for the test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.candidates import DynaSpecCandidateGenerator
from hf_dynaspec.generation.loop.syncs import HostSyncCounter
from hf_dynaspec.generation.verification.cache import crop_cache
from hf_dynaspec.generation_config import resolve_draft_settings
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import encode_formatted, load_target

PATHS = {"host": dict(shortlist_layout="union", tree_growth="host"),
         "device": dict(shortlist_layout="lanes", tree_growth="device"),
         "device-compiled": dict(shortlist_layout="lanes", tree_growth="device")}
TREES = ((12, 5, 4), (24, 4, 6), (48, 3, 16))  # (nodes, depth, top-k): the CPU default's size, larger, CUDA's
PROMPTS = ("Explain why the sky is blue, in three sentences.", "Write a Python function that reverses a list.",
           "What is the capital of France, and what is it known for?")


def generator_for(target, drafter, prompt_ids: torch.Tensor, tree: tuple[int, int, int], path: str):
    """A generator that has read the prompt, set for one path and tree; the committed ids with the root last."""
    nodes, depth, top_k = tree
    config = DynaSpecGenerationConfig(num_draft_nodes=nodes, draft_depth=depth, draft_top_k=top_k,
                                      lookup_num_tokens=0, min_draft_prob=0.0, implementation=PATHS[path])
    settings = resolve_draft_settings(config, drafter.generation_config, drafter.config, "cpu")
    generator = DynaSpecCandidateGenerator(drafter, settings)
    with torch.no_grad():
        out = target(prompt_ids, output_hidden_states=True)
    next_token = out.logits[0, -1].argmax()[None]
    generator.extend(drafter.target_features(out.hidden_states)[0], torch.cat([prompt_ids[0, 1:], next_token]))
    return generator, torch.cat([prompt_ids, next_token[None]], dim=-1)


def time_trees(generator, ids: torch.Tensor, repeats: int, count: bool = True) -> tuple[list[float], int | None,
                                                                                       list[int]]:
    """(ms per tree over `repeats` trees, host reads of one tree (None: not counted: a compiled step would
    recompile under the counting mode), its tokens)."""
    committed = ids[0].tolist()
    counter = HostSyncCounter()
    with counter if count else contextlib.nullcontext():
        tree = generator.draft(ids, committed=committed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generator.draft(ids, committed=committed)
        times.append(1e3 * (time.perf_counter() - start))
    crop_cache(generator.cache, generator.committed)
    return times, counter.total if count else None, tree.token_list


def run(target, drafter, tokenizer, prompt_format: str, trees, repeats: int, paths=tuple(PATHS)) -> list[dict]:
    rows = []
    for tree in trees:
        for prompt in PROMPTS:
            ids = encode_formatted(tokenizer, prompt, prompt_format)
            tokens = None
            for path in paths:
                generator, committed = generator_for(target, drafter, ids, tree, path)
                compile_s = 0.0
                if path == "device-compiled":
                    torch._dynamo.reset()  # a fresh generator: its step compiles anew, within the recompile limit
                    generator.draft_step = torch.compile(generator.draft_step, dynamic=True)
                    start = time.perf_counter()
                    generator.draft(committed, committed=committed[0].tolist())  # compiles
                    compile_s = time.perf_counter() - start
                times, reads, drafted = time_trees(generator, committed, repeats, count=path != "device-compiled")
                if tokens is not None and drafted != tokens:
                    raise AssertionError(f"{path} drafted another tree than the host path: {drafted} vs {tokens}")
                tokens = drafted
                rows.append(dict(tree=list(tree), prompt=prompt, path=path, ms=statistics.median(times),
                                 host_reads=reads, compile_s=compile_s))
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for tree in {tuple(r["tree"]) for r in rows}:
        mine = [r for r in rows if tuple(r["tree"]) == tree]
        host = statistics.median(r["ms"] for r in mine if r["path"] == "host")
        for path in dict.fromkeys(r["path"] for r in mine):
            of_path = [r for r in mine if r["path"] == path]
            ms = statistics.median(r["ms"] for r in of_path)
            reads = [r["host_reads"] for r in of_path if r["host_reads"] is not None]
            out.append(dict(tree=list(tree), path=path, ms=ms, vs_host=ms / host,
                            host_reads=max(reads) if reads else None,
                            compile_s=max(r["compile_s"] for r in of_path)))
    return sorted(out, key=lambda r: (r["tree"], list(PATHS).index(r["path"])))


def markdown(summary: list[dict], meta: dict) -> str:
    lines = [f"One draft tree per drafting path, {meta['drafter']} on {meta['machine']}; median over "
             f"{meta['prompts']} prompts x {meta['repeats']} trees. `python benchmarks/bench_drafting.py`", "",
             "| tree (nodes, depth, top-k) | path | ms per tree | vs host | host reads per tree | compile s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {tuple(r['tree'])} | {r['path']} | {r['ms']:.2f} | {r['vs_host']:.2f}x | "
              f"{'-' if r['host_reads'] is None else r['host_reads']} | {r['compile_s']:.1f} |" for r in summary]
    lines += ["", "Host reads are not counted on the compiled path (counting would change what it compiles); it "
              "drafts the same trees as the device path."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default=None, help="drafter folder (default: a fresh random one)")
    parser.add_argument("--prompt-format", default="chat")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one small tree, 3 repeats")
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    if args.drafter:
        drafter = DynaSpecDrafter.from_pretrained(args.drafter).eval().bind(target)
    else:
        drafter = DynaSpecDrafter.from_target(target, num_clusters=8).eval()
    trees, repeats = (((6, 3, 2),), 3) if args.quick else (TREES, args.repeats)
    prompt_format = args.prompt_format if args.target != "tiny" else "plain"
    rows = run(target, drafter, tokenizer, prompt_format, trees, repeats, args.paths)
    meta = dict(machine=machine_description(), drafter=args.drafter or f"random drafter of {args.target}",
                prompts=len(PROMPTS), repeats=repeats)
    summary = summarize(rows)
    text = markdown(summary, meta)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
        (args.out / "results.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

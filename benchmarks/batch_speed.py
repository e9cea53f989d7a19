"""Batched speculative decoding against plain batched generate() at the same batch size, on Spec-Bench prompts.

For each batch size B, the prompts are cut into consecutive batches of B (left-padded); each batch is decoded by
plain greedy `generate()` and by the drafter's (`assistant_model=`), alternating which goes first, 128 new tokens,
fp32. Reported per B: tokens/s of each (new tokens up to each row's EOS, summed over the batches, over their
seconds), the speedup with a bootstrap interval over batches, the share of rows identical to plain greedy of the
same batch, and the share of rows where plain greedy of the batch differs from plain greedy of the row alone (B = 1
of the same run: fp32 batched kernels may round differently), so both rates are told apart.

Writes records.jsonl (one line per batch and method; a stopped run resumes), results.json, results.md and
speedup.png under --out.

    python benchmarks/batch_speed.py --target smollm2 --drafter drafters/smollm2-135m-instruct \
        --out benchmarks/results/cpu-smollm2-batch
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import save_results  # noqa: E402

from hf_dynaspec.bench import write_doc_block  # noqa: E402

METHODS = ("plain", "dynaspec")


def left_pad(rows: list[list[int]], pad: int):
    """Token lists -> input_ids and attention_mask (B, T), padded on the left."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row)
        mask[b, width - len(row) :] = 1
    return ids, mask


def new_tokens(row: list[int], eos: set[int]) -> list[int]:
    """A row's generated tokens up to and with its first EOS (the rest is padding)."""
    for i, token in enumerate(row):
        if token in eos:
            return row[: i + 1]
    return row


def run_batch(target, drafter, rows: list[list[int]], method: str, args: argparse.Namespace, pad: int, eos: set[int]
              ) -> dict:
    """One timed generate() of a batch; its per-row new tokens."""
    import torch

    ids, mask = left_pad(rows, pad)
    kwargs = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
    if method == "dynaspec":
        kwargs["assistant_model"] = drafter
    start = time.perf_counter()
    with torch.no_grad():
        out = target.generate(ids, **kwargs)
    seconds = time.perf_counter() - start
    generated = [new_tokens(r, eos) for r in out[:, ids.shape[1] :].tolist()]
    return dict(seconds=seconds, tokens=sum(len(r) for r in generated), outputs=generated)


def measure(args: argparse.Namespace, records_path: Path) -> list[dict]:
    """Every (batch size, batch, method) not yet in records.jsonl, appended as it is measured."""
    import torch

    from hf_dynaspec import DynaSpecDrafter
    from hf_dynaspec.bench_prompts import load_bench_prompts
    from hf_dynaspec.machine import machine_description
    from hf_dynaspec.targets import encode_formatted, load_target

    torch.set_num_threads(args.threads)
    done = [json.loads(line) for line in records_path.read_text().splitlines()] if records_path.exists() else []
    seen = {(r["batch_size"], r["batch"], r["method"]) for r in done}
    prompts = load_bench_prompts(limit=args.per_category)[: args.prompts]
    jobs = [(size, start // size, method if (start // size) % 2 == 0 else METHODS[1 - METHODS.index(method)])
            for size in args.batch_sizes for start in range(0, len(prompts) - size + 1, size) for method in METHODS]
    todo = [job for job in jobs if job not in seen]
    if not todo:  # every batch measured: the report is regenerated from the records alone
        return done
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target)
    rows = [encode_formatted(tokenizer, p["prompt"], args.prompt_format)[0].tolist() for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    machine = machine_description()
    with records_path.open("a") as sink:
        for size, index, method in tqdm(todo, desc="batches", unit="batch"):
            batch_rows = rows[index * size : (index + 1) * size]
            record = dict(batch_size=size, batch=index, method=method, machine=machine,
                          question_ids=[p["question_id"] for p in prompts[index * size : (index + 1) * size]],
                          **run_batch(target, drafter, batch_rows, method, args, pad, eos))
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            done.append(record)
    return done


def bootstrap(pairs: list[tuple[float, float, float, float]], draws: int = 5000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the pooled speedup (plain s / tokens over dynaspec's) resampling batches: pairs of
    (plain seconds, plain tokens, dynaspec seconds, dynaspec tokens)."""
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        sample = rng.choices(pairs, k=len(pairs))
        plain = sum(p[1] for p in sample) / sum(p[0] for p in sample)
        spec = sum(p[3] for p in sample) / sum(p[2] for p in sample)
        values.append(spec / plain)
    values.sort()
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def summarise(records: list[dict]) -> dict:
    """Per batch size: tokens/s of both methods, the speedup and its interval, identical rows, and rows whose
    plain batched output differs from the same prompt's plain output alone (B = 1)."""
    by_key = {(r["batch_size"], r["batch"], r["method"]): r for r in records}
    alone = {}
    for (size, _, method), r in by_key.items():
        if size == 1 and method == "plain":
            alone[r["question_ids"][0]] = r["outputs"][0]
    sizes = sorted({r["batch_size"] for r in records})
    rows = []
    for size in sizes:
        pairs, identical, rows_total, batch_differs = [], 0, 0, 0
        for index in sorted({r["batch"] for r in records if r["batch_size"] == size}):
            plain, spec = by_key.get((size, index, "plain")), by_key.get((size, index, "dynaspec"))
            if plain is None or spec is None:
                continue
            pairs.append((plain["seconds"], plain["tokens"], spec["seconds"], spec["tokens"]))
            for qid, mine, theirs in zip(plain["question_ids"], spec["outputs"], plain["outputs"]):
                rows_total += 1
                identical += mine == theirs
                batch_differs += qid in alone and alone[qid] != theirs
        if not pairs:
            continue
        plain_tps = sum(p[1] for p in pairs) / sum(p[0] for p in pairs)
        spec_tps = sum(p[3] for p in pairs) / sum(p[2] for p in pairs)
        low, high = bootstrap(pairs)
        rows.append(dict(batch_size=size, batches=len(pairs), rows=rows_total, plain_tokens_per_s=plain_tps,
                         dynaspec_tokens_per_s=spec_tps, speedup=spec_tps / plain_tps, speedup_ci=[low, high],
                         identical_rows=identical, plain_batch_differs_from_alone=batch_differs))
    return {"rows": rows, "machine": records[0]["machine"] if records else None}


def report(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Batched speculative decoding vs plain batched generate(): {meta['target']}", "",
             f"Drafter `{meta['drafter']}`, {meta['prompts']} Spec-Bench prompts, {meta['max_new_tokens']} new tokens, "
             f"greedy, fp32, {meta['threads']} threads; machine: {result['summary']['machine']}.", "",
             "| B | batches | plain tok/s | DynaSpec tok/s | speedup (95% CI) | rows identical to plain batch | "
             "plain batch differs from row alone |", "|---|---|---|---|---|---|---|"]
    for r in result["summary"]["rows"]:
        low, high = r["speedup_ci"]
        lines.append(f"| {r['batch_size']} | {r['batches']} | {r['plain_tokens_per_s']:.1f} | "
                     f"{r['dynaspec_tokens_per_s']:.1f} | {r['speedup']:.2f}x [{low:.2f}, {high:.2f}] | "
                     f"{r['identical_rows']} / {r['rows']} | {r['plain_batch_differs_from_alone']} / {r['rows']} |")
    lines += ["", "Regenerate: `" + meta["command"] + "`", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]["rows"]
    sizes = [r["batch_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.errorbar(sizes, [r["speedup"] for r in rows], marker="o", capsize=3,
                yerr=[[r["speedup"] - r["speedup_ci"][0] for r in rows], [r["speedup_ci"][1] - r["speedup"] for r in rows]])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("tokens/s vs plain batched")
    ax.set_title(result["meta"]["target"])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompt-format", default="chat")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--per-category", type=int, default=3, help="Spec-Bench prompts taken per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path, default=None,
                        help="write the table into this markdown file's batch-speed-<target> block (e.g. docs/batches.md)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    records = measure(args, args.out / "records.jsonl")
    meta = dict(target=args.target, drafter=args.drafter, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                threads=args.threads, batch_sizes=args.batch_sizes,
                command="python benchmarks/batch_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    result = {"meta": meta, "summary": summarise(records)}
    print(save_results(args.out, result, report))
    plot(result, args.out / "speedup.png")
    if args.readme is not None:
        write_doc_block(args.readme, f"batch-speed-{args.target}", readme_block(result, args.out))
    return result


def readme_block(result: dict, out: Path) -> str:
    """The README's table for one target: speedup per batch size, with where the records and the plot are."""
    meta, summary = result["meta"], result["summary"]
    lines = [f"{meta['target']}, {meta['prompts']} Spec-Bench prompts, {meta['max_new_tokens']} new tokens, greedy fp32, "
             f"{summary['machine']} ([records and plot]({out.as_posix()}/)):", "",
             "| B | plain tok/s | DynaSpec tok/s | speedup (95% CI) | rows identical to plain batch |",
             "|---|---|---|---|---|"]
    for r in summary["rows"]:
        low, high = r["speedup_ci"]
        lines.append(f"| {r['batch_size']} | {r['plain_tokens_per_s']:.1f} | {r['dynaspec_tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x [{low:.2f}, {high:.2f}] | {r['identical_rows']} / {r['rows']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

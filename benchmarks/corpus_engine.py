"""What generates the Gemma corpus faster here: transformers' `generate` or vLLM's CPU build, on the same answer
records of the multilingual recipe, through the same `write_answers` (segmented greedy answers cut at their loops).
Each engine runs in its own environment and writes `<out>/<engine>.json`; `--summarize` writes results.md from them.

    python benchmarks/corpus_engine.py --engine transformers --out benchmarks/results/cpu-gemma3-corpus-engine
    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv-vllm/bin/python benchmarks/corpus_engine.py --engine vllm \\
        --out benchmarks/results/cpu-gemma3-corpus-engine
    python benchmarks/corpus_engine.py --summarize --out benchmarks/results/cpu-gemma3-corpus-engine
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes" / "gemma3"))


def records(count: int) -> list[dict]:
    """The answer records (three formats each) of the last questions in the recipe's questions file."""
    from multilingual import QUESTIONS_NAME, answer_records

    rows = [json.loads(line) for line in (ROOT / "data/corpus/gemma3" / QUESTIONS_NAME).read_text().splitlines()]
    return answer_records(rows[-(count // 3 + 1):])[:count]


def run(engine: str, count: int, engine_model: str) -> dict:
    import torch
    from vllm_engine import answer_engine

    from hf_dynaspec.machine import machine_description
    from hf_dynaspec.training.corpus import write_answers

    torch.set_num_threads(2)  # transformers' threads (vLLM's are VLLM_CPU_OMP_THREADS_BIND)
    model, tokenizer, options = answer_engine(engine, engine_model, 32, 96)  # multilingual.py's answer stage
    folder = Path(tempfile.mkdtemp())
    try:
        start = time.perf_counter()
        index = write_answers(model, tokenizer, records(count), folder, 192, chat_template=False, stop_repeats=16,
                              progress=False, **options)
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(folder)
    tokens = sum(s["answer_tokens"] for s in index["shards"])
    return {"engine": engine, "records": count, "seconds": seconds, "answer_tokens": tokens,
            "answer_tokens_per_s": tokens / seconds, "machine": machine_description(),
            "options": {k: v for k, v in options.items() if isinstance(v, int)}}


def summarize(out: Path) -> str:
    rows = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "results"}
    base = rows.get("transformers")
    lines = [f"Gemma 3 270M corpus answers, {next(iter(rows.values()))['records']} records of the multilingual "
             f"recipe, greedy, at most 192 tokens, cut at their loops ({next(iter(rows.values()))['machine']}). "
             "`python benchmarks/corpus_engine.py`", "",
             "| engine | answer tokens | seconds | answer tokens/s | vs transformers |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        ratio = f"{r['answer_tokens_per_s'] / base['answer_tokens_per_s']:.2f}x" if base else ""
        lines.append(f"| {name} | {r['answer_tokens']:,} | {r['seconds']:.1f} | {r['answer_tokens_per_s']:.1f} | "
                     f"{ratio} |")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("transformers", "vllm"))
    parser.add_argument("--records", type=int, default=96)
    parser.add_argument("--engine-model", default="/tmp/hf-dynaspec-serving/gemma3")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        print(summarize(args.out))
        return
    if args.engine is None:
        raise SystemExit("--engine transformers|vllm (or --summarize)")
    result = run(args.engine, args.records, args.engine_model)
    (args.out / f"{args.engine}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

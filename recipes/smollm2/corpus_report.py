"""What the self-distilled corpus holds and how fast it was made, from its index.json alone.

Per source (domain): tokens (prompt + answer) and their share; per shard: conversations, answer tokens and answer
tokens per second. Writes `corpus.json` / `corpus.md` into `--out` and the table into recipes/smollm2/training.md
(a generated block).

    python recipes/smollm2/corpus_report.py --corpus data/corpus/smollm2 --out benchmarks/results/cpu-smollm2-corpus
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from hf_dynaspec.bench import write_doc_block

HERE = Path(__file__).resolve().parent


def report(index: dict) -> dict:
    shards = index["shards"]
    per_source: Counter = Counter()
    for shard in shards:
        per_source.update(shard["tokens_per_source"])
    rates = [s["answer_tokens_per_s"] for s in shards]
    return {
        "shards": len(shards),
        "conversations": sum(s["num_conversations"] for s in shards),
        "tokens": sum(s["num_tokens"] for s in shards),
        "answer_tokens": sum(s["answer_tokens"] for s in shards),
        "generation_seconds": round(sum(s["seconds"] for s in shards), 1),
        "answer_tokens_per_s": {"median": statistics.median(rates), "min": min(rates), "max": max(rates)},
        "tokens_per_source": dict(per_source.most_common()),
    }


def markdown(facts: dict) -> str:
    rate = facts["answer_tokens_per_s"]
    lines = [f"{facts['conversations']:,} conversations in {facts['shards']} shards: {facts['tokens']:,} tokens, "
             f"{facts['answer_tokens']:,} of them answer tokens, generated in {facts['generation_seconds'] / 3600:.1f} h "
             f"(answer tokens per second per shard: median {rate['median']:.0f}, {rate['min']:.0f}-{rate['max']:.0f}; "
             "prompts run shortest first, so later shards have longer prompts to prefill, and shards that shared "
             "the CPU with other work are slower). Written by "
             "`recipes/smollm2/corpus_report.py`.", "", "| source | tokens | share |", "|---|---|---|"]
    for source, tokens in facts["tokens_per_source"].items():
        lines.append(f"| {source} | {tokens:,} | {tokens / facts['tokens']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus/smollm2"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--doc", type=Path, default=HERE / "training.md")
    args = parser.parse_args()
    facts = report(json.loads((args.corpus / "index.json").read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "corpus.json").write_text(json.dumps(facts, indent=1) + "\n")
    text = markdown(facts)
    (args.out / "corpus.md").write_text(text + "\n")
    write_doc_block(args.doc, "corpus", text)
    print(text)


if __name__ == "__main__":
    main()

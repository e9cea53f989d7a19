"""Answer tokens of the Gemma corpus per group (English, each language, code), read from its shards.

Each conversation's source is stored with it (`training.corpus`; shards written before that were English only and
count as English), so the per-group answer tokens are exact. Writes `groups.json` / `groups.md` into `--out` and
the table into recipes/gemma3/training.md (a generated block), with the issue's goal (answer tokens in all).

    python recipes/gemma3/corpus_groups.py --out benchmarks/results/cpu-gemma3-corpus
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from languages import GROUPS, LANGUAGES, group_of  # noqa: E402

from hf_dynaspec.bench import write_doc_block  # noqa: E402
from hf_dynaspec.training.corpus import load_corpus  # noqa: E402

HERE = Path(__file__).resolve().parent
GOAL_ANSWER_TOKENS = 4_000_000  # issue #30: at least 4M answer tokens in all


def count(corpus: Path) -> dict[str, dict[str, int]]:
    """{group: {"conversations", "answer_tokens", "tokens"}} over the corpus."""
    convs, answers, tokens = Counter(), Counter(), Counter()
    for conv in load_corpus(corpus):
        group = group_of(conv.source)
        convs[group] += 1
        answers[group] += conv.input_ids.numel() - conv.prompt_length
        tokens[group] += conv.input_ids.numel()
    return {g: {"conversations": convs[g], "answer_tokens": answers[g], "tokens": tokens[g]} for g in GROUPS if convs[g]}


def markdown(groups: dict[str, dict[str, int]], corpus: Path) -> str:
    total = sum(g["answer_tokens"] for g in groups.values())
    names = {"en": "English", "code": "code (Python, JavaScript, C)"} | {c: v["name"] for c, v in LANGUAGES.items()}
    lines = [f"Answer tokens per group of `{corpus}` (`recipes/gemma3/corpus_groups.py`): {total:,} in all, "
             f"{total / GOAL_ANSWER_TOKENS:.0%} of the {GOAL_ANSWER_TOKENS:,} the multilingual drafter asks for.", "",
             "| group | conversations | answer tokens | share of answer tokens | tokens with prompts |",
             "|---|---|---|---|---|"]
    for name, g in groups.items():
        lines.append(f"| {names.get(name, name)} | {g['conversations']:,} | {g['answer_tokens']:,} | "
                     f"{g['answer_tokens'] / max(total, 1):.1%} | {g['tokens']:,} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus/gemma3"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--doc", type=Path, default=HERE / "training.md")
    args = parser.parse_args()
    groups = count(args.corpus)
    text = markdown(groups, args.corpus)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "groups.json").write_text(json.dumps({"corpus": str(args.corpus), "groups": groups}, indent=1) + "\n")
    (args.out / "groups.md").write_text(text + "\n")
    write_doc_block(args.doc, "corpus-groups", text)
    print(text)


if __name__ == "__main__":
    main()

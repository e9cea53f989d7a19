"""The held-out code slice for the Gemma 3 comparison: code-completion prompts where rare identifiers matter.

Prompts are the opening lines of GPTeacher codegen solutions (MIT, data/licenses/gpteacher-LICENSE) that no
training mix uses: items whose instruction appears in data/train_prompts*.jsonl are skipped, and the Gemma corpus
recipe (`build_corpus.py`) leaves these solutions out of its continuation prompts. Each prompt is the first
`--fraction` of the solution's lines (at least 4): the model continues the code, reusing the names the prefix
defined. Not from Spec-Bench, not a public benchmark. Deterministic for a seed.

    python recipes/gemma3/code_slice.py --out data/code_slice.jsonl --count 30
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from hf_dynaspec.training.corpus import prompt_key

SOURCE = Path("../shared/data/gpteacher/codegen-instruct.json")
TRAIN_MIXES = (Path("data/train_prompts.jsonl"), Path("data/train_prompts_round2.jsonl"))


def used_instructions() -> set[str]:
    """Instruction texts the SmolLM2 training mixes hold (their prompts start with the instruction)."""
    prompts = [json.loads(line)["prompt"] for f in TRAIN_MIXES if f.is_file() for line in f.read_text().splitlines()]
    return {p.split("\n\n")[0].strip() for p in prompts}


def code_prefix(code: str, fraction: float) -> str | None:
    """The first `fraction` of the code's lines (at least 4, and at least 4 left to complete), or None."""
    lines = [line for line in code.splitlines() if line.strip()]
    if len(lines) < 10:
        return None
    keep = max(4, int(len(lines) * fraction))
    return "\n".join(lines[:keep]) + "\n" if len(lines) - keep >= 4 else None


def build_slice(count: int, fraction: float, seed: int) -> list[dict]:
    records = json.loads(SOURCE.read_text())
    used = used_instructions()
    rng = random.Random(seed)
    rng.shuffle(records)
    out = []
    for record in records:
        if record["instruction"].strip() in used:
            continue
        prefix = code_prefix(record["response"], fraction)
        if prefix is not None:
            out.append({"question_id": f"code-{len(out):03d}", "category": "code_slice", "prompt": prefix,
                        "solution_sha": prompt_key(record["response"])})
        if len(out) == count:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/code_slice.jsonl", help="output JSONL (bench --prompts takes it)")
    parser.add_argument("--count", type=int, default=30, help="prompts")
    parser.add_argument("--fraction", type=float, default=0.4, help="share of each solution's lines given")
    parser.add_argument("--seed", type=int, default=0, help="selection seed")
    args = parser.parse_args()
    rows = build_slice(args.count, args.fraction, args.seed)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.out}: {len(rows)} code-completion prompts")


if __name__ == "__main__":
    main()

"""The prompts the SmolLM2 drafter's default tree is tuned on: two per Spec-Bench category, none from Spec-Bench.

The default tree (nodes, depth, top-k) is chosen by running `hf-dynaspec bench --prompts` on these, so the
Spec-Bench figures it is then judged by stay held out. Each prompt mimics a Spec-Bench category from material
no training mix, corpus or evaluation set uses: GSM8K *test* questions that Spec-Bench does not hold, GPTeacher
codegen / roleplay records the prompt mixes left unused (and not the code slice), and fixed templates for the
categories the shared data lacks (writing, STEM, humanities, QA). Needs no model.

    python recipes/smollm2/tuning_prompts.py --out data/tuning_prompts.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

from build_prompts import read_json as read_records  # recipes/smollm2/build_prompts.py, beside this script
from build_prompts import with_input

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
PER_CATEGORY = 2
WRITING = ("Write a short blog post about learning to cook as an adult.",
           "Write a persuasive paragraph asking neighbours to join a street clean-up day.",
           "Write a short story opening set in a lighthouse during a storm.")
STEM = ("Explain how a refrigerator moves heat out of its inside.", "Why does ice float on water?",
        "Explain what a prime number is and why there are infinitely many.")
HUMANITIES = ("What were the main causes of the French Revolution?",
              "Explain the difference between a democracy and a republic.",
              "Why did the printing press change European society?")
QA = ("What causes the seasons on Earth?", "Who wrote the novel Pride and Prejudice?",
      "How many bones are in the adult human body?")
REASONING = ("If all bloops are razzies and some razzies are lazzies, must some bloops be lazzies? Explain.",
             "A bat and a ball cost $1.10 together; the bat costs $1.00 more than the ball. What does the ball cost?",
             "Three boxes are labelled apples, oranges and mixed, and every label is wrong. You may take one fruit "
             "from one box. How do you relabel them?")
RAG_QUESTIONS = ("What is the main point of the passage?", "List two facts stated in the passage.")


def used_texts() -> set[str]:
    """Every prompt the training mixes, the corpus questions and Spec-Bench hold (compared whole)."""
    texts: set[str] = set()
    for name in ("train_prompts.jsonl", "train_prompts_round2.jsonl"):
        texts |= {r["prompt"] for r in read_records(ROOT / "data" / name)}
    texts |= {r.get("question", r.get("prompt", "")) for r in read_records(ROOT / "data/corpus/smollm2/questions.jsonl")}
    for record in read_records(ROOT / "data/spec_bench/question.jsonl"):
        texts |= set(record["turns"])
    return texts


def unused(pool: list[str], used: set[str], n: int, rng: random.Random) -> list[str]:
    """n texts of `pool` that appear in no used prompt, neither whole nor inside one (passages, questions)."""
    blob = "\n".join(used)
    rng.shuffle(pool)
    picked = [text for text in pool if text not in used and text[:200] not in blob and text[-200:] not in blob]
    if len(picked) < n:
        raise RuntimeError(f"only {len(picked)} unused texts left in a pool, {n} needed")
    return picked[:n]


def build(seed: int) -> list[dict]:
    rng = random.Random(seed)
    used = used_texts()
    slice_shas = {r["solution_sha"] for r in read_records(ROOT / "data/code_slice.jsonl")}
    gsm = unused([q["question"] for q in read_records(SHARED / "gsm8k/test.jsonl")], used, 4 * PER_CATEGORY, rng)
    code = [r for r in read_records(SHARED / "gpteacher/codegen-instruct.json")
            if hashlib.sha1(r["response"].encode()).hexdigest() not in slice_shas]
    role = read_records(SHARED / "gpteacher/roleplay-instruct.json")
    passages = unused([r["response"] for r in role if len(r["response"]) > 300], used, 2 * PER_CATEGORY, rng)
    k = PER_CATEGORY
    rows = {
        "writing": list(WRITING[:k]), "roleplay": unused([with_input(r) for r in role], used, k, rng),
        "reasoning": list(REASONING[:k]), "math": gsm[:k], "coding": unused([with_input(r) for r in code], used, k, rng),
        "extraction": [f"Extract every number in this text and say what it counts:\n\n{q}" for q in gsm[k : 2 * k]],
        "stem": list(STEM[:k]), "humanities": list(HUMANITIES[:k]),
        "translation": [f"Translate into French: {q}" for q in gsm[2 * k : 3 * k]],
        "summarization": [f"Summarize: {p}" for p in passages[:k]], "qa": list(QA[:k]),
        "math_reasoning": gsm[3 * k : 4 * k],
        "rag": [f"{p}\n\nAnswer the question using the passage above. {rng.choice(RAG_QUESTIONS)}" for p in passages[k:]],
    }
    return [{"question_id": f"tune-{category}-{i}", "category": category, "turns": [text]}
            for category, texts in rows.items() for i, text in enumerate(texts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "data/tuning_prompts.jsonl")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rows = build(args.seed)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} tuning prompts -> {args.out}")


if __name__ == "__main__":
    main()

"""Build the diverse training-prompt mix for the SmolLM2-135M-Instruct drafter (no Spec-Bench prompt inside).

Sources (all local, licenses in data/licenses/): GSM8K train questions (math), GPTeacher codegen (coding),
roleplay, seed tasks (writing / QA / extraction / advice), and prompts the target writes itself:
- Magpie: the target completes a bare user turn of its chat template, giving open-domain questions;
- translation: the target translates English sentences into German / French / Spanish; those outputs become
  "Translate German to English: ..." style inputs;
- summarization and reading comprehension (RAG-like) prompts built around GPTeacher passages.
Writes data/train_prompts.jsonl ({"prompt": ..., "source": ...}), deterministic for a seed.

    python recipes/smollm2/build_prompts.py --shared ../shared/data --out data/train_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hf_dynaspec.targets import load_target

MIX = dict(gsm8k=450, codegen=400, roleplay=250, seed=175, magpie=450, translation=300, summarize=250, rag=250)
LANGS = ("German", "French", "Spanish")


def read_json(path: Path) -> list[dict]:
    text = path.read_text()
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(line) for line in text.splitlines() if line.strip()]


def with_input(record: dict) -> str:
    extra = record.get("input") or ""
    return f"{record['instruction']}\n\n{extra}".strip() if extra else record["instruction"]


@torch.no_grad()
def complete(model, tokenizer, texts: list[str], max_new_tokens: int, sample: bool, batch_size: int = 24) -> list[str]:
    """Batched completions of raw texts (left padding); returns the decoded continuations."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    outs = []
    for start in tqdm(range(0, len(texts), batch_size), desc="self-prompting"):
        batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=sample, temperature=1.0, top_p=0.95,
                             top_k=0, pad_token_id=tokenizer.pad_token_id)
        outs += tokenizer.batch_decode(gen[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
    return [o.strip() for o in outs]


def chat_prefix(tokenizer, user: str | None) -> str:
    if user is None:  # Magpie: the bare start of a user turn
        text = tokenizer.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False)
        return text[: text.rindex("X")]
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)


def magpie(model, tokenizer, n: int) -> list[str]:
    raw = complete(model, tokenizer, [chat_prefix(tokenizer, None)] * int(n * 1.3), 64, sample=True)
    seen, prompts = set(), []
    for text in raw:
        text = text.split("<|im_end|>")[0].strip()
        if len(text) >= 12 and text not in seen:
            seen.add(text)
            prompts.append(text)
    return prompts[:n]


def translations(model, tokenizer, sentences: list[str], rng: random.Random) -> list[str]:
    langs = [rng.choice(LANGS) for _ in sentences]
    asks = [chat_prefix(tokenizer, f"Translate into {lang}: {s}") for lang, s in zip(langs, sentences)]
    foreign = complete(model, tokenizer, asks, 48, sample=False)
    return [f"Translate {lang} to English: {text.splitlines()[0] if text else s}" for lang, text, s in zip(langs, foreign, sentences)]


def first_sentence(text: str) -> str:
    return text.replace("\n", " ").split(". ")[0].strip()[:200]


def build(shared: Path, model, tokenizer, seed: int) -> list[dict]:
    rng = random.Random(seed)
    gsm = read_json(shared / "gsm8k/train.jsonl")
    code = read_json(shared / "gpteacher/codegen-instruct.json")
    role = read_json(shared / "gpteacher/roleplay-instruct.json")
    seed_tasks = read_json(shared / "gpteacher/seed-tasks.jsonl")
    for pool in (gsm, code, role):
        rng.shuffle(pool)
    rows = [("gsm8k", q["question"]) for q in gsm[: MIX["gsm8k"]]]
    rows += [("codegen", with_input(r)) for r in code[: MIX["codegen"]]]
    rows += [("roleplay", with_input(r)) for r in role[: MIX["roleplay"]]]
    rows += [("seed", with_input({"instruction": t["instruction"], "input": t["instances"][0].get("input", "")}))
             for t in seed_tasks[: MIX["seed"]]]
    passages = [r["response"] for r in role[MIX["roleplay"] :] if len(r["response"]) > 300]
    rows += [("summarize", f"Summarize: {p}") for p in passages[: MIX["summarize"]]]
    questions = ("What is the main point of the passage?", "Who is speaking and what do they want?",
                 "List two facts stated in the passage.", "What happens next, according to the passage?")
    rows += [("rag", f"{p}\n\nAnswer the question using the passage above. {rng.choice(questions)}")
             for p in passages[MIX["summarize"] : MIX["summarize"] + MIX["rag"]]]
    sentences = [first_sentence(q["question"]) for q in gsm[MIX["gsm8k"] : MIX["gsm8k"] + MIX["translation"]]]
    rows += [("translation", t) for t in translations(model, tokenizer, sentences, rng)]
    rows += [("magpie", p) for p in magpie(model, tokenizer, MIX["magpie"])]
    rng.shuffle(rows)
    return [{"prompt": p, "source": s} for s, p in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("data/train_prompts.jsonl"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model, tokenizer = load_target("smollm2")
    rows = build(args.shared, model, tokenizer, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()

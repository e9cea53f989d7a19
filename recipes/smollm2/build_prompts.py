"""Build the diverse training-prompt mix for the SmolLM2-135M-Instruct drafter (no Spec-Bench prompt inside).

Sources (all local, licenses in data/licenses/): GSM8K train questions (math), GPTeacher codegen (coding),
roleplay, seed tasks (writing / QA / extraction / advice), and prompts the target writes itself:
- Magpie: the target completes a bare user turn of its chat template, giving open-domain questions;
- translation: the target translates English sentences into German / French / Spanish; those outputs become
  "Translate German to English: ..." style inputs;
- summarization and reading comprehension (RAG-like) prompts built around GPTeacher passages.
Writes data/train_prompts.jsonl ({"prompt": ..., "source": ...}), deterministic for a seed; `--round 2`
writes a second, disjoint mix (see MIX2) for the second training stage.

    python recipes/smollm2/build_prompts.py --shared ../shared/data --out data/train_prompts.jsonl
    python recipes/smollm2/build_prompts.py --round 2 --seed 1 --out data/train_prompts_round2.jsonl
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
# Round 2 (`--round 2`): disjoint samples of the same pools plus news-style articles the target writes itself
# (writing prompts, then summarization / reading-comprehension prompts around the articles) and short
# factual questions, aimed at the categories the round-1 drafter accepted least (translation, summarization,
# RAG, QA).
MIX2 = dict(gsm8k=300, codegen=350, roleplay=150, magpie=400, translation=450, news=300, summarize=300, rag=300, qa=250)
LANGS = ("German", "French", "Spanish")
TOPICS = ("a city council vote", "a football final", "a new smartphone", "a heat wave", "an election result",
          "a museum opening", "a company merger", "a space launch", "a court ruling", "a music festival",
          "a vaccine trial", "a train strike", "a wildfire", "a central bank decision", "a film premiere",
          "a school reform", "a scientific discovery", "a celebrity interview", "a tech layoff", "a storm")


def read_json(path: Path) -> list[dict]:
    text = path.read_text()
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(line) for line in text.splitlines() if line.strip()]


def shuffled_pools(shared: Path, rng: random.Random) -> tuple[list[dict], list[dict], list[dict]]:
    """GSM8K train, GPTeacher codegen and roleplay records, each shuffled by `rng` in that order."""
    pools = (read_json(shared / "gsm8k/train.jsonl"), read_json(shared / "gpteacher/codegen-instruct.json"),
             read_json(shared / "gpteacher/roleplay-instruct.json"))
    for pool in pools:
        rng.shuffle(pool)
    return pools


def with_input(record: dict) -> str:
    extra = record.get("input") or ""
    return f"{record['instruction']}\n\n{extra}".strip() if extra else record["instruction"]


@torch.no_grad()
def complete(model, tokenizer, texts: list[str], max_new_tokens: int, sample: bool, batch_size: int = 48) -> list[str]:
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


def news_articles(model, tokenizer, n: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """(writing prompts, articles): the target writes short news reports on varied topics (sampled)."""
    asks = [f"Write a short news report about {rng.choice(TOPICS)}, with names, places and numbers."
            for _ in range(n)]
    articles = complete(model, tokenizer, [chat_prefix(tokenizer, a) for a in asks], 160, sample=True)
    return asks, [a for a in articles if len(a) > 300]


def factual_questions(model, tokenizer, n: int) -> list[str]:
    """Short open-domain questions (Natural-Questions style), written by the target from a seeded user turn."""
    prefix = chat_prefix(tokenizer, None) + "Quick question: who"
    raw = complete(model, tokenizer, [prefix] * int(n * 1.5), 24, sample=True)
    seen, out = set(), []
    for text in raw:
        text = "Who" + text.split("<|im_end|>")[0].split("\n")[0].rstrip()
        if text.endswith("?") and len(text) > 15 and text not in seen:
            seen.add(text)
            out.append(text)
    return out[:n]


def build_round2(shared: Path, model, tokenizer, seed: int) -> list[dict]:
    """A second, disjoint prompt mix (the round-1 pools after their first MIX items; see MIX2)."""
    rng = random.Random(seed)
    # replay round 1's shuffles (seed 0) to skip exactly the items it used
    gsm, code, role = shuffled_pools(shared, random.Random(0))
    used_gsm = MIX["gsm8k"] + MIX["translation"]
    rows = [("gsm8k", q["question"]) for q in gsm[used_gsm : used_gsm + MIX2["gsm8k"]]]
    rows += [("codegen", with_input(r)) for r in code[MIX["codegen"] : MIX["codegen"] + MIX2["codegen"]]]
    used_role = MIX["roleplay"] + MIX["summarize"] + MIX["rag"] + 200  # generous: passages came from here
    rows += [("roleplay", with_input(r)) for r in role[used_role : used_role + MIX2["roleplay"]]]
    start = used_gsm + MIX2["gsm8k"]
    sentences = [first_sentence(q["question"]) for q in gsm[start : start + MIX2["translation"] // 2]]
    sentences += [first_sentence(r["instruction"]) for r in code[-(MIX2["translation"] // 2):]]
    rows += [("translation", t) for t in translations(model, tokenizer, sentences, rng)]
    # each article serves one summarization and (for a third of them) also one reading-comprehension prompt
    asks, articles = news_articles(model, tokenizer, MIX2["summarize"] + MIX2["rag"] // 3, rng)
    rows += [("news", a) for a in asks[: MIX2["news"]]]
    lead = ("Summarize: ", "Summarize the following article.\n\n", "Write a one-paragraph summary:\n\n")
    rows += [("summarize", f"{rng.choice(lead)}{a}") for a in articles[: MIX2["summarize"]]]
    questions = ("Who is involved and what happened?", "When and where did it happen?",
                 "What numbers are reported?", "Why does it matter, according to the text?")
    rows += [("rag", f"{a}\n\nAnswer using the text above: {rng.choice(questions)}")
             for a in articles[-MIX2["rag"]:]]
    rows += [("qa", q) for q in factual_questions(model, tokenizer, MIX2["qa"])]
    rows += [("magpie", p) for p in magpie(model, tokenizer, MIX2["magpie"])]
    rng.shuffle(rows)
    return [{"prompt": p, "source": s} for s, p in rows]


def build(shared: Path, model, tokenizer, seed: int) -> list[dict]:
    rng = random.Random(seed)
    gsm, code, role = shuffled_pools(shared, rng)
    seed_tasks = read_json(shared / "gpteacher/seed-tasks.jsonl")
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
    parser.add_argument("--round", type=int, choices=(1, 2), default=1, help="2: the second, disjoint mix")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model, tokenizer = load_target("smollm2")
    rows = (build if args.round == 1 else build_round2)(args.shared, model, tokenizer, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()

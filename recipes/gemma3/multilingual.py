"""Multilingual text for the Gemma 3 corpus, written by Gemma itself, and the held-out language slices.

Gemma 3 270M is a base model trained on 140+ languages: asked few-shot to translate an English prompt
("English: ...\\n<Language>: ..." x 3, `languages.few_shot_prompt`), it writes the translation and then more
English / <Language> pairs of its own; given a numbered list of questions in a language, it writes more
(`languages.question_list_prompt`). The English prompts are those of the English corpus (`build_corpus.py`:
SmolLM2's Magpie questions and the shared GSM8K / GPTeacher mixes; one line, 15-250 characters). Four stages,
each resumable:

1. `heldout`: seeds reserved by hash (`is_reserved`: never translated into the corpus) translated into every
   language; the first line of each translation that reads as that language (`languages.in_language`) is a
   held-out prompt, --slice-size per language, in `data/multilingual_slice.jsonl` (a bench prompt file:
   question_id, category `lang-<code>`, prompt, seed); the next --tuning-size per language are tuning prompts
   (`data/tuning_prompts_multilingual.jsonl`: the tree and cluster budgets are chosen there, never on the
   slice). Nothing of this stage enters the corpus.
2. `translate`: --seeds per language of the other seeds, translated the same way into the corpus (sources
   `translate-<code>`): translation is training text too.
3. `expand`: --lists per language numbered lists of three questions read back from those translations (their
   first line and the `<Language>: ...` lines Gemma went on to write), drawn at random, for Gemma to continue
   into the corpus (sources `list-<code>`): a question costs a few tokens there, against a whole few-shot prompt
   in a translation.
4. `answer`: the questions of stages 2 and 3 that read as the language, deduplicated and never a held-out
   prompt, go to `<corpus>/multilingual_questions.jsonl` and are answered into the corpus three ways: as they are,
   as "Question: ...\\nAnswer:" and in the language's own question / answer words (sources `plain-<code>`,
   `qa-<code>`, `local-<code>`).
Answers are greedy and end where they start repeating themselves, as in `build_corpus.py`.

    for stage in heldout translate expand answer; do python recipes/gemma3/multilingual.py $stage; done
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_corpus import questions  # noqa: E402
from languages import LANGUAGES, few_shot_prompt, in_language, question_list_prompt  # noqa: E402
from vllm_engine import add_engine_arguments, answer_engine  # noqa: E402

from hf_dynaspec.targets import PROMPT_FORMATS, load_target  # noqa: E402
from hf_dynaspec.training.corpus import (  # noqa: E402
    answers_until_loop,
    eos_token_ids,
    load_corpus,
    pad_token_id,
    prompt_key,
    write_answers,
)

SLICE = Path("data/multilingual_slice.jsonl")
TUNING = Path("data/tuning_prompts_multilingual.jsonl")  # from reserved seeds too, never the slice's
QUESTIONS_NAME = "multilingual_questions.jsonl"  # in the corpus folder: the questions its answers were asked
LOOPED = re.compile(r"(.{3,}?)\1{2,}")  # a span said three times running: a greedy loop, not a question
RESERVE_EVERY = 40  # one seed in this many (by hash) is reserved for the held-out slices


def is_reserved(seed: str) -> bool:
    """Whether an English seed is held out: it is never translated into the corpus."""
    return int(prompt_key(seed)[:8], 16) % RESERVE_EVERY == 0


def english_seeds() -> list[str]:
    """One-line English prompts of the English corpus, deduplicated, in a fixed order."""
    texts = {r["prompt"].strip() for r in questions()}
    return sorted(t for t in texts if "\n" not in t and 15 <= len(t) <= 250)


def translations(answer: str, code: str) -> list[str]:
    """The questions in language `code` of a translation answer: its first line, then the text of every
    `<Language>: ...` line Gemma wrote after it, kept when they read as the language (examples excluded)."""
    name, examples = LANGUAGES[code]["name"], set(LANGUAGES[code]["examples"])
    lines = answer.split("\n")
    found = [lines[0].strip()] + [ln[len(name) + 1:].strip() for ln in lines[1:] if ln.startswith(f"{name}:")]
    return [q for q in found if 10 <= len(q) <= 300 and q not in examples and not LOOPED.search(q)
            and in_language(q, code)]


def greedy_texts(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy answers of `prompts` (plain text, ending where they loop), decoded."""
    ids = [tokenizer(p).input_ids for p in prompts]
    answers = answers_until_loop(model, ids, max_new_tokens, batch_size, pad_token_id(tokenizer, model),
                                 eos_token_ids(model), span=16, segment=max_new_tokens)
    return [tokenizer.decode(a, skip_special_tokens=True) for a in answers]


def heldout(model, tokenizer, args) -> None:
    """Stage 1: `args.slice_size` held-out prompts per language from the reserved seeds, and the next
    `args.tuning_size` as tuning prompts (for the tree and cluster budgets, never for the comparison)."""
    reserved = [s for s in english_seeds() if is_reserved(s)]
    random.Random(args.seed).shuffle(reserved)
    seeds = reserved[: args.slice_size * 2]  # translations that fail the language check are dropped
    rows, tuning = [], []
    for code in LANGUAGES:
        texts = greedy_texts(model, tokenizer, [few_shot_prompt(s, code) for s in seeds], 48, args.batch_size)
        kept = [(s, t.split("\n")[0].strip()) for s, t in zip(seeds, texts)]
        kept = [(s, q) for s, q in kept if q in translations(q, code)]
        rows += [{"question_id": f"{code}-{i:03d}", "category": f"lang-{code}", "prompt": q, "seed": s}
                 for i, (s, q) in enumerate(kept[: args.slice_size])]
        tuning += [{"question_id": f"tune-{code}-{i:03d}", "category": f"lang-{code}", "prompt": q, "seed": s}
                   for i, (s, q) in enumerate(kept[args.slice_size : args.slice_size + args.tuning_size])]
        print(f"{code}: {min(len(kept), args.slice_size)} held-out prompts from {len(seeds)} seeds")
    SLICE.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    TUNING.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in tuning))


def translate_records(seeds_per_language: int, seed: int) -> list[dict]:
    """Stage 2's records: per language, its own sample of the unreserved seeds in the few-shot prompt."""
    pool = [s for s in english_seeds() if not is_reserved(s)]
    records = []
    for i, code in enumerate(LANGUAGES):
        order = pool[:]
        random.Random(seed * 1000 + i).shuffle(order)  # a larger count keeps the smaller one's seeds
        records += [{"prompt": few_shot_prompt(s, code), "source": f"translate-{code}"}
                    for s in order[:seeds_per_language]]
    return records


def language_of(prompt: str) -> tuple[str, str] | None:
    """(language, kind) of a stage 2 or 3 prompt: a few-shot translation ("translate": its last line is
    `<Language>:`) or a question list ("list": its first line is `Questions in <Language>:`), else None."""
    first, last = prompt.split("\n", 1)[0], prompt.rsplit("\n", 1)[-1]
    for code, spec in LANGUAGES.items():
        if last == f"{spec['name']}:" and "English: " in prompt:
            return code, "translate"
        if first == f"Questions in {spec['name']}:":
            return code, "list"
    return None


def listed(answer: str, code: str) -> list[str]:
    """The questions of a question-list continuation: its first line (the item whose number ends the prompt)
    and every numbered line after it, kept when they read as the language."""
    lines = answer.split("\n")
    items = [lines[0].strip()] + [re.sub(r"^\d+\.\s*", "", ln).strip() for ln in lines[1:] if re.match(r"^\d+\.", ln)]
    return [q for q in items[: 12] if 10 <= len(q) <= 300 and not LOOPED.search(q) and in_language(q, code)
            and q not in LANGUAGES[code]["examples"]]


def read_questions(corpus: Path, tokenizer, kinds: tuple[str, ...] = ("translate", "list")) -> list[dict]:
    """Questions per language read back from the corpus's translations and question lists (`kinds`),
    deduplicated, minus the held-out prompts, in corpus order."""
    held = {json.loads(line)["prompt"] for f in (SLICE, TUNING) if f.is_file() for line in f.read_text().splitlines()}
    seen, rows = set(held), []
    for conv in load_corpus(corpus):
        if conv.source and not conv.source.startswith(("translate-", "list-")):
            continue
        prompt = tokenizer.decode(conv.input_ids[: conv.prompt_length], skip_special_tokens=True)
        found = language_of(prompt)
        if found is None or found[1] not in kinds:
            continue
        code, kind = found
        answer = tokenizer.decode(conv.input_ids[conv.prompt_length:], skip_special_tokens=True)
        if kind == "translate":
            questions = translations(answer, code)
        else:
            questions = listed(answer, code)
        for q in questions:
            if q not in seen:
                seen.add(q)
                rows.append({"prompt": q, "language": code, "kind": kind})
    return rows


def list_records(rows: list[dict], lists_per_language: int, seed: int) -> list[dict]:
    """Stage 3's records: per language, numbered lists of three of its translated questions drawn at random."""
    records = []
    for i, code in enumerate(LANGUAGES):
        pool = [r["prompt"] for r in rows if r["language"] == code and r["kind"] == "translate"]
        if len(pool) < 3:
            continue
        rng = random.Random(seed * 1000 + i)
        records += [{"prompt": question_list_prompt(rng.sample(pool, 3), code), "source": f"list-{code}"}
                    for _ in range(lists_per_language)]
    return records


def answer_records(rows: list[dict]) -> list[dict]:
    """Stage 4's records: each question asked three ways: as it is, in the English qa format the bench uses,
    and in its language's own question / answer words (`languages.LANGUAGES[code]["qa"]`)."""
    out = []
    for row in rows:
        code = row["language"]
        formats = {"plain": PROMPT_FORMATS["plain"], "qa": PROMPT_FORMATS["qa"], "local": LANGUAGES[code]["qa"]}
        out += [{"prompt": fmt.format(prompt=row["prompt"]), "source": f"{name}-{code}"} for name, fmt in formats.items()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("heldout", "translate", "expand", "answer"))
    parser.add_argument("--corpus", default="data/corpus/gemma3", help="corpus folder the stages append to")
    parser.add_argument("--slice-size", type=int, default=16, help="held-out prompts per language")
    parser.add_argument("--tuning-size", type=int, default=2, help="tuning prompts per language (after the slice's)")
    parser.add_argument("--seeds", type=int, default=150, help="English seeds translated per language (stage 2)")
    parser.add_argument("--lists", type=int, default=400, help="question lists continued per language (stage 3)")
    parser.add_argument("--max-questions", type=int, default=1000, help="questions answered per language (stage 4)")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap (stage 4)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    add_engine_arguments(parser)  # stages 2-4 (heldout reads its translations back with transformers)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.stage == "heldout":
        if args.engine == "vllm":
            raise SystemExit("--engine vllm generates stages 2-4; run heldout with transformers.")
        return heldout(*load_target("gemma3", dtype=torch.bfloat16), args)
    # transformers' segments re-read their prompt: few, long segments (lists are generated in one)
    segment = 128 if args.stage == "expand" else 96
    model, tokenizer, engine = answer_engine(args.engine, args.engine_model, args.batch_size, segment)
    records, max_new = stage_records(args, tokenizer)
    write_answers(model, tokenizer, records, args.corpus, max_new, chat_template=False, stop_repeats=16, **engine)


def stage_records(args: argparse.Namespace, tokenizer) -> tuple[list[dict], int]:
    """(records, answer length cap) of stage 2, 3 or 4."""
    if args.stage == "translate":
        return translate_records(args.seeds, args.seed), 96
    if args.stage == "expand":
        rows = read_questions(Path(args.corpus), tokenizer, ("translate",))
        return list_records(rows, args.lists, args.seed), 128
    return answer_records(questions_to_answer(args, tokenizer)), args.max_new_tokens


def questions_to_answer(args: argparse.Namespace, tokenizer) -> list[dict]:
    """Stage 4's questions: the expanded lists' questions, at most --max-questions per language, written to
    the corpus folder's QUESTIONS_NAME for inspection."""
    rows = read_questions(Path(args.corpus), tokenizer)
    per_language = {c: [r for r in rows if r["language"] == c][: args.max_questions] for c in LANGUAGES}
    rows = [r for c in LANGUAGES for r in per_language[c]]
    (Path(args.corpus) / QUESTIONS_NAME).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print({c: len(v) for c, v in per_language.items()})
    return rows


if __name__ == "__main__":
    main()

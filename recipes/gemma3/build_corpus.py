"""Stage 1 of the Gemma 3 270M (base model) drafter recipe: a token-id corpus, as the base model is used.

Gemma 3 270M is a base model: it continues text. Its prompts are built three ways, none from Spec-Bench:
- plain questions and instructions, as they are (the shared prompt mixes and the Magpie questions SmolLM2 wrote
  for its own corpus, data/corpus/smollm2/questions.jsonl);
- a simple instruction format, "Question: ...\\nAnswer:";
- plain-text continuation: the first sentences of GPTeacher responses (code and role-play) and GSM8K solutions,
  except the solutions behind the held-out code slice (data/code_slice.jsonl).
Gemma answers each greedily (bf16 batches, at most --max-new-tokens). Greedy, this small base model soon
loops (a sentence repeated to the token cap: 70% of the tokens of 192-token answers, measured on 512 prompts),
so an answer ends once it repeats a --stop-repeats-token span of itself, and answers are generated in segments
so that finished ones make room for waiting prompts (`training.corpus.answers_until_loop`): the loops' copies
are what the lookup branch drafts, the corpus keeps the text before them. Resumes after an interruption.

    python recipes/gemma3/build_corpus.py --out data/corpus/gemma3 --max-prompts 12000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_engine import add_engine_arguments, answer_engine  # noqa: E402

from hf_dynaspec.targets import PROMPT_FORMATS  # noqa: E402
from hf_dynaspec.training.corpus import prompt_key, write_answers  # noqa: E402

SHARED = Path("../shared/data")
CODE_SLICE = Path("data/code_slice.jsonl")  # held-out evaluation prompts (code_slice.py): never trained on


def questions() -> list[dict]:
    """Prompts of the SmolLM2 recipe: its Magpie questions and the shared prompt mixes."""
    files = [Path("data/corpus/smollm2/questions.jsonl"), Path("data/train_prompts.jsonl"),
             Path("data/train_prompts_round2.jsonl")]
    return [json.loads(line) for f in files if f.is_file() for line in f.read_text().splitlines()]


def continuations(rng: random.Random, count: int) -> list[dict]:
    """Opening sentences of passages (GPTeacher outputs, GSM8K train solutions) to be continued."""
    texts = []
    for name in ("gpteacher/codegen-instruct.json", "gpteacher/roleplay-instruct.json"):
        path = SHARED / name
        if path.is_file():
            texts += [r.get("response") or r.get("output") or "" for r in json.loads(path.read_text())]
    gsm8k = SHARED / "gsm8k/train.jsonl"
    if gsm8k.is_file():
        texts += [json.loads(line)["answer"] for line in gsm8k.read_text().splitlines()]
    held_out = {json.loads(line)["solution_sha"] for line in CODE_SLICE.read_text().splitlines()} \
        if CODE_SLICE.is_file() else set()
    texts = [t for t in texts if len(t) > 200 and prompt_key(t) not in held_out]
    rng.shuffle(texts)
    return [{"prompt": ". ".join(t.split(". ")[:2]).strip(), "source": "continuation"} for t in texts[:count]]


def build_records(max_prompts: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    pool = questions()
    rng.shuffle(pool)
    n_plain, n_format = int(0.45 * max_prompts), int(0.3 * max_prompts)
    plain = [{"prompt": r["prompt"], "source": f"plain-{r['source']}"} for r in pool[:n_plain]]
    formatted = [{"prompt": PROMPT_FORMATS["qa"].format(prompt=r["prompt"]), "source": f"qa-{r['source']}"}
                 for r in pool[n_plain : n_plain + n_format]]
    return plain + formatted + continuations(rng, max_prompts - n_plain - n_format)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/corpus/gemma3", help="corpus folder (commit it)")
    parser.add_argument("--max-prompts", type=int, default=12000,
                        help="prompts answered in all (keep it fixed: it decides which prompts get which format)")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap")
    parser.add_argument("--batch-size", type=int, default=32, help="prompts generated together")
    parser.add_argument("--stop-repeats", type=int, default=16, help="end an answer once it repeats a span this long")
    parser.add_argument("--segment", type=int, default=64, help="tokens generated before finished answers leave")
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling seed")
    parser.add_argument("--prompts", nargs="*", default=[],
                        help="more prompt files (JSONL: prompt, source) answered as they are into the same corpus, "
                        "e.g. data/code_prompts.jsonl (code_prompts.py)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    add_engine_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, engine = answer_engine(args.engine, args.engine_model, args.batch_size, args.segment)
    records = build_records(args.max_prompts, args.seed)
    records += [json.loads(line) for f in args.prompts for line in Path(f).read_text().splitlines()]
    print(f"{len(records)} prompts: {sum(r['source'].startswith('plain') for r in records)} plain, "
          f"{sum(r['source'].startswith('qa') for r in records)} question/answer, "
          f"{sum(r['source'] == 'continuation' for r in records)} continuations, "
          f"{sum(r['source'].startswith('code-') for r in records)} code")
    write_answers(model, tokenizer, records, args.out, args.max_new_tokens, chat_template=False,
                  stop_repeats=args.stop_repeats, **engine)


if __name__ == "__main__":
    main()

"""Does speculative sampling change the answers? GSM8K test questions, plain vs DynaSpec generation.

Four methods answer every question: plain and DynaSpec sampling (temperature 0.7, top-p 0.9; independent seeds
per question and method) and plain and DynaSpec greedy. Final answers (the last number of a reply) are scored
against GSM8K's with the local `exact_match` module; the sampled methods' correctness is compared with a paired
McNemar test (`mcnemar`), and the greedy texts of both methods with `exact_match` (it must be 1.0). Records are
appended to `records.jsonl` per question, so a stopped run resumes; results.json, results.md and plots
(accuracy with 95% intervals, answer-length distributions) are regenerated from them.

    hf-dynaspec quality --target tiny --drafter /tmp/tiny-drafter --limit 2 --max-new-tokens 16 --out /tmp/q
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .evaluation import load as load_module
from .generation_config import DynaSpecGenerationConfig
from .targets import encode_prompt

DEFAULT_QUESTIONS = Path(__file__).resolve().parent.parent / "data" / "gsm8k" / "test.jsonl"
INSTRUCTION = "Solve this math problem step by step. End with 'The answer is' and the number.\n\n"
SAMPLING = dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)
METHODS = ("plain-sample", "dynaspec-sample", "plain-greedy", "dynaspec-greedy")
SEED_OFFSET = {"plain-sample": 1_000_000, "dynaspec-sample": 2_000_000}  # independent seeds per method
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass
class Answer:
    index: int
    method: str
    text: str
    answer: str
    reference: str
    correct: bool
    new_tokens: int
    seconds: float
    stats: dict | None = None


def load_questions(path: str | Path | None = None, limit: int | None = None) -> list[dict]:
    """GSM8K records (`question`, `answer` ending in '#### N') with the reference number split off."""
    path = Path(path) if path else DEFAULT_QUESTIONS
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = [{"index": i, "question": r["question"], "reference": final_number(r["answer"].split("####")[-1])}
           for i, r in enumerate(rows)]
    return out[:limit] if limit else out


def final_number(text: str) -> str:
    """The last number in `text`, normalised ("1,200.50" -> "1200.5"), or "" when there is none."""
    numbers = NUMBER.findall(text)
    if not numbers:
        return ""
    value = numbers[-1].replace(",", "").rstrip(".")
    return value.rstrip("0").rstrip(".") if "." in value else value


@torch.no_grad()
def answer(target, tokenizer, drafter, question: dict, method: str, max_new_tokens: int) -> Answer:
    """One method's reply to one question."""
    ids = encode_prompt(tokenizer, INSTRUCTION + question["question"])
    sample = method.endswith("sample")
    settings = dict(SAMPLING) if sample else dict(do_sample=False)
    if sample:
        torch.manual_seed(SEED_OFFSET[method] + question["index"])
    start = time.perf_counter()
    if method.startswith("plain"):
        out, stats = target.generate(ids, max_new_tokens=max_new_tokens, **settings), None
    else:
        config = DynaSpecGenerationConfig(max_new_tokens=max_new_tokens, return_dict_in_generate=True, **settings)
        result = target.generate(ids, generation_config=config, assistant_model=drafter)
        out, stats = result.sequences, result.speculative_stats.to_dict()
    seconds = time.perf_counter() - start
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    got = final_number(text)
    return Answer(question["index"], method, text, got, question["reference"], got == question["reference"],
                  out.shape[1] - ids.shape[1], seconds, stats)


def run_quality(target, tokenizer, drafter, questions: list[dict], max_new_tokens: int,
                records_path: Path) -> list[Answer]:
    """Every method on every question; records appended per question, questions already there skipped."""
    records = load_answers(records_path)
    counts = Counter(a.index for a in records)
    done = {index for index, count in counts.items() if count == len(METHODS)}
    records = [a for a in records if a.index in done]
    todo = [q for q in questions if q["index"] not in done]
    for question in tqdm(todo, desc="quality", unit="question", initial=len(questions) - len(todo),
                         total=len(questions)):
        rows = [answer(target, tokenizer, drafter, question, method, max_new_tokens) for method in METHODS]
        records += rows
        with open(records_path, "a") as file:
            file.writelines(json.dumps(asdict(a)) + "\n" for a in rows)
    return records


def load_answers(path: Path) -> list[Answer]:
    if not path.is_file():
        return []
    return [Answer(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def summarize_quality(records: list[Answer]) -> dict:
    """Accuracy per method (exact match of final answers, 95% Wilson interval), McNemar between the sampled
    methods, greedy text agreement, and answer lengths."""
    by_method = {m: sorted((a for a in records if a.method == m), key=lambda a: a.index) for m in METHODS}
    indices = [a.index for a in by_method[METHODS[0]]]
    if any([a.index for a in rows] != indices for rows in by_method.values()):
        raise ValueError("records do not hold every method for the same questions; rerun to complete them")
    exact_match = load_module("exact_match")
    methods = {}
    for method, rows in by_method.items():
        score = exact_match.compute(predictions=[a.answer for a in rows], references=[a.reference for a in rows])
        lengths = [a.new_tokens for a in rows]
        methods[method] = dict(
            accuracy=score["exact_match"], correct=score["matches"], questions=score["items"],
            accuracy_ci=wilson(score["matches"], score["items"]),
            mean_length=statistics.fmean(lengths), median_length=statistics.median(lengths),
            tokens_per_s=sum(lengths) / sum(a.seconds for a in rows),
        )
    paired = load_module("mcnemar").compute(
        predictions1=[int(a.correct) for a in by_method["dynaspec-sample"]],
        predictions2=[int(a.correct) for a in by_method["plain-sample"]],
    )
    greedy = exact_match.compute(predictions=[a.text for a in by_method["dynaspec-greedy"]],
                                 references=[a.text for a in by_method["plain-greedy"]])
    return {"questions": len(indices), "methods": methods, "mcnemar_dynaspec_vs_plain_sampling": paired,
            "greedy_text_exact_match": greedy["exact_match"]}


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def markdown(summary: dict, meta: dict) -> str:
    paired = summary["mcnemar_dynaspec_vs_plain_sampling"]
    rows = ["| method | accuracy (95% interval) | correct | mean / median answer tokens | tok/s |", "|---|---|---|---|---|"]
    for method, m in summary["methods"].items():
        lo, hi = m["accuracy_ci"]
        rows.append(f"| {method} | {m['accuracy']:.1%} ({lo:.1%}-{hi:.1%}) | {m['correct']}/{m['questions']} | "
                    f"{m['mean_length']:.0f} / {m['median_length']:.0f} | {m['tokens_per_s']:.1f} |")
    lo, hi = paired["difference_ci"]
    verdict = "not significant" if paired["p_value"] > 0.05 else "significant: see the records"
    return "\n".join([
        "\n".join(f"- {k}: {v}" for k, v in meta.items()),
        "",
        *rows,
        "",
        f"Sampling, DynaSpec vs plain on the same {summary['questions']} questions: accuracy difference "
        f"{paired['difference']:+.1%} (95% interval {lo:+.1%} to {hi:+.1%}), discordant pairs "
        f"{paired['discordant'][0]} / {paired['discordant'][1]}, McNemar p = {paired['p_value']:.3f} ({verdict}).",
        f"Greedy: DynaSpec texts equal plain greedy texts on {summary['greedy_text_exact_match']:.1%} of the questions.",
    ])


def plot_quality(records: list[Answer], summary: dict, out: Path) -> list[Path]:
    """accuracy.png (per method, 95% intervals) and answer_lengths.png (distribution per method)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(summary["methods"])
    acc = [summary["methods"][m]["accuracy"] for m in names]
    err = [[a - summary["methods"][m]["accuracy_ci"][0] for a, m in zip(acc, names)],
           [summary["methods"][m]["accuracy_ci"][1] - a for a, m in zip(acc, names)]]
    ax.bar(names, acc, yerr=err, capsize=4, color=["#888", "#c44", "#888", "#c44"])
    ax.set_ylabel("GSM8K exact match")
    fig.tight_layout()
    paths = [out / "accuracy.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for method in METHODS:
        ax.hist([a.new_tokens for a in records if a.method == method], bins=20, histtype="step", label=method)
    ax.set_xlabel("answer tokens")
    ax.set_ylabel("questions")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "answer_lengths.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def write_quality(records: list[Answer], out: Path, meta: dict) -> dict:
    summary = summarize_quality(records)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1))
    (out / "results.md").write_text(markdown(summary, meta) + "\n")
    plot_quality(records, summary, out)
    return summary

"""Root recall of the drafter's shortlists on a held-out slice, at every position of plain greedy's continuation.

The root of each draft tree is the drafter's first step, teacher-forced: it reads the target's features of the
last accepted position and proposes the next token from its shortlist. This script replays that step at every
position of the continuation plain greedy wrote in a bench run (`output_ids` of its `plain` records), and asks,
per category, whether two tokens are inside each shortlist:
- the target's next token (what verification accepts), and
- the drafter's own top-1 over the whole vocabulary (what the full head would draft: a shortlist that drops it
  costs acceptance the full head had).
Shortlists: DynaSpec's (the router's k0 clusters, as the bench's `dynaspec` method builds them) and every static
list the bench ran (`static[static_size=N]`: the equal-size list; `static`: all stored tokens). The bench's own
recall counts only the roots decoding reached; this one counts every position, the same for every method.

    python recipes/gemma3/root_recall.py --target gemma3 --drafter runs/gemma3-ml/ckpt \
        --bench benchmarks/results/cpu-gemma3-ml-languages --prompts data/multilingual_slice.jsonl --prompt-format qa

`multilingual_report.py` adds each slice's table to its report.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hf_dynaspec import DynaSpecDrafter, DynaSpecGenerationConfig
from hf_dynaspec.bench import method_settings, read_records
from hf_dynaspec.bench_prompts import load_bench_prompts
from hf_dynaspec.generation_config import resolve_draft_settings
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import encode_formatted, load_target
from hf_dynaspec.training.corpus import CorpusConversation
from hf_dynaspec.training.data import Conversation
from hf_dynaspec.training.features import padded_states
from hf_dynaspec.training.losses import unrolled_steps
from hf_dynaspec.training.trainer import collate, window

NAME = "root_recall"  # root_recall.json / .md, written beside the bench run's results


def continuations(records) -> dict[str, list[int]]:
    """Plain greedy's new tokens per question id, from a bench run's `plain` records."""
    found = {r.question_id: r.output_ids for r in records if r.method == "plain" and r.output_ids}
    if not found:
        raise ValueError("The bench run stores no plain outputs (`output_ids`, written since the bench records "
                         "them): rerun its plain method, or pass a run measured since.")
    return found


def method_draft_settings(drafter, method: str):
    """The `DraftSettings` a bench method decodes with (its own settings over the drafter's defaults)."""
    return resolve_draft_settings(DynaSpecGenerationConfig(**(method_settings(method) or {})),
                                  drafter.generation_config, drafter.config)


def static_sizes(drafter, records) -> dict[str, int]:
    """{method: static_size} of the static lists the bench ran (no size: all the stored tokens), one method per
    size (the shortest name: `static[static_size=N]` rather than its variant without the lookup branch)."""
    sizes: dict[int, str] = {}
    for method in sorted({r.method for r in records}, key=len):
        if (method_settings(method) or {}).get("head_mode") == "static":
            size = int(method_draft_settings(drafter, method).static_size or drafter.bound_head.static_ranking.numel())
            sizes.setdefault(size, method)
    return {method: size for size, method in sorted(sizes.items())}


@torch.no_grad()
def root_steps(target, drafter, input_ids: torch.Tensor, prompt_length: int) -> tuple[torch.Tensor, ...]:
    """The drafter's teacher-forced first step at every position that predicts a continuation token:
    (features (n, d), router_logits (n, M), next_tokens (n,)), n = continuation length - 1 (the first new token
    comes from the target's prefill: no root drafts it)."""
    conv = CorpusConversation(input_ids, prompt_length)
    hidden, aux, spans = padded_states(target, [conv], list(drafter.config.feature_layer_ids))
    # position j reads (h_j, x_{j+1}) and predicts x_{j+2}; roots read a new token: x_{j+1} in the continuation
    loss_mask = torch.arange(input_ids.numel()) >= prompt_length + 1  # (L,) marks the x_{j+2} that count
    data = Conversation(input_ids, loss_mask, hidden[0, spans[0]].cpu(), aux[0, spans[0]].cpu(),
                        tuple(drafter.config.feature_layer_ids))
    batch = collate([window(data, 0, input_ids.numel())])
    features, router_logits, valid = unrolled_steps(drafter, batch, 1)[0]
    positions = valid[0].nonzero(as_tuple=True)[0]  # (n,) drafter position j predicts x_{j+2}
    return features[0, positions], router_logits[0, positions], input_ids[positions + 2]


def prompt_hits(drafter, features, router_logits, next_tokens, k0: int, sizes: dict[str, int]) -> dict[str, dict]:
    """Per shortlist ("dynaspec" and each static method): positions whose next token / whose full-head top-1 is
    inside it, whose own top-1 (the root draft it makes) is the next token, and its summed size; plus the full
    head's top-1 agreement with the next token."""
    head, vocab = drafter.bound_head, drafter.config.vocab_size
    top1 = drafter.dense_logits(features).argmax(-1)  # (n,)
    outputs = {"dynaspec": head.logits(features, "dynamic", router_logits, k0)}
    outputs |= {method: head.logits(features, "static", static_size=size) for method, size in sizes.items()}
    asked = torch.stack([next_tokens, top1], dim=1)  # (n, 2)
    hits = {}
    for name, out in outputs.items():
        logits = out.to_vocab(vocab)  # (n, V): -inf outside the shortlist
        inside = logits.gather(1, asked).isfinite().sum(0)  # (2,)
        right = int((logits.argmax(-1) == next_tokens).sum())  # its root draft is the token verification accepts
        hits[name] = {"next": int(inside[0]), "top1": int(inside[1]), "draft": right,
                      "size": float(out.shortlist_sizes.float().sum())}
    hits["full head"] = {"next": int((top1 == next_tokens).sum())}  # top-1 agreement, not a shortlist
    return hits


def add_hits(total: dict, hits: dict, positions: int) -> None:
    total["positions"] = total.get("positions", 0) + positions
    for name, counts in hits.items():
        for key, value in counts.items():
            total.setdefault(name, {}).setdefault(key, 0)
            total[name][key] += value


def rates(total: dict) -> dict:
    """Counts -> recall against the next token and the full-head top-1, mean shortlist size."""
    n = max(total["positions"], 1)
    out = {"positions": total["positions"]}
    for name, counts in total.items():
        if name != "positions":
            out[name] = {key: (value / n) for key, value in counts.items()}
    return out


def measure(target, tokenizer, drafter, prompts: list[dict], records, prompt_format: str, method: str) -> dict:
    """Per category and overall: `rates` of every shortlist over the slice's continuations."""
    outputs = continuations(records)
    settings = method_draft_settings(drafter, method)
    sizes = static_sizes(drafter, records)
    totals: dict[str, dict] = defaultdict(dict)
    for row in tqdm([p for p in prompts if p["question_id"] in outputs], desc="root recall", unit="prompt"):
        prompt_ids = encode_formatted(tokenizer, row["prompt"], prompt_format)[0]
        input_ids = torch.cat([prompt_ids, torch.tensor(outputs[row["question_id"]], dtype=torch.long)])
        features, router_logits, next_tokens = root_steps(target, drafter, input_ids, prompt_ids.numel())
        hits = prompt_hits(drafter, features, router_logits, next_tokens, settings.shortlist_k0, sizes)
        for category in (row["category"], "overall"):
            add_hits(totals[category], hits, next_tokens.numel())
    return {"meta": {"method": method, "shortlist_k0": settings.shortlist_k0, "static_sizes": sizes,
                     "machine": machine_description()},
            "categories": {category: rates(totals[category])
                           for category in sorted(totals, key=lambda c: (c == "overall", c))}}


def markdown(result: dict) -> str:
    """One row per category: recall of the next token and of the full-head top-1, per shortlist."""
    names = [n for n in result["categories"]["overall"] if n not in ("positions", "full head")]
    head = " | ".join(f"{n}: next / top-1 / draft (size)" for n in names)
    lines = [f"Root recall at every continuation position (k0 = {result['meta']['shortlist_k0']} clusters); "
             "next: the target's next token, top-1: the drafter's full-head top-1, in the shortlist; draft: the "
             "shortlist's own top-1 is the next token (the root draft verification accepts; the full head's rate "
             "is the third column).", "",
             f"| category | positions | full-head top-1 = next | {head} |", "|---" * (3 + len(names)) + "|"]
    for category, row in result["categories"].items():
        cells = " | ".join(f"{row[n]['next']:.1%} / {row[n]['top1']:.1%} / {row[n]['draft']:.1%} "
                           f"({row[n]['size']:,.0f})" for n in names)
        lines.append(f"| {category} | {row['positions']:,} | {row['full head']['next']:.1%} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="gemma3")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--bench", type=Path, required=True, help="bench run folder (records.jsonl with plain outputs)")
    parser.add_argument("--prompts", default=None, help="the prompts file that bench run read (default: Spec-Bench)")
    parser.add_argument("--prompt-format", default="qa")
    parser.add_argument("--method", default="dynaspec", help="the bench method whose shortlist budget is measured")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target).eval()
    records = read_records(args.bench / "records.jsonl")
    result = measure(target, tokenizer, drafter, load_bench_prompts(args.prompts), records, args.prompt_format,
                     args.method)
    (args.bench / f"{NAME}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.bench / f"{NAME}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

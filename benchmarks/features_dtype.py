"""Which dtype the features pass (`hf-dynaspec features`) should run the target in on CPU, float32 or bfloat16:
its speed, and how far bfloat16's features are from float32's where the drafter uses them.

The features are stored as bfloat16 either way (Gemma's residual stream exceeds float16), so float32's forward
already loses its low bits at storage; the question is what a bfloat16 forward loses on top. On a sample of the
corpus's conversations spread over its sources (every --every-th), both forwards alternate for --rounds rounds
(tokens/s each), and on --positions of those positions we compare, against float32's exact hidden states:
- the target's top-1 (`lm_head(norm hidden)` over the full vocabulary) from the stored float32 features and from
  the stored bfloat16-forward features (the loss's target is this distribution);
- the relative error of the stored final hidden state and of the EAGLE-3 layers (`aux`, the drafter's input).

    python benchmarks/features_dtype.py --target gemma3 --corpus data/corpus/gemma3 \\
        --out benchmarks/results/cpu-gemma3-features-dtype
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from results_io import save_results

from hf_dynaspec.configuration import eagle3_layer_ids
from hf_dynaspec.machine import machine_description
from hf_dynaspec.targets import load_target
from hf_dynaspec.training.corpus import load_corpus, stored_features
from hf_dynaspec.training.features import batches_by_tokens, forward_features, padded_states

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def passes(targets: dict, convs: list, layer_ids: list[int], max_tokens: int, rounds: int) -> tuple[dict, dict]:
    """({dtype: tokens/s per round}, {dtype: (hidden (N, d), aux (N, k * d)) float32 of the stored bf16 bits})."""
    groups = batches_by_tokens(convs, max_tokens)
    tokens = sum(c.input_ids.numel() for c in convs)
    speed, stored = {name: [] for name in targets}, {}
    for target in targets.values():  # warm-up: first-call allocations and kernel choices
        forward_features(target, [convs[i] for i in groups[0]], layer_ids, "bfloat16")
    for _ in range(rounds):
        for name, target in targets.items():
            start, rows = time.perf_counter(), []
            for group in groups:
                rows += forward_features(target, [convs[i] for i in group], layer_ids, "bfloat16")
            speed[name].append(tokens / (time.perf_counter() - start))
            stored[name] = tuple(torch.cat([stored_features(r[j], "bfloat16").float() for r in rows]) for j in (0, 1))
    return speed, stored


def exact_states(target, convs: list, layer_ids: list[int], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32's hidden (N, d) and aux (N, k * d) before storage, in `passes`' row order."""
    hidden, aux = [], []
    for group in batches_by_tokens(convs, max_tokens):
        batch_hidden, batch_aux, spans = padded_states(target, [convs[i] for i in group], layer_ids)
        hidden += [batch_hidden[row, span] for row, span in enumerate(spans)]
        aux += [batch_aux[row, span] for row, span in enumerate(spans)]
    return torch.cat(hidden), torch.cat(aux)


def relative_error(x: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean over rows of |x - exact| / |exact| (L2 norms per row)."""
    return float(((x - exact).norm(dim=-1) / exact.norm(dim=-1).clamp_min(1e-6)).mean())


def agreement(head: torch.nn.Module, exact: torch.Tensor, stored: dict, rows: torch.Tensor) -> dict:
    """Per dtype: the share of `rows` where head(stored) has float32's exact top-1."""
    truth = head(exact[rows]).argmax(-1)  # (P,)
    return {name: float((head(h[rows]).argmax(-1) == truth).float().mean()) for name, (h, _) in stored.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="gemma3")
    parser.add_argument("--corpus", default="data/corpus/gemma3")
    parser.add_argument("--every", type=int, default=200, help="take every N-th conversation of the corpus")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--positions", type=int, default=2048, help="positions whose full-vocabulary top-1 is compared")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    convs = load_corpus(args.corpus)[:: args.every]
    targets = {name: load_target(args.target, dtype=dtype)[0] for name, dtype in DTYPES.items()}
    layer_ids = eagle3_layer_ids(targets["float32"].config.get_text_config().num_hidden_layers)
    speed, stored = passes(targets, convs, layer_ids, args.max_tokens, args.rounds)
    exact_hidden, exact_aux = exact_states(targets["float32"], convs, layer_ids, args.max_tokens)
    rows = torch.randperm(exact_hidden.shape[0], generator=torch.Generator().manual_seed(0))[: args.positions]
    with torch.no_grad():
        top1 = agreement(targets["float32"].get_output_embeddings(), exact_hidden, stored, rows)
    result = {
        "machine": machine_description(), "threads": args.threads, "conversations": len(convs),
        "tokens": sum(c.input_ids.numel() for c in convs), "rounds": args.rounds, "positions": len(rows),
        "tokens_per_s": speed, "top1_agreement": top1,
        "hidden_relative_error": {n: relative_error(h, exact_hidden) for n, (h, _) in stored.items()},
        "aux_relative_error": {n: relative_error(a, exact_aux) for n, (_, a) in stored.items()},
    }
    print(save_results(args.out, result, report))


def report(r: dict) -> str:
    lines = [f"The features pass's forward dtype: {r['conversations']} conversations ({r['tokens']:,} tokens) of the "
             f"corpus, {r['rounds']} alternating rounds, {r['machine']}; top-1 over the full "
             f"vocabulary on {r['positions']:,} positions against float32's unstored states. Features stored as "
             "bfloat16 in both. `python benchmarks/features_dtype.py`", "",
             "| forward | tokens/s (per round) | vs float32 | top-1 = float32's | hidden rel. error | aux rel. error |",
             "|---|---|---|---|---|---|"]
    base = sum(r["tokens_per_s"]["float32"]) / len(r["tokens_per_s"]["float32"])
    for name, rounds in r["tokens_per_s"].items():
        mean = sum(rounds) / len(rounds)
        lines.append(f"| {name} | {mean:.0f} ({', '.join(f'{x:.0f}' for x in rounds)}) | {mean / base:.2f}x | "
                     f"{r['top1_agreement'][name]:.4f} | {r['hidden_relative_error'][name]:.4f} | "
                     f"{r['aux_relative_error'][name]:.4f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

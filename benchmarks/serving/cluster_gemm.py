"""The plugin head's cost per draft call on a CPU: its clusters scored by `torch.mm` (ops.segmented_lm_head) and by
vLLM's packed oneDNN matmul (hf_dynaspec/vllm_plugin/onednn.py), beside vLLM's own matmul over a static draft
vocabulary of 32,768 rows (what the static EAGLE-3 export runs), at 1 and 8 rows. Runs in vLLM's environment on
the folders `benchmarks/serving/run.sh` writes (the target's, to read its LM head; the vllm-dynaspec export's
router and clusters). The router reads random inputs: the union sizes are in the table. Writes cluster_gemm.json /
.md into --out and prints the table.

    .venv-vllm/bin/python benchmarks/serving/cluster_gemm.py --target /tmp/hf-dynaspec-serving/gemma3 \
        --draft /tmp/hf-dynaspec-serving/gemma3-dynaspec --out benchmarks/results/cpu-vllm-gemma3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the head benchmark's timer
from bench_head import median_ms  # noqa: E402

from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.vllm_export import read_head  # noqa: E402
from hf_dynaspec.vllm_plugin.onednn import onednn_cluster_gemm  # noqa: E402

STATIC_ROWS = 32768
CPU = torch.device("cpu")


def lm_head_weight(target: Path) -> torch.Tensor:
    """(V, d) fp32: the target's LM head (its tied embedding where it has no lm_head)."""
    with safe_open(target / "model.safetensors", "pt") as f:
        names = [n for n in f.keys() if n.endswith("lm_head.weight")] or [n for n in f.keys() if "embed_tokens" in n]
        return f.get_tensor(names[0]).float()


def measure(head, router, gemm, static_mm, rows: int, k: int, repeats: int) -> dict:
    """One row of the table: ms per head call with torch.mm and with the packed `gemm`, ms of the static head's
    matmul `static_mm` on the same rows, and the union's size."""
    generator = torch.Generator().manual_seed(rows)
    features = torch.randn(rows, head.weight.shape[1], generator=generator)  # (B, d)
    with torch.no_grad():
        router_logits = router(torch.randn(rows, router.up.in_features, generator=generator))  # (B, M)

    def call():
        return head.logits(features, "dynamic", router_logits, k)

    head.cluster_gemm = None  # ops.segmented_lm_head
    torch_out = call()
    torch_ms = median_ms(call, repeats, 1, CPU)
    head.use_cluster_gemm(gemm)
    onednn_out = call()
    onednn_ms = median_ms(call, repeats, 1, CPU)
    torch.testing.assert_close(onednn_out.logits, torch_out.logits, rtol=1e-4, atol=1e-3)  # same scores
    static_ms = median_ms(lambda: static_mm(features), repeats, 1, CPU)
    union = int(torch_out.token_ids.numel())
    return {"rows": rows, "clusters_per_row": k, "union_tokens": union, "torch_mm_ms": torch_ms,
            "onednn_ms": onednn_ms, "static_32k_onednn_ms": static_ms}


def markdown(results: dict) -> str:
    lines = [f"Plugin head per draft call (cluster choice, GEMMs, masking; router excluded), {results['machine']}, "
             f"fp32, random router "
             f"inputs, median of {results['repeats']} calls. `python benchmarks/serving/cluster_gemm.py`", "",
             "| rows | clusters per row | union (tokens) | torch.mm (ms) | oneDNN (ms) | static 32k, vLLM's oneDNN matmul "
             "only (ms) |", "|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['rows']} | {r['clusters_per_row']} | {r['union_tokens']:,} | {r['torch_mm_ms']:.2f} | "
                     f"{r['onednn_ms']:.2f} | {r['static_32k_onednn_ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="the target's folder (benchmarks/serving/run.sh)")
    parser.add_argument("--draft", type=Path, required=True, help="a vllm-dynaspec export folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weight = lm_head_weight(args.target)
    head, router, settings = read_head(args.draft, weight)
    gemm = onednn_cluster_gemm(head.weight_by_cluster, head.offsets)  # packed once, as the plugin does
    if gemm is None:
        raise SystemExit("This vLLM build has no oneDNN matmul (vllm._custom_ops._supports_onednn): nothing to compare.")
    from vllm import _custom_ops as ops

    static = ops.create_onednn_mm(weight[:STATIC_ROWS].t(), 32)  # as vLLM packs a static draft head

    def static_mm(features: torch.Tensor) -> torch.Tensor:
        return ops.onednn_mm(static, features, None)

    budgets = sorted({settings["shortlist_k0"], settings["shortlist_k1"]}, reverse=True)
    rows = [measure(head, router, gemm, static_mm, b, k, args.repeats) for b in (1, 8) for k in budgets]
    results = {"machine": machine_description(), "threads": args.threads, "repeats": args.repeats, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cluster_gemm.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (args.out / "cluster_gemm.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

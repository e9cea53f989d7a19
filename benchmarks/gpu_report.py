"""results.md of the GPU suite, made from its results.json only (`benchmarks/gpu_suite.py` writes both).

    python -c "import sys, json; sys.path.insert(0, 'benchmarks'); import gpu_report as r; print(r.render_markdown(json.load(open('benchmarks/results/gpu-h200/results.json'))))"
"""

from __future__ import annotations

from typing import Any

from gpu_common import (  # noqa: E402
    SECTIONS,
)

# ---------------------------------------------------------------------------------------------- markdown


def fmt(value: Any, digits: int = 4) -> str:
    """A cell: floats to `digits` significant digits (thousands separated from 1e4), lists and dicts inline."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 1e4 else str(value)
    if isinstance(value, list):
        return ", ".join(fmt(v, 3) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v, 3)}" for k, v in list(value.items())[:6])
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[str]:
    """Markdown table of `rows` with (key, header) columns; a percentage where the key ends in _pct."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for key, _ in columns:
            if key.endswith("_pct"):
                value = row.get(key.removesuffix("_pct"))
                cells.append("" if value is None else f"{100 * value:.1f}%")
            else:
                cells.append(fmt(row.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


HEAD_COLUMNS = [("vocab", "V"), ("d", "d"), ("rows", "N"), ("share_pct", "shortlist"), ("shortlist", "S"),
                ("dense_ms", "dense ms"), ("index_select_ms", "idx+mm ms"), ("triton_ms", "Triton ms"),
                ("speedup_triton_vs_index_select", "Triton speedup"), ("roofline_ms", "roofline ms"),
                ("triton_roofline_fraction_pct", "Triton % roofline"),
                ("index_select_roofline_fraction_pct", "idx+mm % roofline"),
                ("dense_roofline_fraction_pct", "dense % roofline"), ("triton_max_abs_err", "Triton max err")]
TUNE_COLUMNS = [("vocab", "V"), ("d", "d"), ("rows", "N"), ("share_pct", "shortlist"), ("roofline_ms", "roofline ms"),
                ("default_ms", "default ms"), ("default_roofline_fraction_pct", "default % roofline"),
                ("best_launch", "best block_s/block_k/warps/stages"), ("best_ms", "best ms"),
                ("best_roofline_fraction_pct", "best % roofline"), ("failed_configs", "configs failed")]
DRAFTER_COLUMNS = [("shape", "target"), ("d", "d"), ("vocab", "V"), ("positions", "T"), ("head_mode", "head"),
                   ("shortlist_mean", "shortlist"), ("step_beside_ms", "step ms (router beside)"),
                   ("step_sequential_ms", "step ms (sequential)"), ("overlap_saving_ms", "saved ms"),
                   ("router_ms", "router ms"), ("head_ms", "head ms")]
STEP_COLUMNS = [("shape", "target"), ("d", "d"), ("vocab", "V"), ("positions", "F"), ("head_mode", "head"),
                ("eager_ms", "eager ms"), ("graphed_ms", "graphed ms"), ("graph_speedup", "graph speedup"),
                ("vs_full_step", "vs full head (graphed)"), ("same_children", "same drafts"),
                ("max_log_q_diff", "max log q diff"), ("fallback", "capture fallback")]
EXACT_COLUMNS = [("target", "target"), ("dtype", "dtype"), ("tree", "tree"), ("runs", "runs"),
                 ("identical_share_pct", "identical"), ("first_divergences", "first divergence (token)"),
                 ("logit_gaps", "logit gap there")]
SYNC_COLUMNS = [("target", "target"), ("tree", "tree"), ("drafting", "drafting"), ("steps", "steps"), ("mean", "syncs/step mean"),
                ("max", "max"), ("tokens_per_step", "tokens/step"), ("by_kind", "per step by kind")]

BATCH_COLUMNS = [("batch_size", "B"), ("method", "method"), ("ms", "ms per call"), ("tokens_per_s", "tokens/s"),
                 ("speedup", "vs plain"), ("identical_rows", "rows identical"), ("rows", "rows")]
TREE_COLUMNS = [("tree", "tree"), ("steps", "steps"), ("tokens_per_step", "tokens/step"),
                ("tree_nodes_per_step", "nodes/step"), ("step_ms", "ms/step"), ("cost", "cost (plain steps)")]


def verify_table(rows: list[dict[str, Any]]) -> list[str]:
    """n down, (context, mask) across: ms and c(n)/c(1)."""
    keys = sorted({(r["context"], r["mask"]) for r in rows}, key=lambda k: (k[0], k[1] != "tree"))
    cells = {(r["context"], r["mask"], r["nodes"]): r for r in rows}
    lines = ["| n | " + " | ".join(f"ctx {c} {m}: ms | c(n)/c(1)" for c, m in keys) + " |",
             "|---|" + "---|---|" * len(keys)]
    for n in sorted({r["nodes"] for r in rows}):
        parts = [f"{fmt(cells[(c, m, n)]['ms'])} | {fmt(cells[(c, m, n)]['cost'], 3)}" if (c, m, n) in cells
                 else " | " for c, m in keys]
        lines.append(f"| {n} | " + " | ".join(parts) + " |")
    return lines


def tune_table(cases: list[dict[str, Any]]) -> list[str]:
    rows = []
    for case in cases:
        best = case.get("best") or {}
        launch = "/".join(str(best.get(k, "-")) for k in ("block_s", "block_k", "num_warps", "num_stages"))
        failed = sum("error" in c for c in case["configs"])
        rows.append({**case, "best_launch": launch, "best_ms": best.get("ms"),
                     "best_roofline_fraction": best.get("roofline_fraction"), "failed_configs": failed})
    return table(rows, TUNE_COLUMNS)


def section_markdown(name: str, data: dict[str, Any]) -> list[str]:
    meta = data.get("meta", {})
    lines = [f"## {name}", "", f"{meta.get('device', '?')}, {fmt(data.get('seconds'), 1)} s, "
             f"{'quick' if meta.get('quick') else 'full'} run of {meta.get('timestamp', '?')}", ""]
    if name == "head":
        lines += table(data["rows"], HEAD_COLUMNS)
        lines += ["", "Summary: " + fmt(data.get("summary", {}))]
        if data.get("tune"):
            lines += ["", "Triton launch configs swept (best of each case):", ""] + tune_table(data["tune"])
    elif name == "verify":
        lines += [f"Model: {fmt(data.get('model', {}))}", ""] + verify_table(data["rows"])
    elif name == "drafter":
        lines += table(data["rows"], DRAFTER_COLUMNS)
    elif name == "steps":
        lines += table(data["rows"], STEP_COLUMNS)
    elif name == "exactness":
        lines += table(data["summary"], EXACT_COLUMNS)
        shares = data.get("identical_share_by_dtype", {})
        lines += ["", "Identical outputs: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares.items())]
    elif name == "syncs":
        lines += table(data["rows"], SYNC_COLUMNS)
    elif name == "batch":
        lines += [f"{data['dtype']}, {data['new_tokens']} new tokens per row.", ""] + table(data["rows"], BATCH_COLUMNS)
    elif name == "trees":
        lines += [f"Plain decoding: {fmt(data['plain_ms_per_token'])} ms per token after {data['context']} prompt "
                  "tokens.", ""] + table(data["rows"], TREE_COLUMNS)
    lines += [""] + [f"- {note}" for note in data.get("notes", [])] + [""]
    return lines


def step_shares(sections: dict[str, Any]) -> list[str]:
    """The Llama-3.1-8B-shaped draft step as a share of a plain target step (the verify section's n = 1 causal
    forward at its first context: the same model shape), eager and graphed, per head and F."""
    steps, verify = sections.get("steps"), sections.get("verify")
    if not steps or not verify:
        return []
    plain = [r for r in verify["rows"] if r["nodes"] == 1 and r["mask"] == "causal"]
    if not plain:
        return []
    first = min(plain, key=lambda r: r["context"])
    rows = [dict(head_mode=r["head_mode"], positions=r["positions"], eager_share=r["eager_ms"] / first["ms"],
                 graphed_share=r["graphed_ms"] / first["ms"])
            for r in steps["rows"] if r["shape"] == "llama3-8b"]
    if not rows:
        return []
    return ["## draft step / plain target step (Llama-3.1-8B shape)", "",
            f"Plain target step: {fmt(first['ms'])} ms (verify section, n = 1 after {first['context']} tokens).", ""
            ] + table(rows, [("head_mode", "head"), ("positions", "F"), ("eager_share_pct", "eager"),
                             ("graphed_share_pct", "graphed")]) + [""]


def render_markdown(results: dict[str, Any]) -> str:
    """results.md from results.json's content (nothing else)."""
    meta = results["meta"]
    lines = ["# GPU suite results", "", "Generated by `benchmarks/gpu_suite.py` from `results.json`.", ""]
    lines += table([meta], [(k, k) for k in ("device", "torch", "triton", "transformers", "cuda", "timestamp",
                                             "quick")])
    lines += [""] + [f"- {note}" for note in meta.get("notes", [])]
    for name, trace in results.get("errors", {}).items():
        lines += [f"- **{name} failed**: `{trace.strip().splitlines()[-1]}` (see log.txt)"]
    lines.append("")
    for name in SECTIONS:
        if name in results["sections"]:
            lines += section_markdown(name, results["sections"][name])
    lines += step_shares(results["sections"])
    return "\n".join(lines)

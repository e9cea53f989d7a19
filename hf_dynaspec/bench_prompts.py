"""Benchmark prompt files: Spec-Bench's `question.jsonl` or any JSON-lines file of prompts, read without
importing torch or transformers (vLLM's environment reads them too, `benchmarks/serving/vllm_bench.py`).

    python -c "from hf_dynaspec.bench_prompts import load_bench_prompts; print(len(load_bench_prompts(limit=1)))"
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "spec_bench" / "question.jsonl"


def load_bench_prompts(path: str | Path | None = None, limit: int | None = None) -> list[dict]:
    """Records with `question_id`, `category`, `prompt` from a JSONL file (fields `turns` or `prompt`);
    `limit` keeps the first N prompts of every category."""
    path = Path(path) if path else DEFAULT_PROMPTS
    if not path.is_file():
        raise OSError(f"{path} not found: pass --prompts FILE.jsonl (fields `turns` or `prompt`).")
    per_category: dict[str, int] = defaultdict(int)
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        raw = json.loads(line)
        prompt = raw["turns"][0] if "turns" in raw else raw.get("prompt")
        if not prompt:
            raise ValueError(f"{path}:{i + 1} has neither `turns` nor `prompt`.")
        category = raw.get("category", "all")
        if limit is not None and per_category[category] >= limit:
            continue
        per_category[category] += 1
        rows.append({"question_id": str(raw.get("question_id", i)), "category": category, "prompt": prompt})
    return rows


def round_robin(rows: list[dict]) -> list[dict]:
    """The prompts reordered one category at a time in turn (each category's own order kept): a run stopped
    part-way has covered every category about equally, not the first few whole."""
    per_category: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        per_category[row["category"]].append(row)
    queues = list(per_category.values())
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]

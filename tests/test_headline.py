"""benchmarks/headline.py on synthetic records: each task's pooled speedups, the chat rows without code and
translation, the README table and a drafter card's block."""

from __future__ import annotations

import pytest
from helpers import load_benchmark_script

from hf_dynaspec.bench import Record

SECONDS = {"plain": 2.0, "prompt-lookup": 2.5, "defaults": 1.0}


def records(categories: tuple[str, ...], mismatch: str | None = None) -> list[Record]:
    stats = {"steps": 5, "accepted_tokens": 10}
    return [Record(method, category, f"{category}-{i}", seconds * (i + 1), 10,
                   matches_plain=method != mismatch, stats=stats if method == "defaults" else None, machine="m")
            for category in categories for i in range(2) for method, seconds in SECONDS.items()]


def test_a_chat_task_leaves_out_code_and_translation():
    headline = load_benchmark_script("headline")
    chat = next(t for t in headline.TASKS if t.kind == "chat" and t.prompts is None)
    figures = headline.task_figures(records(("writing", "coding", "translation")), chat)
    assert figures["prompts"] == 2  # the writing prompts only
    assert figures["speedup"] == {"prompt-lookup": pytest.approx(0.8), "defaults": pytest.approx(2.0)}
    assert figures["plain_tokens_per_s"] == pytest.approx(20 / 6.0)
    assert figures["accepted_length"] == pytest.approx(2.0) and figures["mismatches"] == 0


def test_the_readme_table_and_the_card_block():
    headline = load_benchmark_script("headline")
    code = next(t for t in headline.TASKS if t.kind == "code")
    figures = headline.task_figures(records(("code-python",), mismatch="defaults"), code)
    result = {"out": "benchmarks/results/x", "max_new_tokens": 96, "tasks": [figures]}
    table = headline.readme_table(result)
    assert f"| {code.label} | code | 2 | 3.3 | 0.80x | **2.00x** | 2.00 |" in table
    assert "(2 mismatches)" in table and "Machine: m." in table
    assert headline.card_block(result, "drafters/elsewhere") is None
    assert "| code | 2 | 3.3 | 0.80x | **2.00x** | 2.00 |" in headline.card_block(result, code.drafter)

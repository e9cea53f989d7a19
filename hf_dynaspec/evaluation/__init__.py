"""Local `evaluate` modules (this project runs offline, and `evaluate.load("name")` would fetch from the Hub):
each folder holds one module script, loaded by path with `load(name)`.

- `exact_match` (metric): share of predictions equal to their references (answers, or whole texts).
- `mcnemar` (comparison): paired test of two methods' correctness on the same items, with the difference in
  accuracy and its 95% interval.
- `paired_speedup` (comparison): speedup of a method over a baseline on the same prompts (ratio of summed
  times), its paired bootstrap 95% interval and a Wilcoxon signed-rank p-value on per-prompt log time ratios.

    python -c "from hf_dynaspec.evaluation import load; print(load('exact_match').compute(predictions=['1'], references=['1']))"
"""

from __future__ import annotations

from pathlib import Path

import evaluate

MODULES = ("exact_match", "mcnemar", "paired_speedup")
HERE = Path(__file__).resolve().parent


def load(name: str) -> evaluate.EvaluationModule:
    """The local module `name` (one of `MODULES`), loaded by path: no network."""
    if name not in MODULES:
        raise ValueError(f"Unknown evaluation module {name!r}: one of {MODULES}.")
    return evaluate.load(str(HERE / name / f"{name}.py"), keep_in_memory=True)

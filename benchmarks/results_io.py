"""Where a benchmark script's figures go: `results.json` (the records) and `results.md` (their report) in one
folder, the markdown regenerated from the JSON, never typed in.

    python -c "import sys; sys.path.insert(0, 'benchmarks'); from results_io import save_results; \
print(save_results(__import__('pathlib').Path('/tmp/r'), {'x': 1}, lambda r: f'x = {r[\"x\"]}\n'))"
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def save_results(out: Path, result: dict, report: Callable[[dict], str]) -> str:
    """Write `result` as out/results.json and `report(result)` as out/results.md; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (out / "results.md").write_text(text)
    return text

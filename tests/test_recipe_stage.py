"""The recipes' `stage` helper (recipes/stage.sh): it records finished stages and passes a failure on, also where
the caller catches it in a `||` list (which bash's `set -e` does not reach into).

    .venv/bin/python -m pytest tests/test_recipe_stage.py -q
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

STAGE = Path(__file__).resolve().parents[1] / "recipes" / "stage.sh"


def run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; RUN={tmp_path}; source {STAGE}; {script}"],
                          capture_output=True, text=True)


def test_a_finished_stage_is_recorded_and_a_failed_one_stops_the_recipe(tmp_path):
    done = run('stage ok true; stage bad bash -c "exit 3"; echo reached', tmp_path)
    assert done.returncode == 3 and "reached" not in done.stdout
    records = [json.loads(line) for line in (tmp_path / "stages.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["ok"]


def test_a_failure_caught_by_the_caller_runs_its_handler_with_the_status(tmp_path):
    caught = run('stage train bash -c "exit 130" || { status=$?; echo "packed after $status"; exit $status; }; '
                 'echo "next stage"', tmp_path)
    assert caught.returncode == 130 and "packed after 130" in caught.stdout and "next stage" not in caught.stdout
    assert not (tmp_path / "stages.jsonl").exists()

"""Fuzz / soak run: random targets, settings and prompts for a bounded time, checking exactness and invariants.

It lives beside the tests because it runs their case grid (`tests/helpers.py`; run as a script, its own
folder is on the import path). Each case is drawn like `tests/test_properties.py` (vocab 32..160, eagle2 /
dyspec / chain, 1..64 nodes, depth 1..8, top-k 1..8, dynamic / full head, path-probability floors, lookup
branches, random EOS, 1..30 new tokens, half of them with the oracle drafter) and checked by `check_case`:
greedy speculative output == plain greedy, every accepted path is a root path, and target / drafter cache
lengths == len(sequence) - 1 after each step. An exception counts as a failure. Prints `cases tried: N,
failures: F` and exits 1 when F > 0.

    .venv/bin/python tests/soak.py --seconds 60 --seed 0
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py: the kernels run on CPU tensors

import torch  # noqa: E402
from helpers import HEAD_MODES, POLICIES, Case, check_case  # noqa: E402


def random_case(rng: random.Random) -> Case:
    """One case with every setting drawn uniformly from the ranges of the property tests."""
    vocab_size = rng.randint(32, 160)
    return Case(
        vocab_size=vocab_size,
        model_seed=rng.randint(0, 15),
        prompt_seed=rng.randint(0, 1_000_000),
        prompt_length=rng.randint(1, 16),
        policy=rng.choice(POLICIES),
        nodes=rng.randint(1, 64),
        depth=rng.randint(1, 8),
        top_k=rng.randint(1, 8),
        head_mode=rng.choice(HEAD_MODES),
        min_draft_prob=rng.choice([0.0, 0.0, 0.05, 0.3]),
        lookup_num_tokens=rng.choice([0, 0, 1, 4]),
        lookup_min_ngram=rng.randint(1, 3),
        eos=rng.choice([None, rng.randrange(vocab_size)]),
        max_new_tokens=rng.randint(1, 30),
        oracle=rng.random() < 0.5,
    )


def run_one(case: Case) -> list[str]:
    """The case's problems; an exception is reported as one problem with its traceback."""
    try:
        return check_case(case)
    except Exception:  # noqa: BLE001 - any crash is a failure to report, not to stop on
        return [traceback.format_exc()]


def soak(seconds: float, seed: int) -> tuple[int, int]:
    """Run random cases until `seconds` have passed; print each failing case; return (tried, failed)."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    tried = failed = 0
    while time.monotonic() < deadline:
        case = random_case(rng)
        problems = run_one(case)
        tried += 1
        if problems:
            failed += 1
            print(f"FAILED {case}:", *problems[:3], sep="\n  ", flush=True)
    return tried, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case generator")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the other cores alone
    tried, failed = soak(args.seconds, args.seed)
    print(f"cases tried: {tried}, failures: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

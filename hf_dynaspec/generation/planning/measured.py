"""What calibration measured, kept on disk so that the next process skips it (as the Hub cache keeps files).

A measurement (the LM head's layout timings, the verification costs c(n)) depends on the target's shapes, its
dtype and device, the machine (CPU model, cores, torch version, threads) and the measurement's own settings, not
on the weights' values. Each is stored as one JSON file named by a hash of all of these, under
`$HF_DYNASPEC_MEASUREMENTS` (default `$HF_DYNASPEC_CACHE/measurements`, i.e. ~/.cache/hf-dynaspec/measurements). A file that cannot be read or
does not hold what was asked is measured again. `HF_DYNASPEC_MEASURE`:

- `disk` (the default): what is stored is used; what is missing is measured as cheaply as a first call can
  afford (`thorough()` is False: c(n) at a few sizes, the LM head's layout left at the model's own, untimed)
  and stored, so no process pays a full calibration it did not ask for;
- `fresh`: everything measured in full now and stored (what `hf-dynaspec calibrate` runs);
- `memory`: measured in full, kept in the process only (the tests).

    python -c "from hf_dynaspec.generation.planning.measured import measurements_dir; print(measurements_dir())"
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from ...machine import machine_description
from ...targets import cache_dir

ENV = "HF_DYNASPEC_MEASURE"
DIR_ENV = "HF_DYNASPEC_MEASUREMENTS"
MODES = ("disk", "fresh", "memory")
IGNORED_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash", "name_or_path")
# what the timed forward is, bumped when it changes so that older files are measured again (2: a verification
# reads grouped key / value heads in place, `grouped_attention`; 3: a plain step runs with the target's own masks,
# c(n) is made non-decreasing from above, the walk head's layout is learned on real steps)
VERSION = 3


def measurements_dir() -> Path:
    """$HF_DYNASPEC_MEASUREMENTS, else the `measurements` folder of `targets.cache_dir()`."""
    return Path(os.environ.get(DIR_ENV) or cache_dir() / "measurements")


def mode() -> str:
    value = os.environ.get(ENV, "disk")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: use one of {MODES}.")
    return value


def thorough() -> bool:
    """Whether a missing measurement is taken in full (fresh, memory) rather than as a cold first call can
    afford (disk)."""
    return mode() != "disk"


def measurement_key(target: torch.nn.Module, kind: str, settings: dict[str, Any]) -> str:
    """A hash of what decides a measurement: the target's config (its shapes; not its name or path), dtype and
    device, this machine, the measurement's `kind` and `settings`, and what a measured forward is (`VERSION`)."""
    config = {k: v for k, v in target.config.to_dict().items() if k not in IGNORED_CONFIG_KEYS}
    device = target.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    identity = dict(kind=kind, settings=settings, config=config, dtype=str(target.dtype), device=device_name,
                    machine=machine_description(), architecture=type(target).__name__, version=VERSION)
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load(key: str) -> Any | None:
    """The stored value of `key` (None: not stored, unreadable, or the mode is not "disk")."""
    if mode() != "disk":
        return None
    path = measurements_dir() / f"{key}.json"
    try:
        return json.loads(path.read_text())["value"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(key: str, value: Any, note: str) -> None:
    """Store `value` (JSON) for `key`, with a human-readable `note` of what it is (not in "memory" mode). Written
    to a temporary file and renamed, so a reader never sees half a file; a cache that cannot be written is
    skipped (the process keeps its own copy)."""
    if mode() == "memory":
        return
    folder = measurements_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"note": note, "machine": machine_description(), "value": value}, indent=1))
        tmp.replace(folder / f"{key}.json")
    except OSError:
        pass

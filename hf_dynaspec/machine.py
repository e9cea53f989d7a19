"""What machine a measurement ran on: recorded with every benchmark result (importable anywhere, vLLM's
environment included: torch and the standard library only).

    python -c "from hf_dynaspec.machine import machine_description; print(machine_description())"
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def machine_description() -> str:
    """CPU model, core count, torch version: recorded with every benchmark result."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} logical cores{gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"

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


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where it is missing)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def has_bf16_matrix_units() -> bool:
    """Whether this CPU multiplies bf16 natively (AMX or AVX512-BF16); elsewhere a bf16 GEMM is emulated and runs
    several times slower than float32."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})

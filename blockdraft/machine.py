"""The machine a figure was measured on: the CPU model, its cores and the ISA features that change
kernels (machines of one kind differ in both: the same draft gave 0.93x on one and 1.27x on another)."""

from __future__ import annotations

import os
import platform
import re
import shutil
from pathlib import Path
from typing import Optional

ISA_FEATURES = ("avx512f", "avx512_bf16", "amx")


def machine_facts() -> dict:
    info = _read("/proc/cpuinfo")
    model = re.search(r"model name\s*:\s*(.+)", info)
    flags = _cpu_flags(info)
    memory = re.search(r"MemTotal:\s+(\d+)", _read("/proc/meminfo"))
    return {
        "cpu_model": model.group(1).strip() if model else (platform.processor() or None),
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        # amx comes as amx_tile, amx_bf16, amx_int8: any of them means the tile unit is there
        **{f: (any(x.startswith("amx") for x in flags) if f == "amx" else f in flags) for f in ISA_FEATURES},
        "memory_gib": round(int(memory.group(1)) / 2**20) if memory else None,
        "gpu": gpu_name(),
    }


def fast_cpu_bfloat16() -> bool:
    """The CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX). Without either, torch's bfloat16
    matmuls ran about 28x slower than float32 on a 2-core x86 machine; with AMX, Muon's Newton-Schulz
    step took 0.18 s against 0.40 s in float32 (docs/benchmarks-history.md, learning_levers)."""
    flags = _cpu_flags(_read("/proc/cpuinfo"))
    return "avx512_bf16" in flags or any(x.startswith("amx") for x in flags)


def _cpu_flags(info: str) -> set:
    return set((re.search(r"flags\s*:\s*(.+)", info) or re.search(r"()", "")).group(1).split())


def gpu_name() -> Optional[str]:
    if not shutil.which("nvidia-smi"):
        return None
    import subprocess

    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "a GPU"


def describe(facts: Optional[dict] = None) -> str:
    """E.g. "2-core x86_64 CPU (AMD EPYC 7B13; no avx512f, avx512_bf16, amx), 24 GiB, no GPU"."""
    f = facts or machine_facts()
    has = [x for x in ISA_FEATURES if f.get(x)]
    lacks = [x for x in ISA_FEATURES if not f.get(x)]
    features = "; ".join(([", ".join(has)] if has else []) + ([f"no {', '.join(lacks)}"] if lacks else []))
    return (f"{f['cores']}-core {f['arch']} CPU ({f['cpu_model'] or 'unknown model'}; {features}), "
            f"{f['memory_gib'] or '?'} GiB, {f['gpu'] or 'no GPU'}")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process of this machine has that pid (one we may not signal still counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

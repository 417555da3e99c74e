"""vLLM's CPU OpenMP thread binding, as its own log states it: on a 2-core CPU the default pins the
model to one core and keeps the other for the engine loop, which decides the speed of every stage."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

HEADER = "OpenMP thread binding info:"
SOURCE = re.compile(r"\[[\w.]+\.py:\d+\]")


def omp_binding(log_path: Path) -> Optional[str]:
    """The binding block of a vLLM log joined on one line (e.g. "VLLM_CPU_OMP_THREADS_BIND='auto', ...;
    local_rank=0, core ids=[0]; reserved_cpus=[1]"); None where the log has none (a GPU, or no log)."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines):
        if HEADER not in line or not (tag := SOURCE.search(line)):
            continue
        parts = []
        for follow in lines[i + 1:]:  # the block's lines carry the header's [file:line] tag
            found = SOURCE.search(follow)
            if not found or found.group(0) != tag.group(0) or HEADER in follow:
                break
            parts.append(follow[found.end():].strip())
        return "; ".join(p for p in parts if p) or None
    return None

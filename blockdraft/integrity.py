"""Checksums of the files of a checkpoint or an export, written last and verified on load."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional, Tuple

from blockdraft.errors import DataError

CHECKSUMS_NAME = "checksums.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(directory) -> None:
    directory = Path(directory)
    sums = {p.name: sha256_of(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != CHECKSUMS_NAME}
    (directory / CHECKSUMS_NAME).write_text(json.dumps(sums, indent=2))


def verify_checksums(directory) -> None:
    """Raise naming the first corrupt or missing file; a directory without checksums passes."""
    problem = checksum_problem(directory)
    if problem:
        raise DataError(problem)


def checksum_problem(directory, share: Optional[Tuple[int, int]] = None) -> str:
    """The first corrupt or missing file's description ('' if none). `share` = (rank, world): only every
    world-th listed file from `rank` on is hashed, so the ranks of a run check a directory once between them."""
    directory = Path(directory)
    listing = directory / CHECKSUMS_NAME
    if not listing.exists():
        return ""
    rank, world = share or (0, 1)
    for name, expected in sorted(json.loads(listing.read_text()).items())[rank::world]:
        path = directory / name
        if not path.exists():
            return f"{path} is missing (listed in {listing}); the directory is incomplete: use another checkpoint."
        if sha256_of(path) != expected:
            return f"{path} is corrupt (its sha256 differs from {listing}); use another checkpoint or re-export."
    return ""

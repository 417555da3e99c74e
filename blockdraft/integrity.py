"""Checksums of the files of a checkpoint or an export, written last and verified on load."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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
    directory = Path(directory)
    listing = directory / CHECKSUMS_NAME
    if not listing.exists():
        return
    for name, expected in json.loads(listing.read_text()).items():
        path = directory / name
        if not path.exists():
            raise DataError(f"{path} is missing (listed in {listing}); the directory is incomplete: use another checkpoint.")
        if sha256_of(path) != expected:
            raise DataError(f"{path} is corrupt (its sha256 differs from {listing}); use another checkpoint or re-export.")

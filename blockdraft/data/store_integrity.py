"""A feature store's shards hashed once, when the capture ends, and checked cheaply by every reader after.

Each shard's writer hashes it as it writes it and records its size and modification time beside the
sha256; sealing a split (the capture's last step) re-reads only a shard whose size or time changed since
(or one written before writers recorded them), and records in the index the split's digest (the sha256
of its shard list). Opening the split then costs a stat per shard, not a read of
the whole store on every rank of every run:
  - a shard missing, or of another size than recorded (torn, truncated, rewritten), is refused;
  - a shard of the recorded size whose modification time changed is hashed, and refused if it differs
    (a store copied without its times, `cp` without `-p`, is hashed on open, as before);
  - an index whose shard list does not give the recorded digest (edited by hand) is refused.
A split sealed before stores recorded digests is hashed on every open, as stores always were.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from blockdraft.errors import DataError
from blockdraft.integrity import sha256_of

RECAPTURE = "rerun the capture with the same overrides (it captures only what is missing)"


def split_digest(shards: list) -> str:
    """The sha256 of a split's shard list: file, sha256 and size of each, in order."""
    listing = "\n".join(f"{s['file']} {s['sha256']} {s.get('bytes')}" for s in shards)
    return hashlib.sha256(listing.encode()).hexdigest()


def seal_split(root: Path, entry: dict) -> None:
    """Record sizes, times and the digest of a finished split in `entry`. A shard whose writer recorded the size
    and time at which it hashed it, and still has them, is not read again; any other is hashed once here."""
    for shard in entry["shards"]:
        path = Path(root) / shard["file"]
        if not path.is_file():
            raise DataError(f"{path} is missing from the feature store {root}; {RECAPTURE}.")
        stat = path.stat()
        if (stat.st_size, stat.st_mtime_ns) == (shard.get("bytes"), shard.get("mtime_ns")):
            continue
        if sha256_of(path) != shard["sha256"]:
            raise DataError(f"{path} changed after it was written (its sha256 differs from the capture's); "
                            f"delete it and {RECAPTURE}.")
        stat = path.stat()
        shard["bytes"], shard["mtime_ns"] = stat.st_size, stat.st_mtime_ns
    entry["digest"] = split_digest(entry["shards"])


def check_split(root: Path, entry: dict) -> None:
    """Refuse a split whose shards are not what the capture sealed, with the fix; read no shard whose
    size and time are as sealed."""
    index = Path(root) / "index.json"
    sealed = "digest" in entry
    if sealed and split_digest(entry["shards"]) != entry["digest"]:
        raise DataError(f"{index}: the shard list of this split does not match its recorded digest (the index was "
                        f"edited); {RECAPTURE} into a new out=.")
    for shard in entry["shards"]:
        path = Path(root) / shard["file"]
        if not path.is_file():
            raise DataError(f"{path} is missing from the feature store {root}; {RECAPTURE}.")
        stat = path.stat()
        if sealed and stat.st_size != shard["bytes"]:
            raise DataError(f"{path} is torn or was rewritten ({stat.st_size} bytes, {index} records "
                            f"{shard['bytes']}); delete it and {RECAPTURE}.")
        if sealed and stat.st_mtime_ns == shard["mtime_ns"]:
            continue  # as sealed: not read
        if sha256_of(path) != shard["sha256"]:
            raise DataError(f"{path} is corrupt (its sha256 differs from {index}); delete it and {RECAPTURE}.")

"""A draft sharded over ranks (train.draft_sharding=fsdp) on disk: its weights and optimizer state written by
every rank in parallel with torch.distributed.checkpoint (DCP) into `<checkpoint>/draft/`, each rank its own shards (`__<rank>_<n>.distcp`),
no rank gathering the draft; DCP's coordinator writes `draft/.metadata` once every rank has written.

Each rank hashes the files it wrote; rank 0 records the digests in shard_checksums.json (itself covered by the
checkpoint's checksums.json). On resume the ranks split the hashing between them; export, on one process,
hashes them all. Read back with DCP's resharding: on any world size, into FSDP2 shards or a plain module.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Dict, Optional

import torch.distributed as dist

from blockdraft.models.dcp_metadata import check_dcp_metadata
from blockdraft.errors import DataError
from blockdraft.integrity import sha256_of

SHARDS_DIR = "draft"
SHARD_CHECKSUMS = "shard_checksums.json"


def is_sharded(checkpoint: Path) -> bool:
    return (Path(checkpoint) / SHARDS_DIR / ".metadata").is_file()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _one_process_quietly():
    """DCP warns on every save and load without a process group; one process (export, a 1-rank resume) is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
        yield


def _rank_world() -> tuple:
    if _distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def write_shards(directory: Path, draft, optimizer=None) -> Dict[str, str]:
    """Every rank, collectively: its shards of the draft (and of the optimizer's state) under directory/draft/.
    Returns {path relative to directory: sha256} of the files this rank wrote."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(draft)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(draft, optimizer)
    target = Path(directory) / SHARDS_DIR
    rank = _rank_world()[0]
    with _one_process_quietly():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(target), sync_files=True), no_dist=not _distributed())
    return {f"{SHARDS_DIR}/{p.name}": sha256_of(p) for p in sorted(target.glob(f"__{rank}_*.distcp"))}


def read_shards(checkpoint: Path, draft, optimizer=None) -> None:
    """Every rank, collectively: the saved draft (and optimizer state) into `draft` as it is now sharded
    (FSDP2 shards on any number of ranks, or whole tensors in a plain module on one process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    state = {"model": get_model_state_dict(draft)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(draft, optimizer)
    with _one_process_quietly():
        check_dcp_metadata(Path(checkpoint) / SHARDS_DIR)  # before DCP unpickles it
        dcp.load(state, checkpoint_id=str(Path(checkpoint) / SHARDS_DIR), no_dist=not _distributed())
    set_model_state_dict(draft, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(draft, optimizer, state["optim"])


def stored_shapes(checkpoint: Path) -> Dict[str, tuple]:
    """{name: shape} of the draft's tensors as DCP's metadata records them (whole, not per shard)."""
    from torch.distributed.checkpoint import FileSystemReader

    check_dcp_metadata(Path(checkpoint) / SHARDS_DIR)  # before DCP unpickles it
    meta = FileSystemReader(str(Path(checkpoint) / SHARDS_DIR)).read_metadata().state_dict_metadata
    return {key[len("model."):]: tuple(m.size) for key, m in meta.items() if key.startswith("model.") and hasattr(m, "size")}


def check_shards_present(checkpoint: Path) -> None:
    """Every file DCP's metadata names is there and long enough: a removed or truncated shard is named now,
    before anything loads (cheap: sizes only)."""
    from torch.distributed.checkpoint import FileSystemReader

    root = Path(checkpoint) / SHARDS_DIR
    needed: Dict[str, int] = {}
    check_dcp_metadata(root)  # before DCP unpickles it
    for info in FileSystemReader(str(root)).read_metadata().storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = root / name
        if not path.is_file():
            raise DataError(f"{path} is missing (named in {root / '.metadata'}); the checkpoint is incomplete: use another checkpoint.")
        if path.stat().st_size < size:
            raise DataError(f"{path} is truncated ({path.stat().st_size} of {size} bytes); use another checkpoint.")


def verify_shards(checkpoint: Path) -> None:
    """The shards' sha256 against shard_checksums.json, in this process (the ranks of a resume split the
    hashing and tell each other: train/checkpoint.py verify_checkpoint)."""
    problem = shard_problem(checkpoint)
    if problem:
        raise DataError(problem)


def shard_problem(checkpoint: Path, share: Optional[tuple] = None) -> str:
    """The first fault found in the shards, or ''. `share` = (rank, world): only every world-th file from `rank`
    on is hashed."""
    checkpoint = Path(checkpoint)
    check_shards_present(checkpoint)
    listing = checkpoint / SHARD_CHECKSUMS
    if not listing.is_file():
        return f"{listing} is missing; the checkpoint is incomplete: use another checkpoint."
    rank, world = share or (0, 1)
    for name, expected in sorted(json.loads(listing.read_text()).items())[rank::world]:
        if sha256_of(checkpoint / name) != expected:
            return f"{checkpoint / name} is corrupt (its sha256 differs from {listing}); use another checkpoint."
    return ""


def gather_digests(mine: Dict[str, str]) -> Optional[Dict[str, str]]:
    """Every rank's digests on rank 0 (None elsewhere): the collective after every rank finished its write."""
    rank, world = _rank_world()
    if world == 1:
        return dict(mine)
    found = [None] * world if rank == 0 else None
    dist.gather_object(mine, found, dst=0)
    return {k: v for part in found for k, v in part.items()} if rank == 0 else None

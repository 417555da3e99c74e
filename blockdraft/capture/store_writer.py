"""The feature store's writer, for one rank of a capture.

Every rank writes the shards it was given (shard_split.py rank_shards) and, once a shard's file is complete, a receipt
beside it (<split>/shard-NNNNN.json: rows, tokens, sha256): shards are numbered as one process numbers them, so
no two ranks ever write the same file. The receipts are the capture's journal: a killed capture, on any number
of ranks, resumes at the shards that have none. Rank 0 alone writes index.json: it opens the store, and once
every rank has finished a split it lists that split's shards in order and drops their receipts, leaving the
layout feature_store.py describes, the same as a one-process capture's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Set

import torch
from safetensors.torch import save_file

from blockdraft.durable import fsync_file, write_json
from blockdraft.data.feature_store import INDEX_NAME, STORE_FORMAT, FeatureStore, identity_differences
from blockdraft.data.store_integrity import seal_split
from blockdraft.errors import ConfigError, DataError
from blockdraft.integrity import sha256_of


def shard_name(split: str, number: int) -> str:
    return f"{split}/shard-{number:05d}.safetensors"


def receipt_path(root: Path, split: str, number: int) -> Path:
    return root / f"{split}/shard-{number:05d}.json"


# --- rank 0: the index ----------------------------------------------------------------------
def create_or_resume(root, identity: dict, overwrite: bool) -> FeatureStore:
    """A store at `root` for `identity`: resumes one of the same identity, refuses to mix with another."""
    root = Path(root).expanduser()
    if (root / INDEX_NAME).is_file():
        store = FeatureStore.open(root, key="out")
        # A split the store does not hold yet (say, data.val captured after data.train) is
        # added beside the others: nothing captured so far depends on it.
        added = {name: src for name, src in identity.get("sources", {}).items()
                 if name not in store.identity.get("sources", {})}
        stored = {**store.identity, "sources": {**store.identity.get("sources", {}), **added}}
        diffs = identity_differences(stored, identity)
        if not diffs:
            if added:
                store.index["identity"] = stored
                store.write_index()
            return store
        if not overwrite:
            raise ConfigError(
                f"out={root} holds a store of other settings:\n  " + "\n  ".join(diffs)
                + "\nUse another out, or overwrite=true to replace it."
            )
        delete_contents(store)
    elif root.exists() and any(root.iterdir()) and not overwrite:
        raise ConfigError(f"out={root} is not empty and holds no feature store; pick an empty or new directory, or pass overwrite=true.")
    root.mkdir(parents=True, exist_ok=True)
    store = FeatureStore(root, {"format": STORE_FORMAT, "identity": identity, "splits": {}})
    store.write_index()
    return store


def delete_contents(store: FeatureStore) -> None:
    for split in store.splits:
        shutil.rmtree(store.root / split, ignore_errors=True)
    (store.root / INDEX_NAME).unlink(missing_ok=True)


def begin_split(store: FeatureStore, name: str, source: dict, num_rows: int, rows_per_shard: int, report: dict) -> dict:
    # The identity names each split's source, so an entry found here is of these same rows.
    entry = store.splits.get(name)
    if entry is None:
        entry = {"source": source, "rows": num_rows, "rows_per_shard": rows_per_shard,
                 "num_shards": -(-num_rows // rows_per_shard), "shards": [], "tokens": 0, "complete": False, "report": report}
        store.splits[name] = entry
        store.write_index()
    return entry


def list_shards(store: FeatureStore, name: str) -> dict:
    """Every rank has finished the split: its shards, in order, into the index; then their receipts go."""
    entry = store.splits[name]
    listed = {shard["file"]: shard for shard in entry["shards"]}
    shards = []
    for number in range(entry["num_shards"]):
        shard = read_receipt(store.root, name, number) or listed.get(shard_name(name, number))
        if shard is None:
            raise DataError(f"{store.root / shard_name(name, number)} was never finished although every rank "
                            "stopped; rerun the capture (it captures only the missing shards).")
        shards.append(shard)
    entry["shards"] = shards
    entry["tokens"] = sum(s["tokens"] for s in shards)
    seal_split(store.root, entry)  # hashed once here, so that readers check sizes and the digest only
    entry["complete"] = True
    store.write_index()
    for number in range(entry["num_shards"]):
        receipt_path(store.root, name, number).unlink(missing_ok=True)
    # What a writer killed mid-file left (a shard's or a receipt's temporary file): no rank writes here any more.
    for stray in (store.root / name).glob("*.tmp") if (store.root / name).is_dir() else ():
        stray.unlink(missing_ok=True)
    return entry


# --- every rank: its shards -------------------------------------------------------------------
def finished_shards(store: FeatureStore, name: str) -> Set[int]:
    """The shards of a split a rank need not capture: listed in the index or with a receipt (not hashed here)."""
    entry = store.splits[name]
    listed = {shard["file"] for shard in entry["shards"]}
    return {n for n in range(entry["num_shards"])
            if shard_name(name, n) in listed or receipt_path(store.root, name, n).is_file()}


def damaged_shards(store: FeatureStore, name: str, numbers: List[int]) -> List[int]:
    """Of finished shards, those whose file is missing or differs from its recorded sha256: captured again."""
    listed = {shard["file"]: shard for shard in store.splits[name]["shards"]}
    damaged = []
    for number in numbers:
        shard = read_receipt(store.root, name, number) or listed[shard_name(name, number)]
        path = store.root / shard["file"]
        if not path.is_file() or sha256_of(path) != shard["sha256"]:
            print(f"[capture] {path} is missing or damaged: capturing it again", flush=True)
            receipt_path(store.root, name, number).unlink(missing_ok=True)
            damaged.append(number)
    return damaged


def write_shard(root: Path, name: str, number: int, rows: List[dict], storage_dtype: torch.dtype) -> dict:
    """The shard's file, then its receipt: a kill between the two leaves a shard without one, captured again."""
    tensors = pack_rows(rows, storage_dtype)
    rel = shard_name(name, number)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    fsync_file(tmp)  # its receipt (below) fsyncs the directory, and with it this rename
    os.replace(tmp, path)
    stat = path.stat()
    # Its writer hashes it, and records the size and time it hashed: sealing the split trusts those (no rank
    # re-reads a terabyte store behind a barrier) unless the file changed since.
    shard = {"file": rel, "rows": len(rows), "tokens": int(tensors["input_ids"].numel()), "sha256": sha256_of(path),
             "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    write_json(receipt_path(root, name, number), shard, indent=None)
    return shard


def read_receipt(root: Path, name: str, number: int) -> Optional[dict]:
    path = receipt_path(root, name, number)
    return json.loads(path.read_text()) if path.is_file() else None


def pack_rows(rows: List[dict], storage_dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Rows {input_ids [L], loss_mask [L], position_ids [L], document_lengths [D], features [L, F]} -> shard tensors."""
    lengths = torch.tensor([len(r["input_ids"]) for r in rows], dtype=torch.int64)
    docs = torch.tensor([len(r["document_lengths"]) for r in rows], dtype=torch.int64)
    teacher = {}
    if "teacher_ids" in rows[0]:  # the target's top-k per position [T, k], for soft labels
        teacher = {"teacher_ids": torch.cat([r["teacher_ids"] for r in rows]).to(torch.int32).contiguous(),
                   "teacher_logits": torch.cat([r["teacher_logits"] for r in rows]).to(storage_dtype).contiguous()}
    prompts = {}
    if "prompt_hashes" in rows[0]:  # [D]
        prompts = {"prompt_hashes": torch.cat([r["prompt_hashes"] for r in rows]).to(torch.int64)}
    return {
        **teacher,
        **prompts,
        "features": torch.cat([r["features"] for r in rows]).to(storage_dtype).contiguous(),  # [T, F]
        "input_ids": torch.cat([r["input_ids"] for r in rows]).to(torch.int32),
        "loss_mask": torch.cat([r["loss_mask"] for r in rows]).bool(),
        "position_ids": torch.cat([r["position_ids"] for r in rows]).to(torch.int32),
        "row_offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
        "document_lengths": torch.cat([r["document_lengths"] for r in rows]).to(torch.int64),
        "row_document_offsets": torch.cat([torch.zeros(1, dtype=torch.int64), docs.cumsum(0)]),
    }

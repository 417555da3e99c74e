"""An offline feature store: what one training run would feed the draft, captured once.

    <store>/index.json                        identity, per-split shard list, reject reports
    <store>/<split>/shard-00000.safetensors   one shard of `rows_per_shard` rows

A shard holds its rows laid end to end (T = the shard's tokens, R rows, D documents):
    features            [T, n*H_t]  target layers concatenated ascending (the draft's input), storage dtype
    input_ids           [T] int32   loss_mask [T] bool   position_ids [T] int32 (restart per document)
    row_offsets         [R+1] int64 token offset of each row
    document_lengths    [D] int64   row_document_offsets [R+1] int64 (documents of row r)
    prompt_hashes       [D] int64   each document's prompt (blockdraft/data/prompt_record.py): the store
                                    carries the record of what a run from it trains on

The index is rewritten under a temporary name, then renamed, and lists a split's shards once
every one is complete; while a capture runs, each finished shard has a receipt beside it
(<split>/shard-00000.json), so a killed capture resumes at the shards without one. The
capture writes all of it (blockdraft/capture/store_writer.py); this file reads it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors import safe_open

from blockdraft.data.dataset import reply_ends
from blockdraft.data.store_integrity import check_split
from blockdraft.errors import ConfigError, DataError

INDEX_NAME = "index.json"
STORE_FORMAT = 1
STORAGE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
ROW_TENSORS = ("input_ids", "loss_mask", "position_ids")


def check_storage_dtype(name: str) -> torch.dtype:
    if name not in STORAGE_DTYPES:
        raise ConfigError(f"storage_dtype={name!r}; use one of {list(STORAGE_DTYPES)} (float16 halves the store, float32 is exact).")
    return STORAGE_DTYPES[name]


def identity_differences(stored: dict, wanted: dict, prefix: str = "") -> List[str]:
    """'key: store X vs now Y' for every leaf that differs between two identity dicts."""
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += identity_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: store {a!r} vs now {b!r}")
    return out


class FeatureStore:
    """The index of a store directory, and what reads and writes it."""

    def __init__(self, root: Path, index: dict):
        self.root, self.index = Path(root), index

    # --- opening ----------------------------------------------------------------------
    @classmethod
    def open(cls, root, key: str = "data.features") -> "FeatureStore":
        root = Path(root).expanduser()
        path = root / INDEX_NAME
        if not path.is_file():
            raise ConfigError(f"{key}={root}: no {INDEX_NAME} there; write a store with `python -m blockdraft.capture ... out={root}`.")
        try:
            index = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{path} is not valid JSON ({e}): torn or edited; capture the store again "
                            f"(python -m blockdraft.capture <its overrides> out={root} overwrite=true).") from None
        if index.get("format") != STORE_FORMAT:
            raise ConfigError(f"{path}: store format {index.get('format')!r}, this blockdraft reads {STORE_FORMAT}; capture it again.")
        return cls(root, index)

    # --- what it holds ------------------------------------------------------------------
    @property
    def identity(self) -> dict:
        return self.index["identity"]

    @property
    def splits(self) -> Dict[str, dict]:
        return self.index["splits"]

    def split(self, name: str) -> dict:
        if name not in self.splits or not self.splits[name].get("complete"):
            held = [s for s, v in self.splits.items() if v.get("complete")]
            raise ConfigError(f"the feature store {self.root} has no complete {name!r} split (it holds {held}); capture it with data.{name}=<rows>.")
        return self.splits[name]

    def has_split(self, name: str) -> bool:
        return bool(self.splits.get(name, {}).get("complete"))

    # --- the index (written by the capture, capture/store_writer.py) -------------------
    def write_index(self) -> None:
        from blockdraft.durable import write_json

        write_json(self.root / INDEX_NAME, self.index)  # it lists finished splits: on the disk before it says so

    def verify(self, name: str) -> None:
        """Every shard of a split present and as the capture sealed it: sizes, times and the recorded digest
        checked, a shard read only where its time changed (data/store_integrity.py)."""
        check_split(self.root, self.split(name))


@dataclass
class _Shard:
    path: Path
    row_offsets: torch.Tensor
    row_document_offsets: torch.Tensor
    document_lengths: torch.Tensor
    has_teacher: bool = False
    handle: Optional[object] = None


class FeatureStoreDataset(torch.utils.data.Dataset):
    """One split of a store as map-style rows: the items `TokenizedDataset` gives, plus
    `features` [L, n*H_t] float32. Features are read per row from memory-mapped shards, so a
    rank touches only the rows of its own slice. (`collate` derives position ids from the
    document lengths; they equal the stored `position_ids`, which other readers use.)"""

    def __init__(self, store: FeatureStore, split: str, max_rows: Optional[int] = None):
        store.verify(split)
        self.store, self.split_name, self.max_rows = store, split, max_rows
        self.shards: List[_Shard] = []
        starts = [0]
        for shard in store.split(split)["shards"]:
            path = store.root / shard["file"]
            with safe_open(str(path), framework="pt") as f:
                self.shards.append(_Shard(path, f.get_tensor("row_offsets"), f.get_tensor("row_document_offsets"),
                                          f.get_tensor("document_lengths"), has_teacher="teacher_ids" in f.keys()))
            starts.append(starts[-1] + shard["rows"])
        self.shard_starts = starts  # row index where each shard begins (+ the total)

    def __len__(self) -> int:
        """The split's rows, or its first `max_rows` (data.max_rows, as for a data file)."""
        return self.shard_starts[-1] if self.max_rows is None else min(self.max_rows, self.shard_starts[-1])

    def _locate(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of a store split of {len(self)} rows")
        s = bisect.bisect_right(self.shard_starts, index) - 1
        return self.shards[s], index - self.shard_starts[s]

    def _handle(self, shard: _Shard):
        if shard.handle is None:
            shard.handle = safe_open(str(shard.path), framework="pt")
        return shard.handle

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        shard, r = self._locate(index)
        a, b = int(shard.row_offsets[r]), int(shard.row_offsets[r + 1])
        da, db = int(shard.row_document_offsets[r]), int(shard.row_document_offsets[r + 1])
        f = self._handle(shard)
        item = {
            "input_ids": f.get_slice("input_ids")[a:b].long(),
            "loss_mask": f.get_slice("loss_mask")[a:b].bool(),
            "document_lengths": shard.document_lengths[da:db].clone(),
            "features": f.get_slice("features")[a:b].float(),  # [L, n*H_t]
        }
        if shard.has_teacher:  # the target's top-k at each position [L, k] (see models.teacher)
            item["teacher_ids"] = f.get_slice("teacher_ids")[a:b].long()
            item["teacher_logits"] = f.get_slice("teacher_logits")[a:b].float()
        return item

    def reply_tokens(self) -> torch.Tensor:
        """Every supervised token id of the split (for the draft vocabulary), without reading features."""
        return torch.cat([ids[mask].long() for ids, mask in self._token_columns()])

    def reply_token_blocks(self):
        """The supervised token ids, one shard at a time (for counting them without a copy of every shard)."""
        return (ids[mask] for ids, mask in self._token_columns())

    def reply_end_tokens(self) -> torch.Tensor:
        """The last supervised token of every reply (end-of-turn tokens)."""
        return torch.cat([reply_ends(ids.long(), mask.bool()) for ids, mask in self._token_columns()])

    def prompt_hashes(self) -> Optional[torch.Tensor]:
        """(D,) int64: the prompt of every document of the split's rows within len(self); None for a store
        captured before stores carried them."""
        out = []
        for shard, start in zip(self.shards, self.shard_starts):
            rows = min(len(self) - start, len(shard.row_offsets) - 1)
            if rows <= 0:
                break
            f = self._handle(shard)
            if "prompt_hashes" not in f.keys():
                return None
            out.append(f.get_slice("prompt_hashes")[: int(shard.row_document_offsets[rows])])
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    def _token_columns(self):
        """(input_ids, loss_mask) of each shard's rows within len(self): whole rows, so no reply is cut."""
        for shard, start in zip(self.shards, self.shard_starts):
            rows = min(len(self) - start, len(shard.row_offsets) - 1)
            if rows <= 0:
                return
            f, end = self._handle(shard), int(shard.row_offsets[rows])
            yield f.get_slice("input_ids")[:end], f.get_slice("loss_mask")[:end].bool()

    def __getstate__(self):
        # Open handles do not pickle (DataLoader workers): each process opens its own.
        state = dict(self.__dict__)
        state["shards"] = [_Shard(s.path, s.row_offsets, s.row_document_offsets, s.document_lengths, s.has_teacher)
                           for s in self.shards]
        return state


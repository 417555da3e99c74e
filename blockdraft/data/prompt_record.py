"""The record of the prompts a draft trained on: one content hash per prompt, so that serving and
evaluation can tell a held-out prompt from a memorised one, whichever path each came through.

A prompt is its conversation's opening: the messages before the first assistant turn (system
messages included), as regen sends them to the target (`blockdraft.regen.turns.turn_inputs(m, 1)[0]`),
each as its role and its content with runs of whitespace made one space. A conversation whose opening
asks nothing (no user message with text) has no prompt. The hash is the first 8 bytes of the sha256 of
that opening, read as a signed 64-bit integer (tensors and numpy arrays keep it as int64); 0 means
"no prompt".

The file, `training_prompts.bin`: a 24-byte header (b"bdprompt", then little-endian uint32 format
version, uint32 flags, uint64 count), then `count` int64 hashes, ascending, each once. A million
prompts take 8 MB. Two different prompts share a hash with probability 2^-64; checking m prompts
against a record of n finds a false overlap with probability about n * m / 2^64 (5e-10 for a million
training prompts and ten thousand checked), and merges two of the record's own prompts into one with
about n^2 / 2^65 (3e-8 for a million).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import numpy as np

from blockdraft.data.chat_turns import asks, user_turns
from blockdraft.errors import DataError

RECORD_NAME = "training_prompts.bin"
MAGIC = b"bdprompt"
FORMAT = 1
HEADER = struct.Struct("<8sIIQ")  # magic, format, flags, count
INCOMPLETE = 1  # flag: the draft also learned from prompts no record names (it started from a draft without one)
NO_PROMPT = 0
FIX = f"copy {RECORD_NAME} again from the run directory it came from, or export the checkpoint again"


def prompt_opening(messages: Sequence[dict]) -> List[dict]:
    """The messages before the first assistant turn, as {role, content}; [] when they ask nothing: the
    first turn regen answers (blockdraft.regen.turns.turn_inputs), by the same rule (data/chat_turns.py)."""
    opening = user_turns(messages)[0]
    return opening if asks(opening) else []


def prompt_hash(messages: Sequence[dict]) -> int:
    """The identity of a conversation's prompt (its opening), or NO_PROMPT when it has none."""
    opening = prompt_opening(messages)
    if not opening:
        return NO_PROMPT
    canonical = json.dumps([[m["role"], " ".join(m["content"].split())] for m in opening], ensure_ascii=False,
                           separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True) or 1  # 0 stays "no prompt"


@dataclass
class PromptRecord:
    hashes: np.ndarray  # (n,) int64, ascending, each once, never NO_PROMPT
    complete: bool = True
    """False when the draft also learned from prompts no record names."""

    @classmethod
    def of(cls, hashes: Iterable[int], complete: bool = True) -> "PromptRecord":
        """From any hashes (an array, a tensor's numpy view, a list): sorted, each once, "no prompt" dropped."""
        values = np.sort(np.asarray(hashes if hasattr(hashes, "__len__") else list(hashes), dtype=np.int64))
        first = np.ones(len(values), dtype=bool)
        first[1:] = values[1:] != values[:-1]
        values = values[first]
        return cls(values[values != NO_PROMPT], complete)

    def __len__(self) -> int:
        return len(self.hashes)

    def union(self, other: "PromptRecord") -> "PromptRecord":
        return PromptRecord.of(np.concatenate([self.hashes, other.hashes]), self.complete and other.complete)

    def contains(self, hashes: Sequence[int]) -> np.ndarray:
        """(len(hashes),) bool: which of `hashes` the record holds."""
        values = np.asarray(hashes, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.hashes, values), max(len(self.hashes) - 1, 0))
        return (self.hashes[at] == values if len(self.hashes) else np.zeros(len(values), dtype=bool)) & (values != NO_PROMPT)

    def write(self, path: Path) -> Path:
        """Written to a temporary name and renamed: a reader never sees half a record."""
        path = Path(path)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(HEADER.pack(MAGIC, FORMAT, 0 if self.complete else INCOMPLETE, len(self.hashes)))
            fh.write(self.hashes.astype("<i8").tobytes())
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, path: Path) -> "PromptRecord":
        path = Path(path)
        data = path.read_bytes()
        if len(data) < HEADER.size:
            raise DataError(f"{path} is too short to be a record of training prompts; {FIX}")
        magic, version, flags, count = HEADER.unpack_from(data)
        if magic != MAGIC or version != FORMAT or len(data) != HEADER.size + 8 * count:
            raise DataError(f"{path} is not a format-{FORMAT} record of training prompts (magic {magic!r}, format "
                            f"{version}, {len(data)} bytes for {count} hashes); {FIX}")
        hashes = np.frombuffer(data, dtype="<i8", count=count, offset=HEADER.size).astype(np.int64)
        return cls(hashes, complete=not flags & INCOMPLETE)


def find_record(directory: Path) -> Optional[PromptRecord]:
    """The record in a run, checkpoint, store or export directory; None when it has none."""
    path = Path(directory) / RECORD_NAME
    return PromptRecord.read(path) if path.is_file() else None

"""Tokenised rows on disk as flat memory-mapped arrays (the indexed-dataset layout of Megatron-LM):
written once by one process, mapped by every rank, never loaded whole.

    <cache_dir>/<key>/tokens.bin         int32   [T]     every kept conversation's ids, end to end
    <cache_dir>/<key>/loss_mask.bin      uint8   [T]     1 where the token is supervised (bool view)
    <cache_dir>/<key>/starts.bin         int64   [D+1]   conversation d is tokens[starts[d]:starts[d+1]]
    <cache_dir>/<key>/lines.bin          int64   [D]     source line (or row) of each conversation
    <cache_dir>/<key>/prompt_hashes.bin  int64   [D]     each conversation's prompt (data/prompt_record.py)
    <cache_dir>/<key>/manifest.json      format, key, counts, the reject report: written last

The folder is filled under a temporary name and renamed into place whole, so a reader never sees
half of one; a folder whose manifest is missing, of another format or key, or whose arrays are not
the sizes the manifest says (a torn copy) is not read: it is rebuilt.

Pages come from the page cache, shared by every rank of a node; a rank's own memory holds only the
rows it reads. A mapped view is private (copy on write): nothing a rank does changes the file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from blockdraft.durable import fsync_dir, fsync_tree
from blockdraft.data.rows import RejectReport
from blockdraft.machine import pid_alive

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# Name -> dtype of each array; per-token arrays first, then per-conversation ones.
TOKEN_ARRAYS = {"tokens": np.int32, "loss_mask": np.uint8}
DOCUMENT_ARRAYS = {"starts": np.int64, "lines": np.int64, "prompt_hashes": np.int64}
MAX_TOKEN_ID = np.iinfo(np.int32).max
FLUSH_BYTES = 8 << 20  # rows are buffered to about this much before one write per array


class TokenFileWriter:
    """Appends conversations to the arrays of a temporary folder; `commit` puts it in place."""

    def __init__(self, final: Path, key: str, cache_format: int):
        self.final, self.key, self.format = Path(final), key, cache_format
        self.final.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(self.final)
        self.tmp = self.final.with_name(f"{self.final.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        self.files = {name: open(self.tmp / f"{name}.bin", "wb") for name in (*TOKEN_ARRAYS, *DOCUMENT_ARRAYS)}
        # Per-token arrays are buffered as arrays, per-conversation values as ints, until FLUSH_BYTES.
        self.buffers: dict[str, list] = {name: [] for name in self.files}
        self.buffered, self.tokens, self.documents = 0, 0, 0
        self.buffers["starts"].append(0)

    def add(self, ids, mask, line: int, prompt: int) -> None:
        """One conversation: its ids, loss mask (same length), source line and prompt hash."""
        ids = np.asarray(ids)
        if len(ids) != len(mask):
            raise ValueError(f"line {line}: {len(ids)} ids but {len(mask)} loss mask entries")
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > MAX_TOKEN_ID):
            raise ValueError(f"line {line}: a token id outside 0..{MAX_TOKEN_ID} (int32)")
        self.tokens += len(ids)
        self.documents += 1
        self.buffers["tokens"].append(ids.astype(np.int32, copy=False))
        self.buffers["loss_mask"].append(np.asarray(mask).astype(np.uint8, copy=False))
        for name, value in (("starts", self.tokens), ("lines", line), ("prompt_hashes", prompt)):
            self.buffers[name].append(int(value))
        self.buffered += 5 * len(ids) + 24
        if self.buffered >= FLUSH_BYTES:
            self._flush()

    def commit(self, report: RejectReport) -> Path:
        """Close the arrays, write the manifest last, and rename the folder into place."""
        self._flush()
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        manifest = {"format": self.format, "key": self.key, "tokens": self.tokens, "documents": self.documents,
                    "report": report.to_dict()}
        (self.tmp / MANIFEST).write_text(json.dumps(manifest))
        fsync_tree(self.tmp)  # the manifest too: the folder's name says it is complete only once it is on disk
        try:
            os.rename(self.tmp, self.final)
            fsync_dir(self.final.parent)
        except OSError:  # another writer (another node on a shared folder) got there first: its file is ours
            if read_manifest(self.final, self.key, self.format) is None:
                _move_aside_and_remove(self.final)
                os.rename(self.tmp, self.final)
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)
        return self.final

    def abandon(self) -> None:
        for f in self.files.values():
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _flush(self) -> None:
        for name, parts in self.buffers.items():
            if not parts:
                continue
            if name in TOKEN_ARRAYS:
                block = np.concatenate(parts)
            else:
                block = np.array(parts, dtype=DOCUMENT_ARRAYS[name])
            self.files[name].write(block.tobytes())
            parts.clear()
        self.buffered = 0


def read_manifest(folder: Path, key: str, cache_format: int) -> Optional[dict]:
    """The manifest of a whole, current token file at `folder`; None when there is none to read (absent,
    stale: another format or key, or torn: an array of another size than the manifest says)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        log.warning("token file %s has an unreadable manifest (%s); tokenising again", folder, e)
        return None
    if manifest.get("format") != cache_format or manifest.get("key") != key:
        log.warning("token file %s is of another format or key; tokenising again", folder)
        return None
    sizes = expected_sizes(manifest["tokens"], manifest["documents"])
    for name, size in sizes.items():
        file = Path(folder) / f"{name}.bin"
        if not file.is_file() or file.stat().st_size != size:
            log.warning("token file %s: %s is torn (%s bytes, manifest says %d); tokenising again",
                        folder, file.name, file.stat().st_size if file.is_file() else "no", size)
            return None
    return manifest


def expected_sizes(tokens: int, documents: int) -> dict[str, int]:
    sizes = {name: tokens * np.dtype(dtype).itemsize for name, dtype in TOKEN_ARRAYS.items()}
    counts = {"starts": documents + 1, "lines": documents, "prompt_hashes": documents}
    sizes.update({name: counts[name] * np.dtype(dtype).itemsize for name, dtype in DOCUMENT_ARRAYS.items()})
    return sizes


def map_arrays(folder: Path, manifest: dict) -> dict[str, torch.Tensor]:
    """Every array of the token file as a tensor over a private map of its file (nothing read yet)."""
    counts = {"tokens": manifest["tokens"], "loss_mask": manifest["tokens"], "starts": manifest["documents"] + 1,
              "lines": manifest["documents"], "prompt_hashes": manifest["documents"]}
    out = {}
    for name, dtype in {**TOKEN_ARRAYS, **DOCUMENT_ARRAYS}.items():
        if counts[name] == 0:  # an empty file cannot be mapped
            array = np.zeros(0, dtype=dtype)
        else:  # mode "c": copy on write, so the tensor is writable (torch asks) and the file never changes
            array = np.memmap(Path(folder) / f"{name}.bin", dtype=dtype, mode="c", shape=(counts[name],))
        out[name] = torch.from_numpy(array)
    out["loss_mask"] = out["loss_mask"].view(torch.bool)
    return out


def _remove_abandoned(final: Path) -> None:
    """Temporary folders of writers on this host that are gone (killed mid-way): they are never read."""
    host = socket.gethostname()
    for tmp in final.parent.glob(f"{final.name}.{host}.*.tmp"):
        pid = tmp.name[len(final.name) + len(host) + 2: -len(".tmp")]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _move_aside_and_remove(folder: Path) -> None:
    """A stale or torn folder out of the way in one rename (a reader mapping it keeps its pages), then deleted."""
    aside = folder.with_name(f"{folder.name}.{socket.gethostname()}.{os.getpid()}.stale")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)

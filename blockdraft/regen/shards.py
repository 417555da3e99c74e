"""Rows of one split as shard files written as they finish: a kill loses at most the row being written,
and a rerun resumes from the indices already there."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from blockdraft.disk_full import disk_full, is_disk_full


def done_indices(path: Path) -> set:
    done = set()
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            done.add(json.loads(line)["generation"]["index"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a torn last line from a kill: regenerate that row
    return done


class ShardedRows:
    """Rows of one split as `<dir>/NNNNN.jsonl` shards of `shard_size` prompt indices each.

    Rows are appended as they finish (in any order) and flushed at once, so a kill loses at
    most the row being written; `done()` reads back which indices are finished, skipping a
    torn last line. One thread appends (the run's writer). `merge` streams every row, ordered
    by index, into one JSONL file, replaced whole: a shard at a time, since shards are index
    ranges, so memory holds one shard whatever the split's size.
    """

    def __init__(self, directory, shard_size: int):
        self.directory = Path(directory)
        self.shard_size = shard_size
        self._mended: set = set()  # shards whose end this process has checked

    def shard_path(self, index: int) -> Path:
        return self.directory / f"{index // self.shard_size:05d}.jsonl"

    def shards(self) -> List[Path]:
        """The shard files in index order (by number: past shard 99999 the names grow a digit)."""
        found = self.directory.glob("[0-9]*.jsonl") if self.directory.is_dir() else []
        return sorted((p for p in found if p.stem.isdigit()), key=lambda p: int(p.stem))

    def done(self) -> set:
        finished = set()
        for shard in self.shards():
            finished |= done_indices(shard)
        return finished

    def append(self, row: dict) -> None:
        path = self.shard_path(row["generation"]["index"])
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "a") as fh:
                if path not in self._mended:
                    self._mend(path, fh)
                fh.write(json.dumps(row) + "\n")
                fh.flush()
        except OSError as err:
            if not is_disk_full(err):
                raise
            # A line cut short is skipped when read and ended before the next append (_mend): the rows before it stay.
            raise disk_full(err, f"a row to {path}", "every row answered before it is kept",
                            "rerun the same command, which resumes after them") from None

    def _mend(self, path: Path, fh) -> None:
        """A kill mid-write leaves a torn last line: end it, or the next row would be glued onto it and lost too."""
        self._mended.add(path)
        if fh.tell() == 0:
            return
        with open(path, "rb") as read:
            read.seek(-1, os.SEEK_END)
            if read.read(1) != b"\n":
                fh.write("\n")

    def iter_rows(self) -> Iterator[dict]:
        """Every row once, in index order, one shard in memory at a time."""
        for shard in self.shards():
            for _, line in sorted(_shard_lines(shard).items()):
                yield json.loads(line)

    def rows(self) -> List[dict]:
        return list(self.iter_rows())

    def merge(self, out_path) -> Tuple[int, str]:
        """Write every row, ordered by prompt index, to `out_path` (tmp, fsync, rename, fsync the directory);
        returns the count and the file's sha256, which the split's record keeps so that a reuse can check it."""
        from blockdraft.durable import fsync_dir

        out_path = Path(out_path)
        tmp = out_path.with_name(out_path.name + ".tmp")
        count, digest = 0, hashlib.sha256()
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                for shard in self.shards():
                    for _, line in sorted(_shard_lines(shard).items()):
                        fh.write(line + "\n")
                        digest.update((line + "\n").encode())
                        count += 1
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if not is_disk_full(err):
                raise
            raise disk_full(err, str(out_path), f"every answered row is kept in {self.directory}",
                            "rerun the same command, which writes it again from them") from None
        os.replace(tmp, out_path)
        fsync_dir(out_path.parent)
        return count, digest.hexdigest()


def _shard_lines(shard: Path) -> Dict[int, str]:
    """index -> the row's line as written (not parsed again for the merge); the last of a repeated index wins."""
    by_index = {}
    with open(shard) as fh:
        for line in fh:
            line = line.rstrip("\n")
            try:
                by_index[json.loads(line)["generation"]["index"]] = line
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a torn line: its prompt was answered again later
    return by_index


class RejectLog:
    """`<dir>/rejects.jsonl`: the prompts of the last run that failed every try, with the reason. A rerun
    tries them again (they have no row), so each run starts the file afresh."""

    def __init__(self, directory):
        self.path = Path(directory) / "rejects.jsonl"

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def append(self, index: int, reason: str, attempts: int, server: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"index": index, "reason": reason, "attempts": attempts, "server": server}) + "\n")
            fh.flush()

    def entries(self) -> List[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

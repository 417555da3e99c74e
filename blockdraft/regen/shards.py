"""Rows of one split as shard files written as they finish: a kill loses at most the row being written,
and a rerun resumes from the indices already there."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List


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
    torn last line. `merge` writes all rows, sorted by index, to one JSONL file atomically.
    """

    def __init__(self, directory, shard_size: int):
        self.directory = Path(directory)
        self.shard_size = shard_size

    def shard_path(self, index: int) -> Path:
        return self.directory / f"{index // self.shard_size:05d}.jsonl"

    def shards(self) -> List[Path]:
        return sorted(self.directory.glob("*.jsonl")) if self.directory.is_dir() else []

    def done(self) -> set:
        finished = set()
        for shard in self.shards():
            finished |= done_indices(shard)
        return finished

    def append(self, row: dict) -> None:
        path = self.shard_path(row["generation"]["index"])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()

    def rows(self) -> List[dict]:
        by_index = {}
        for shard in self.shards():
            for line in shard.read_text().splitlines():
                try:
                    row = json.loads(line)
                    by_index[row["generation"]["index"]] = row
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn line: its prompt was answered again later
        return [by_index[i] for i in sorted(by_index)]

    def merge(self, out_path) -> int:
        """Write every row, ordered by prompt index, to `out_path` (tmp + rename); returns the count."""
        out_path = Path(out_path)
        rows = self.rows()
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, out_path)
        return len(rows)

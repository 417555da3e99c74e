"""The rows of one capture shard: rows_per_shard consecutive rows, as one process writes them. Which shards a
rank runs is decided with the rest of the ranks' parallelism, in train/parallelize.py (rank_shards)."""

from __future__ import annotations


def shard_rows(number: int, rows_per_shard: int, num_rows: int) -> range:
    return range(number * rows_per_shard, min((number + 1) * rows_per_shard, num_rows))

"""The rows of one capture shard: rows_per_shard consecutive rows, as one process writes them; and which
shards each rank runs (rank_shards)."""

from __future__ import annotations

from typing import Dict, List


def shard_rows(number: int, rows_per_shard: int, num_rows: int) -> range:
    return range(number * rows_per_shard, min((number + 1) * rows_per_shard, num_rows))


def rank_shards(shard_tokens: Dict[int, int], rank: int, world_size: int) -> List[int]:
    """The capture's shards (number -> tokens) this rank runs: longest first, each to the rank with the fewest
    tokens so far (the lower rank on a tie); the rank's shards in ascending order. Every rank computes the same
    plan from the same tokens. A shard, not a row, is the unit, so the store any number of ranks writes holds
    the same files in the same row order: training's data order never depends on the capture's world size."""
    load = [0] * world_size
    mine = []
    for number in sorted(shard_tokens, key=lambda n: (-shard_tokens[n], n)):
        least = min(range(world_size), key=lambda r: (load[r], r))
        load[least] += shard_tokens[number]
        if least == rank:
            mine.append(number)
    return sorted(mine)

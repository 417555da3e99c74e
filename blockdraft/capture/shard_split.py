"""Which shards each rank captures: the shards still to capture, shared out so that every rank has about as
many tokens to run. A shard is the unit (rows_per_shard consecutive rows, as one process writes them), so the
store any number of ranks writes holds the same files in the same row order: training's data order never
depends on the capture's world size."""

from __future__ import annotations

from typing import Dict, List


def rank_shards(shard_tokens: Dict[int, int], rank: int, world_size: int) -> List[int]:
    """Longest first, each shard to the rank with the fewest tokens so far (the lower rank on a tie); the
    rank's shards in ascending order. Every rank computes the same plan from the same tokens."""
    load = [0] * world_size
    mine = []
    for number in sorted(shard_tokens, key=lambda n: (-shard_tokens[n], n)):
        least = min(range(world_size), key=lambda r: (load[r], r))
        load[least] += shard_tokens[number]
        if least == rank:
            mine.append(number)
    return sorted(mine)


def shard_rows(number: int, rows_per_shard: int, num_rows: int) -> range:
    return range(number * rows_per_shard, min((number + 1) * rows_per_shard, num_rows))

"""Which shards each capture rank takes: every shard by exactly one rank, the tokens shared out evenly."""

import random

from blockdraft.capture.shard_split import shard_rows
from blockdraft.capture.shard_split import rank_shards


def test_every_shard_is_captured_by_exactly_one_rank_and_the_tokens_are_shared_out():
    rng = random.Random(0)
    tokens = {n: rng.randint(100, 5000) for n in range(37)}
    for world in (1, 2, 3, 8):
        plans = [rank_shards(tokens, rank, world) for rank in range(world)]
        assert sorted(n for plan in plans for n in plan) == sorted(tokens)
        assert all(plan == sorted(plan) for plan in plans)
        loads = [sum(tokens[n] for n in plan) for plan in plans]
        assert max(loads) - min(loads) <= max(tokens.values())  # longest first: within one shard of even


def test_the_plan_is_the_same_on_every_call_and_takes_only_the_shards_given():
    tokens = {3: 10, 5: 10, 6: 40, 9: 20}  # shards still to capture after a resume
    assert [rank_shards(tokens, r, 2) for r in range(2)] == [[6], [3, 5, 9]]
    assert rank_shards(tokens, 0, 2) == rank_shards(dict(reversed(list(tokens.items()))), 0, 2)
    assert rank_shards({}, 0, 2) == [] and rank_shards({0: 5}, 1, 2) == []


def test_a_shard_is_rows_per_shard_consecutive_rows_as_one_process_writes_them():
    assert list(shard_rows(0, 4, 10)) == [0, 1, 2, 3] and list(shard_rows(2, 4, 10)) == [8, 9]

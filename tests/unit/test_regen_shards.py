"""Shard files, resume without redoing finished rows, and the merged split file."""

import json
import tracemalloc

from blockdraft.regen.answerers import Answerer
from blockdraft.regen.runner import regenerate_rows
from blockdraft.regen.shards import ShardedRows
from blockdraft.regen.turns import Reply


def row(index, text="a"):
    return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
            "generation": {"index": index}}


def test_rows_go_to_the_shard_of_their_index(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=2)
    for i in (3, 0, 1, 4):
        store.append(row(i))
    assert [p.name for p in store.shards()] == ["00000.jsonl", "00001.jsonl", "00002.jsonl"]
    assert store.done() == {0, 1, 3, 4}


def test_a_torn_last_line_is_not_counted_as_done(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=10)
    store.append(row(0))
    with open(store.shard_path(1), "a") as fh:
        fh.write('{"messages": [{"role": "us')  # killed mid-write
    assert store.done() == {0}


def test_merge_orders_rows_by_index_and_replaces_the_file_whole(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=1)
    for i in (2, 0, 1):
        store.append(row(i, text=f"t{i}"))
    out = tmp_path / "train.jsonl"
    out.write_text("old\n")
    assert store.merge(out)[0] == 3
    assert [json.loads(line)["generation"]["index"] for line in out.read_text().splitlines()] == [0, 1, 2]
    assert not (tmp_path / "train.jsonl.tmp").exists()


def counting_reply():
    calls = []

    def reply(messages):
        calls.append(messages[-1]["content"])
        return Reply("answer " + messages[-1]["content"], tokens=4, finish_reason="stop")

    return reply, calls


PROMPTS = [[{"role": "user", "content": f"q{i}"}] for i in range(5)]


def in_process(reply, in_flight=1):
    return [Answerer(None, "m", reply, in_flight, "in-process", lambda: True)]


def test_a_rerun_answers_only_the_prompts_without_a_row(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=2)
    store.append({**row(1), "generation": {"index": 1}})
    store.append({**row(3), "generation": {"index": 3}})
    reply, calls = counting_reply()
    stats = regenerate_rows(PROMPTS, store, in_process(reply, 3), {"backend": "fake"}, progress=False)
    assert sorted(calls) == ["q0", "q2", "q4"]
    assert stats.rows == 3 and stats.tokens == 12 and stats.cut_at_max_tokens == 0
    assert store.done() == {0, 1, 2, 3, 4}
    reply, calls = counting_reply()
    regenerate_rows(PROMPTS, store, in_process(reply), {"backend": "fake"}, progress=False)
    assert calls == []


def test_written_rows_hold_the_target_answer_and_the_settings(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=8)
    reply, _ = counting_reply()
    regenerate_rows(PROMPTS[:2], store, in_process(reply), {"backend": "fake", "temperature": 0.0}, progress=False)
    rows = store.rows()
    assert rows[1]["messages"] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "answer q1"}]
    assert rows[1]["generation"] == {"backend": "fake", "temperature": 0.0, "index": 1, "finish_reasons": ["stop"],
                                     "served_by": {"url": None, "model": "m"}}


def test_a_row_after_a_torn_line_is_kept_whole(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=10)
    store.shard_path(0).parent.mkdir(parents=True)
    store.shard_path(0).write_text(json.dumps(row(0)) + "\n" + '{"messages": [{"role": "us')  # killed mid-write
    ShardedRows(tmp_path / "parts", shard_size=10).append(row(1))  # the rerun's first row
    assert store.done() == {0, 1}


def test_shards_past_99999_keep_their_index_order(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=1)
    for i in (100000, 99999, 5):
        store.append(row(i))
    (tmp_path / "parts" / "rejects.jsonl").write_text('{"index": 7}\n')  # not a shard
    assert [r["generation"]["index"] for r in store.iter_rows()] == [5, 99999, 100000]


def test_the_merge_holds_one_shard_in_memory_not_the_split(tmp_path):
    store = ShardedRows(tmp_path / "parts", shard_size=25)
    for i in reversed(range(1000)):  # rows finish in any order
        store.append(row(i, text="x" * 2000))
    split_bytes = sum(p.stat().st_size for p in store.shards())
    out = tmp_path / "train.jsonl"
    tracemalloc.start()
    try:
        assert store.merge(out)[0] == 1000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [json.loads(line)["generation"]["index"] for line in out.read_text().splitlines()] == list(range(1000))
    # One shard is 1/40 of the split: a merge that held every row would peak above the split's size.
    assert peak < split_bytes / 8, (peak, split_bytes)

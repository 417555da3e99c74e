"""Two gloo ranks load a split as training does (train/data_loading.py load_split): one rank tokenises,
both map the same token file and read the same rows; with a node-local cache each node's first rank
writes its node's copy; an error on rank 0 is raised on every rank instead of leaving one waiting."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import blockdraft.data.tokenize_stream as stream_module
from blockdraft.data.config import DataConfig
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.errors import DataError
from blockdraft.ranks.distributed import DistInfo
from blockdraft.train.data_loading import load_split


def chat(question, answer):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def _rank(rank, rows, caches, local_ranks, tmp):
    """One rank: load the split, then write what it read and what it did to <tmp>/rank<r>.json."""
    calls = []
    real = stream_module.tokenize_row
    stream_module.tokenize_row = lambda *a, **k: calls.append(1) or real(*a, **k)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    info = DistInfo(rank, 2, local_ranks[rank], torch.device("cpu"))
    cfg = DataConfig(seq_length=64, cache_dir=caches[rank], tokenize_workers=1)
    result = {"tokenised": 0}
    try:
        ds = load_split(rows, build_tiny_tokenizer(), cfg, "train", info, block_size=4)
        maps = Path("/proc/self/maps").read_text()
        result = {"rows": [ds[i]["input_ids"].tolist() for i in range(len(ds))], "tokenised": len(calls),
                  "mapped": sorted({line.split()[-1] for line in maps.splitlines() if line.endswith("tokens.bin")})}
    except DataError as err:
        result["error"] = str(err)
    finally:
        dist.destroy_process_group()
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(result))


def run_two_ranks(tmp_path, rows, caches, local_ranks):
    mp.start_processes(_rank, args=(str(rows), caches, local_ranks, str(tmp_path)), nprocs=2, start_method="fork")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(chat(f"q{i}", "an answer " * (1 + i % 4))) + "\n" for i in range(30)))
    return path


def test_two_ranks_map_one_file_that_one_rank_wrote(tmp_path, rows):
    shared = str(tmp_path / "shared")
    first, second = run_two_ranks(tmp_path, rows, [shared, shared], local_ranks=[0, 1])
    assert first["rows"] == second["rows"] and len(first["rows"]) == 30
    assert (first["tokenised"], second["tokenised"]) == (30, 0)
    # (a forked rank also holds the maps its parent had: only those under the run's cache are its own)
    ours = [[p for p in r["mapped"] if p.startswith(shared)] for r in (first, second)]
    assert ours[0] == ours[1] and len(ours[0]) == 1


def test_a_node_local_cache_is_written_once_per_node(tmp_path, rows):
    caches = [str(tmp_path / "node0"), str(tmp_path / "node1")]  # two nodes, one rank each, each its own disk
    first, second = run_two_ranks(tmp_path, rows, caches, local_ranks=[0, 0])
    assert first["rows"] == second["rows"] and (first["tokenised"], second["tokenised"]) == (30, 30)
    for rank, result in enumerate((first, second)):
        assert [any(p.startswith(cache) for p in result["mapped"]) for cache in caches] == [rank == 0, rank == 1]


def test_an_error_on_rank_0_is_raised_on_every_rank(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "no reply"}]}) + "\n")
    results = run_two_ranks(tmp_path, rows, [str(tmp_path / "c")] * 2, local_ranks=[0, 1])
    assert all("no usable rows" in r.get("error", "") for r in results) and results[1]["tokenised"] == 0

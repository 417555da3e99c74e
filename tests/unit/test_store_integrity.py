"""A feature store is hashed once, when its capture lists a finished split, and checked by size, time and
its recorded digest after: opening it reads no shard, while a torn, rewritten or edited store is still refused
with the fix."""

import json
import os

import pytest
import torch

import blockdraft.data.store_integrity as integrity
from blockdraft.capture import store_writer
from blockdraft.data.feature_store import INDEX_NAME, FeatureStore, FeatureStoreDataset
from blockdraft.errors import DataError


def row(length: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 50, (length,), generator=g), "loss_mask": torch.ones(length, dtype=torch.bool),
            "position_ids": torch.arange(length), "document_lengths": torch.tensor([length]),
            "features": torch.randn(length, 8, generator=g), "prompt_hashes": torch.tensor([seed + 1])}


@pytest.fixture
def store_root(tmp_path):
    """A two-shard split written and listed by the capture's own writer."""
    root = tmp_path / "store"
    store = store_writer.create_or_resume(root, {"target": {"path": "t"}}, overwrite=False)
    store_writer.begin_split(store, "train", {"path": "rows", "sha256": "x"}, num_rows=4, rows_per_shard=2, report={})
    for number in range(2):
        store_writer.write_shard(root, "train", number, [row(5 + number, 2 * number), row(3, 2 * number + 1)],
                                 torch.float16)
    store_writer.list_shards(store, "train")
    return root


@pytest.fixture
def hashes(monkeypatch):
    """Every shard hashed from here on, by name."""
    seen = []
    real = integrity.sha256_of
    monkeypatch.setattr(integrity, "sha256_of", lambda path: seen.append(path.name) or real(path))
    return seen


def shard(root, number=0):
    return root / "train" / f"shard-{number:05d}.safetensors"


def test_opening_a_sealed_store_reads_no_shard(store_root, hashes):
    entry = json.loads((store_root / INDEX_NAME).read_text())["splits"]["train"]
    assert entry["digest"] == integrity.split_digest(entry["shards"]) and all("bytes" in s for s in entry["shards"])
    for _ in range(3):  # every rank, every run
        ds = FeatureStoreDataset(FeatureStore.open(store_root), "train")
    assert len(ds) == 4 and ds[3]["features"].shape == (3, 8)
    assert hashes == []


def test_a_torn_shard_is_refused_without_reading_it(store_root, hashes):
    data = shard(store_root).read_bytes()
    shard(store_root).write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"shard-00000.safetensors is torn or was rewritten .*rerun the capture"):
        FeatureStoreDataset(FeatureStore.open(store_root), "train")
    assert hashes == []


def test_a_shard_changed_in_place_is_hashed_and_refused(store_root, hashes):
    path = shard(store_root, 1)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, other content, a new modification time
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(DataError, match="shard-00001.safetensors is corrupt"):
        FeatureStoreDataset(FeatureStore.open(store_root), "train")
    assert hashes == [path.name]


def test_an_edited_index_is_refused_and_an_unsealed_store_is_hashed(store_root, hashes):
    original = (store_root / INDEX_NAME).read_text()
    index = json.loads(original)
    index["splits"]["train"]["shards"][0]["sha256"] = "0" * 64
    (store_root / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(DataError, match="does not match its recorded digest"):
        FeatureStoreDataset(FeatureStore.open(store_root), "train")
    index = json.loads(original)
    index["splits"]["train"].pop("digest")  # a store from before digests: hashed, as stores always were
    (store_root / INDEX_NAME).write_text(json.dumps(index))
    shard(store_root, 1).unlink()
    with pytest.raises(DataError, match="shard-00001.safetensors is missing"):
        FeatureStoreDataset(FeatureStore.open(store_root), "train")
    assert hashes == [shard(store_root, 0).name]


def test_the_capture_refuses_to_seal_a_shard_damaged_before_the_end(tmp_path):
    root = tmp_path / "store"
    store = store_writer.create_or_resume(root, {"target": {"path": "t"}}, overwrite=False)
    store_writer.begin_split(store, "train", {"path": "rows", "sha256": "x"}, num_rows=1, rows_per_shard=1, report={})
    store_writer.write_shard(root, "train", 0, [row(4, 0)], torch.float16)
    path = root / "train" / "shard-00000.safetensors"
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DataError, match="changed after it was written"):
        store_writer.list_shards(store, "train")
    assert not FeatureStore.open(root).has_split("train")  # not listed as complete: the capture resumes


def test_sealing_trusts_the_writers_hash_and_rehashes_only_a_shard_changed_since(tmp_path, hashes):
    """The writers hashed their shards (in parallel, one rank each); sealing the split re-reads none of them,
    unless a shard's size or time moved since its writer recorded them: that one is read and refused."""
    root = tmp_path / "store"
    store = store_writer.create_or_resume(root, {"target": {"path": "t"}}, overwrite=False)
    store_writer.begin_split(store, "train", {"path": "rows", "sha256": "x"}, num_rows=4, rows_per_shard=2, report={})
    for number in range(2):
        store_writer.write_shard(root, "train", number, [row(4, number), row(3, number + 5)], torch.float16)
    store_writer.list_shards(store, "train")
    assert hashes == []  # sealing read no shard again

    store = store_writer.create_or_resume(tmp_path / "second", {"target": {"path": "t"}}, overwrite=False)
    store_writer.begin_split(store, "train", {"path": "rows", "sha256": "x"}, num_rows=2, rows_per_shard=2, report={})
    store_writer.write_shard(store.root, "train", 0, [row(4, 0), row(3, 5)], torch.float16)
    path = shard(store.root)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # rewritten after its writer hashed it: same size, a new time
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    del hashes[:]
    with pytest.raises(DataError, match="changed after it was written"):
        store_writer.list_shards(store, "train")
    assert hashes == [path.name]


def test_a_torn_index_is_named_with_the_fix_on_the_next_open(tmp_path):
    from blockdraft.data.feature_store import FeatureStore
    from blockdraft.errors import DataError

    (tmp_path / "index.json").write_text('{"format": 1, "identity": {"tar')  # a power loss mid-write of another writer
    with pytest.raises(DataError, match=r"index.json is not valid JSON .*torn or edited; capture the store again .*overwrite=true"):
        FeatureStore.open(tmp_path)

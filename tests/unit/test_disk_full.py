"""A full disk (an injected ENOSPC) while writing a checkpoint, an export or a regen shard: the error says what
happened and what is intact, the partial copy is gone, and nothing written before it is lost."""

import errno
import json

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.disk_full import DiskFull
from blockdraft.draft_format.importer import import_draft
from blockdraft.export import writer
from blockdraft.regen import shards
from blockdraft.train import checkpoint as ckpt
from tests.unit.export_helpers import make_draft, make_run

STATE = {"step": 5, "scheduler": {}, "data_position": {}, "world_size": 1, "train_seconds": 1.0}


def full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_mid_checkpoint_keeps_the_earlier_ones_and_says_so(tmp_path, monkeypatch):
    earlier = ckpt.save_checkpoint(tmp_path, 4, make_draft("dflash", seed=1), STATE, "x: 1\n", keep_last=3)
    weights = load_file(earlier / "model.safetensors")
    monkeypatch.setattr(ckpt, "write_checksums", full)  # the disk fills as the last file is written
    with pytest.raises(DiskFull, match=r"No space left on device while writing checkpoint .*step_5; the partial copy "
                                       r"was removed and the checkpoints before it are intact \(step_4\).*resume=auto"):
        ckpt.save_checkpoint(tmp_path, 5, make_draft("dflash", seed=2), STATE, "x: 1\n", keep_last=3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_4"]
    ckpt.verify_checkpoint(earlier)
    assert all(torch.equal(v, load_file(earlier / "model.safetensors")[k]) for k, v in weights.items())


def test_a_full_disk_mid_export_leaves_the_earlier_export_and_no_staging(tmp_path, monkeypatch):
    make_run(tmp_path / "run")
    writer.export_draft(tmp_path / "run", tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    monkeypatch.setattr(writer, "write_checksums", full)
    with pytest.raises(DiskFull, match=r"while writing the export staged at .*out\.tmp; it was removed and nothing "
                                       r"under .*out changed.*rerun the same export"):
        writer.export_draft(tmp_path / "run", tmp_path / "out", overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]
    import_draft(tmp_path / "out")  # still whole


def test_a_full_disk_mid_regen_shard_keeps_the_rows_before_it(tmp_path, monkeypatch):
    store = shards.ShardedRows(tmp_path / "parts", 4)
    rows = [{"messages": [], "generation": {"index": i}} for i in range(3)]
    for row in rows[:2]:
        store.append(row)

    real_open = open

    class Filling:
        """The file as the disk fills: half of the next line written, then ENOSPC."""

        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def tell(self):
            return self.fh.tell()

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            full()

    monkeypatch.setattr(shards, "open", lambda *a, **k: Filling(real_open(*a, **k)), raising=False)
    with pytest.raises(DiskFull, match=r"while writing a row to .*00000\.jsonl; every row answered before it is kept"):
        store.append(rows[2])
    monkeypatch.undo()
    assert [r["generation"]["index"] for r in store.rows()] == [0, 1]  # the torn line skipped, the rest intact
    fresh = shards.ShardedRows(tmp_path / "parts", 4)  # a rerun answers it again
    fresh.append(rows[2])
    assert [r["generation"]["index"] for r in fresh.rows()] == [0, 1, 2]
    assert json.loads((tmp_path / "parts" / "00000.jsonl").read_text().splitlines()[-1])["generation"]["index"] == 2

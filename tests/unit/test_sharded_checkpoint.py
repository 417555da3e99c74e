"""A train.draft_sharding=fsdp checkpoint on one process: written with torch.distributed.checkpoint, read back
whole (load_draft, export) without a process group, its integrity checked before anything loads."""

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.errors import ConfigError, DataError
from blockdraft.export.writer import export_draft
from blockdraft.models import sharded_io
from blockdraft.models.io import draft_state_dict, load_draft
from blockdraft.train import checkpoint as ckpt
from blockdraft.train.parallelize import check_draft_sharding
from tests.unit.export_helpers import make_draft


def _trained_draft():
    """A draft after one AdamW step, so the optimizer holds state to save."""
    draft = make_draft("dflash")
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    for p in draft.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    return draft, optimizer


@pytest.fixture
def run(tmp_path):
    draft, optimizer = _trained_draft()
    state = {"step": 7, "scheduler": {}, "data_position": {}, "torch_rng": torch.get_rng_state(), "world_size": 2,
             "train_seconds": 1.0}
    path = ckpt.save_sharded_checkpoint(tmp_path, 7, draft, optimizer, state, "target:\n  path: /x\n", 3, True)
    return tmp_path, path, draft, optimizer


def test_saved_shards_read_back_into_a_fresh_draft_and_optimizer(run):
    _, path, draft, optimizer = run
    assert sharded_io.is_sharded(path) and not (path / "model.safetensors").exists()
    assert ckpt.complete_checkpoints(path.parent.parent) == [path]
    fresh = make_draft("dflash", seed=2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    sharded_io.read_shards(path, fresh, fresh_opt)
    for (name, a), b in zip(draft.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    saved, loaded = optimizer.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for i in saved:
        assert torch.equal(saved[i]["exp_avg"], loaded[i]["exp_avg"]) and torch.equal(saved[i]["exp_avg_sq"], loaded[i]["exp_avg_sq"])


def test_export_of_a_sharded_checkpoint_writes_the_draft_whole(run, tmp_path):
    _, path, draft, _ = run
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), load_draft(path).state_dict().values()))
    out = export_draft(path, tmp_path / "export", dtype="float32")
    exported, want = load_file(str(out / "model.safetensors")), draft_state_dict(draft)
    assert exported.keys() == want.keys()  # the names a ddp checkpoint's export has
    for name, t in want.items():
        assert torch.equal(exported[name], t), name


def test_a_missing_or_corrupt_shard_is_named_before_resuming(run):
    run_dir, path, _, _ = run
    shard = next((path / "draft").glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="__0_0.distcp is corrupt"):
        ckpt.find_resume_checkpoint(run_dir, "auto")
    shard.unlink()
    with pytest.raises(DataError, match="__0_0.distcp is missing"):
        ckpt.find_resume_checkpoint(run_dir, "auto")


def test_a_sharded_save_killed_before_its_rename_counts_only_when_complete(run):
    run_dir, path, _, _ = run
    torn = path.with_name("step_9.tmp")
    path.rename(torn)  # the shards all written, the rename to step_9 never done
    (torn / "checksums.json").rename(torn / "checksums.later")  # as if killed before rank 0's last file
    assert ckpt.complete_checkpoints(run_dir) == []
    assert ckpt.find_resume_checkpoint(run_dir, "auto") is None
    (torn / "checksums.later").rename(torn / "checksums.json")  # complete: every shard and file verifies
    assert ckpt.find_resume_checkpoint(run_dir, "auto") == run_dir / "checkpoints" / "step_9"


def test_sharding_choices_refused_before_anything_loads(tmp_path):
    with pytest.raises(ConfigError, match="optim.name=adamw, or train.draft_sharding=ddp"):
        check_draft_sharding("fsdp", "muon")
    with pytest.raises(ConfigError, match=r"use one of \['ddp', 'fsdp'\]"):
        check_draft_sharding("zero3", "adamw")
    check_draft_sharding("ddp", "muon")
    ddp_ckpt = tmp_path / "step_3"
    ddp_ckpt.mkdir()
    with pytest.raises(ConfigError, match="resume it with train.draft_sharding=ddp"):
        ckpt.check_resume_sharding(ddp_ckpt, "fsdp", 2)
    ckpt.check_resume_sharding(ddp_ckpt, "fsdp", 1)  # one process holds the plain draft: it reads model.safetensors


class _RunsCode:
    """What a crafted .metadata holds: unpickling it calls a function of its choice."""

    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /dev/null",))


def test_a_crafted_metadata_is_refused_before_dcp_unpickles_it(run, monkeypatch):
    import os
    import pickle

    _, path, draft, optimizer = run
    ckpt.verify_checkpoint(path)  # DCP's own metadata passes the vetting
    (path / "draft" / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    called = []
    monkeypatch.setattr(os, "system", lambda command: called.append(command))
    for read in (lambda: sharded_io.stored_shapes(path), lambda: sharded_io.read_shards(path, draft, optimizer),
                 lambda: sharded_io.check_shards_present(path)):
        with pytest.raises(DataError, match=r"\.metadata asks to build posix\.system.*not loaded"):
            read()
    assert called == []

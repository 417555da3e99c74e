"""A step saved again (the final save after a periodic one) keeps its old copy until the new one is in place: a
run stopped at any moment of the re-save, or of a first save before its rename, resumes from a whole checkpoint of
that step, never from an earlier one, and never from a torn one."""

import os

import pytest
import torch
from safetensors.torch import load_file

from blockdraft import faults
from blockdraft.faults import FaultInjected
from blockdraft.train import checkpoint as ckpt
from tests.unit.export_helpers import make_draft

STATE = {"step": 5, "scheduler": {}, "data_position": {}, "world_size": 1, "train_seconds": 1.0}


def save(run_dir, seed: int, keep_last: int = 1):
    return ckpt.save_checkpoint(run_dir, 5, make_draft("dflash", seed=seed), {**STATE, "seed": seed}, "x: 1\n", keep_last)


def weights(path):
    return load_file(path / "model.safetensors")


def seed_of(path) -> int:
    """Which draft the copy at `path` holds (its trainer state says)."""
    return torch.load(path / ckpt.TRAINER_STATE, weights_only=False)["seed"]


def stopped_at(monkeypatch, point: str, run_dir, seed: int) -> None:
    """A re-save that stops (as a kill would) at `point`; nothing after it runs."""
    monkeypatch.setenv(faults.ENV, f"{point}:raise")
    faults._hits.clear()
    with pytest.raises(FaultInjected):
        save(run_dir, seed)
    monkeypatch.delenv(faults.ENV)


def test_stopped_between_setting_the_old_copy_aside_and_renaming_the_new_one_resumes_from_the_new(tmp_path, monkeypatch):
    first = save(tmp_path, seed=1)
    old = weights(first)
    stopped_at(monkeypatch, "checkpoint.after_set_aside", tmp_path, seed=2)
    assert not first.exists()  # the window: step_5 is aside, step_5.tmp not yet renamed
    assert ckpt.find_resume_checkpoint(tmp_path, "auto") == first
    new = weights(first)
    assert seed_of(first) == 2 and any(not torch.equal(old[k], new[k]) for k in new)
    assert sorted(p.name for p in first.parent.iterdir()) == ["step_5"]


def test_stopped_before_the_new_copy_is_complete_resumes_from_the_old(tmp_path, monkeypatch):
    first = save(tmp_path, seed=1)
    old = weights(first)
    stopped_at(monkeypatch, "checkpoint.before_rename", tmp_path, seed=2)
    (first.parent / "step_5.tmp" / "trainer_state.pt").write_bytes(b"torn")  # as a kill mid-write leaves it
    os.replace(first, first.with_name("step_5.old"))  # and the old one set aside
    assert ckpt.complete_checkpoints(tmp_path) == []
    assert ckpt.find_resume_checkpoint(tmp_path, "auto") == first
    assert seed_of(first) == 1 and all(torch.equal(old[k], v) for k, v in weights(first).items())
    assert sorted(p.name for p in first.parent.iterdir()) == ["step_5", "step_5.tmp"]  # the torn one, replaced next save


def test_a_first_save_complete_but_not_renamed_counts(tmp_path, monkeypatch):
    stopped_at(monkeypatch, "checkpoint.before_rename", tmp_path, seed=1)
    assert ckpt.complete_checkpoints(tmp_path) == []
    assert ckpt.find_resume_checkpoint(tmp_path, "auto") == tmp_path / "checkpoints" / "step_5"

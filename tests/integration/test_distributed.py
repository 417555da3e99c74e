"""Data parallelism changes nothing but speed: 2 ranks == 1 rank accumulating the same global batch."""

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.train.logger import read_metrics
from tests.integration.test_train_tiny import _launch, _train_rows


def _run(tmp_path, name, nproc, *args):
    proc = _launch(["data.val=null", "train.log_every=1", *args], tmp_path / name, nproc=nproc)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out.decode()[-3000:]
    return tmp_path / name


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors"))


def test_two_rank_ddp_equals_one_rank_grad_accumulation(tmp_path):
    ddp = _run(tmp_path, "ddp", 2, "train.max_steps=4", "train.micro_batch_size=2", "train.grad_accum=1")
    acc = _run(tmp_path, "acc", 1, "train.max_steps=4", "train.micro_batch_size=2", "train.grad_accum=2")
    for a, b in zip(_train_rows(ddp), _train_rows(acc)):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["accept_len"] == pytest.approx(b["accept_len"], rel=1e-6)
    wa, wb = _weights(ddp, 4), _weights(acc, 4)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # make test-slow; make test runs two-rank DDP and resume from a store under DDP
def test_resume_onto_another_world_size_continues(tmp_path):
    args = ["train.max_steps=6", "train.micro_batch_size=2", "train.save_every=3", "train.keep_last=5"]
    two = _run(tmp_path, "two", 2, *args, "train.grad_accum=1")
    # Restart the 2-rank run's step-3 checkpoint on 1 rank with the same global batch.
    one = tmp_path / "one"
    (one / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(two / "checkpoints" / "step_3", one / "checkpoints" / "step_3")
    _run(tmp_path, "one", 1, *args, "train.grad_accum=2", "resume=must")
    want = {r["step"]: r["loss"] for r in _train_rows(two)}
    got = {r["step"]: r["loss"] for r in _train_rows(one)}
    assert sorted(got) == [4, 5, 6]
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=1e-5)
    for name, t in _weights(two, 6).items():
        torch.testing.assert_close(_weights(one, 6)[name], t, rtol=1e-4, atol=1e-6)


def test_fsdp_sharded_target_gives_the_same_training(tmp_path):
    args = ["train.max_steps=3", "train.micro_batch_size=2"]
    plain = _run(tmp_path, "plain", 2, *args)
    sharded = _run(tmp_path, "fsdp", 2, *args, "distributed.target_sharding=fsdp")
    for a, b in zip(_train_rows(plain), _train_rows(sharded)):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for name, t in _weights(plain, 3).items():
        torch.testing.assert_close(_weights(sharded, 3)[name], t, rtol=1e-5, atol=1e-7)

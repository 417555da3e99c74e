"""Data parallelism changes nothing but speed: 2 ranks == 1 rank accumulating the same global batch, and a run
continued on another world size keeps its global batch."""

import contextlib
import io
import shutil

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, tiny_overrides
from tests.integration.test_train_tiny import _launch, _train_rows

EQUAL = ["train.max_steps=4", "train.micro_batch_size=2"]  # 4 rows a step: 2 ranks x 1, or 1 rank x 2


def _run(tmp_path, name, nproc, *args):
    proc = _launch(["data.val=null", "train.log_every=1", *args], tmp_path / name, nproc=nproc)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out.decode()[-3000:]
    return tmp_path / name


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors"))


@pytest.fixture(scope="module")
def equal_runs(tmp_path_factory):
    """The same global batch trained by 2 ranks with grad_accum 1 and by 1 rank with grad_accum 2, to step 4
    (the one rank in this process: a new interpreter's imports would cost more than its 4 steps)."""
    root = tmp_path_factory.mktemp("ddp")
    code, out = _train_here(root / "acc", *EQUAL, "train.grad_accum=2")
    assert code == 0, out[-3000:]
    return _run(root, "ddp", 2, *EQUAL, "train.grad_accum=1"), root / "acc"


def test_two_rank_ddp_equals_one_rank_grad_accumulation(equal_runs):
    ddp, acc = equal_runs
    for a, b in zip(_train_rows(ddp), _train_rows(acc)):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["accept_len"] == pytest.approx(b["accept_len"], rel=1e-6)
    wa, wb = _weights(ddp, 4), _weights(acc, 4)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-6)


def _train_here(run_dir, *args):
    """`blockdraft train` on one rank in this process (as tests/integration/test_train_resume_changes.py runs it):
    the command's exit status and output, without a new interpreter's imports."""
    from blockdraft import cli

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        mp.chdir(REPO)
        mp.delenv("BLOCKDRAFT_FAULT", raising=False)
        code = cli.main(["train", *tiny_overrides(run_dir, "data.val=null", "train.log_every=1", *args)])
    return code, out.getvalue()


def test_a_two_rank_run_continued_on_one_rank_keeps_its_global_batch(equal_runs, tmp_path):
    """The 2-rank run, continued on 1 rank with train.max_steps raised and grad_accum left as the recipe has it,
    resumes at its step-4 checkpoint with grad_accum 2: steps 5 and 6 are those of the 1-rank run continued with
    train.grad_accum=2 given. A world size that cannot split its global batch is refused before anything loads."""
    ddp, acc = (shutil.copytree(run, tmp_path / run.name) for run in equal_runs)
    metrics = (ddp / "metrics.jsonl").read_bytes()
    code, out = _train_here(ddp, "train.micro_batch_size=3", "train.max_steps=6", "resume=auto")
    assert code == 2 and "its global batch of 4 rows per step does not split evenly" in out, out[-3000:]
    assert "train.micro_batch_size=1, 2 or 4" in out and (ddp / "metrics.jsonl").read_bytes() == metrics
    code, out = _train_here(ddp, *EQUAL[1:], "train.max_steps=6", "resume=auto")
    assert code == 0, out[-3000:]
    assert "[train] world size 2 -> 1: grad_accum 1 -> 2 keeps the global batch of 4 rows per step" in out
    assert "step_4 at step 4" in out
    code, reference = _train_here(acc, *EQUAL[1:], "train.grad_accum=2", "train.max_steps=6", "resume=auto")
    assert code == 0 and "step_4 at step 4" in reference, reference[-3000:]
    assert "global batch" not in reference  # the same world size: nothing to say
    got, want = _train_rows(ddp), _train_rows(acc)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6] == [r["step"] for r in want]
    for a, b in zip(got[4:], want[4:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    for name, t in _weights(acc, 6).items():
        torch.testing.assert_close(_weights(ddp, 6)[name], t, rtol=1e-4, atol=1e-6)


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


def test_fsdp_sharded_target_gives_the_same_training(equal_runs, tmp_path):
    plain = equal_runs[0]  # the 2-rank run with the whole target on each rank
    sharded = _run(tmp_path, "fsdp", 2, *EQUAL, "train.grad_accum=1", "distributed.target_sharding=fsdp")
    assert len(_train_rows(sharded)) == 4
    for a, b in zip(_train_rows(plain), _train_rows(sharded)):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for name, t in _weights(plain, 4).items():
        torch.testing.assert_close(_weights(sharded, 4)[name], t, rtol=1e-5, atol=1e-7)

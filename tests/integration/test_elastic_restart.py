"""A rank that dies under the pipeline's torchrun costs a restart, not the run: torchrun restarts the group, the new
attempt resumes from the last checkpoint, and the run ends with the losses of a run never interrupted."""

import os
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from blockdraft import faults
from blockdraft.pipeline.commands import train_argv
from blockdraft.pipeline.settings import parse_overrides
from tests.integration.conftest import REPO, tiny_overrides
from tests.integration.test_train_tiny import _train_rows
from tests.integration.test_distributed import _train_here

ARGS = ("data.val=null", "train.log_every=1", "train.save_every=2", "train.max_steps=6", "train.keep_last=5")
REFERENCE_ARGS = ARGS[2:]  # _train_here adds data.val=null and train.log_every=1
# Rank 1 dies in step 3 (step_2 saved), in the first attempt only: the restarted group must not be killed again.
KILL = "train.after_backward@3~rank=1~attempt=0:kill"


def pipeline_launch(out) -> list:
    """torchrun and its flags as the pipeline's train stage gives them for 2 processes on one node."""
    argv = train_argv(parse_overrides([f"out={out}", "train.nproc=2"]), use_store=False)
    # Every attempt runs this one command: it must resume from the last checkpoint where there is one.
    assert "resume=auto" in argv and "--max-restarts=3" in argv, argv
    return argv[:argv.index("blockdraft.train") + 1]




def launch(run_dir, fault=None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    # overwrite=true as the train stage adds it to a run with no checkpoint yet: a restart must resume regardless.
    cmd = [*pipeline_launch(run_dir.parent / "out"), *tiny_overrides(run_dir, *ARGS, "resume=auto", "overwrite=true")]
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, run_dir) -> str:
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log = (run_dir.parent / f"{run_dir.name}.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    return log


def test_a_rank_killed_mid_run_restarts_the_group_which_resumes_to_the_same_losses(tmp_path):
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    proc = launch(killed, fault=KILL)
    # The uninterrupted run starts once the first has built the recipe's target and rows (shared, built by one run
    # at a time), and runs while the first one's torchrun stops and restarts its group. It is one rank in this
    # process accumulating the same global batch (2 ranks x 4 rows = 1 rank x 4 rows x 2), which trains what two
    # ranks do (tests/integration/test_distributed.py), without a second torchrun's three interpreters.
    deadline = time.monotonic() + 240
    while not (killed / "checkpoints" / "step_2").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    code, out = _train_here(reference, *REFERENCE_ARGS, "train.grad_accum=2")
    assert code == 0, out[-3000:]
    log = finish(proc, killed)
    assert log.count("[fault] train.after_backward: kill") == 1, log[-3000:]  # the restarted rank 1 was spared
    assert "failed (exitcode: -9) local_rank: 1" in log, log[-3000:]  # torchrun saw rank 1 die, then restarted
    # The restarted group formed at once: it did not read the dead attempt's addresses from the shared store.
    assert "connectFullMesh" not in log and log.count("failed (exitcode") == 1, log[-3000:]
    assert f"[resume] continuing from {killed / 'checkpoints' / 'step_2'} at step 2" in log, log[-3000:]
    want, got = _train_rows(reference), _train_rows(killed)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6] == [r["step"] for r in want]
    for a, b in zip(got, want):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]
    final = "checkpoints/step_6/model.safetensors"
    for name, t in load_file(str(reference / final)).items():
        torch.testing.assert_close(load_file(str(killed / final))[name], t, rtol=1e-4, atol=1e-6)
    assert not (killed / ".lock").exists()


def test_a_fault_can_be_limited_to_one_rank_and_attempt():
    spec = "train.after_backward@3~rank=1~attempt=0:kill, p.any:raise"
    assert faults.parse(spec, {"rank": 1, "attempt": 0}) == {
        "train.after_backward": (3, False, "kill", 0.0), "p.any": (1, False, "raise", 0.0)}
    assert faults.parse(spec, {"rank": 0, "attempt": 0}) == faults.parse(spec, {"rank": 1, "attempt": 1}) == {
        "p.any": (1, False, "raise", 0.0)}
    for typo in ("x~rank:kill", "x~node=1:kill", "x~attempt=first:kill"):
        with pytest.raises(ValueError, match="cannot read"):
            faults.parse(typo)


def test_every_node_names_the_same_job_and_torchrun_takes_the_flags(tmp_path):
    from torch.distributed.run import get_args_parser

    from blockdraft.errors import ConfigError

    nodes = [f"out={tmp_path / 'out'}", "train.nproc=8", "train.nnodes=2", "train.rdzv_endpoint=node0:29500"]
    node0 = train_argv(parse_overrides([*nodes, "train.node_rank=0"]), use_store=True)
    node1 = train_argv(parse_overrides([*nodes, "train.node_rank=1", "train.max_restarts=0"]), use_store=True)
    elsewhere = train_argv(parse_overrides([f"out={tmp_path / 'other'}", *nodes[1:]]), use_store=True)
    args0, args1, args_else = (get_args_parser().parse_args(argv[3:]) for argv in (node0, node1, elsewhere))
    # One rendezvous id on every node (their agents meet), kept by every restart; another run's is another.
    assert args0.rdzv_id == args1.rdzv_id != args_else.rdzv_id and args0.rdzv_id.startswith("blockdraft-")
    assert (args0.rdzv_backend, args0.max_restarts, args1.max_restarts) == ("c10d", 3, 0)
    assert "resume=auto" in args0.training_script_args
    with pytest.raises(ConfigError, match="train.max_restarts=-1: use 0 or more"):
        parse_overrides([*nodes, "train.max_restarts=-1"])
    # One process on one node: no torchrun, nothing to restart.
    assert "torch.distributed.run" not in train_argv(parse_overrides([f"out={tmp_path / 'out'}"]), use_store=True)

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, python, tiny_overrides


def _train_rows(run_dir):
    return [r for r in read_metrics(run_dir) if "split" not in r]


@pytest.mark.parametrize("fixture", ["tiny_dflash_run", "tiny_dflash2_run"])
def test_tiny_run_learns_and_writes_its_run_dir(fixture, request):
    run_dir = request.getfixturevalue(fixture)
    rows = _train_rows(run_dir)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.2
    assert rows[-1]["accept_len"] > rows[0]["accept_len"] + 0.3
    assert (run_dir / "config.yaml").exists()
    final = run_dir / "checkpoints" / "step_120"
    assert {"model.safetensors", "draft_config.json", "trainer_state.pt", "config.yaml"} <= {p.name for p in final.iterdir()}
    val = [r for r in read_metrics(run_dir) if r.get("split") == "val"]
    assert val and val[-1]["val/accept_len"] > 1.5


def test_dflash2_reports_selector_metrics(tiny_dflash2_run):
    last = _train_rows(tiny_dflash2_run)[-1]
    assert 0 < last["candidate_recall"] <= 1
    assert last["selector_acc"] >= last["base_acc"] - 0.05


def _launch(args, run_dir, nproc=1, extra_env=None):
    cmd = [python(), "-m", "blockdraft.train"] if nproc == 1 else [
        python(), "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m", "blockdraft.train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return subprocess.Popen([*cmd, *tiny_overrides(run_dir, *args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


# Slow (make test-slow): make test's tests/integration/test_distributed.py runs two ranks under torchrun and
# compares their rows and step-4 checkpoint with one rank's (a second writer's rows would break the pairing).
@pytest.mark.slow
def test_torchrun_two_processes_on_cpu(tmp_path):
    proc = _launch(["train.max_steps=20"], tmp_path / "run", nproc=2)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out.decode()[-3000:]
    rows = _train_rows(tmp_path / "run")
    assert rows[-1]["step"] == 20
    assert len(read_metrics(tmp_path / "run")) == len(rows) + 1  # rank 0 alone wrote (one val line)
    assert (tmp_path / "run" / "checkpoints" / "step_20" / "model.safetensors").exists()


# Slow (make test-slow): make test's fault suite SIGKILLs training at its fault points and compares the
# resumed run with an uninterrupted one (tests/faults/test_kills.py).
@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(tmp_path):
    args = ["train.max_steps=300", "train.save_every=20", "train.log_every=20", "train.keep_last=20"]
    killed = tmp_path / "killed"
    proc = _launch(args, killed)
    deadline = time.time() + 240
    while not (killed / "checkpoints" / "step_20").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before its first checkpoint"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode != 0, "the run finished before it could be killed"
    resumed = _launch([*args, "resume=auto"], killed)
    full = _launch(args, tmp_path / "full")
    for p in (resumed, full):
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out.decode()[-3000:]
    want = {r["step"]: r["loss"] for r in _train_rows(tmp_path / "full")}
    got = {r["step"]: r["loss"] for r in _train_rows(killed)}  # killed lines + resumed lines
    for step in (280, 300):
        assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6)
    a = load_file(str(killed / "checkpoints" / "step_300" / "model.safetensors"))
    b = load_file(str(tmp_path / "full" / "checkpoints" / "step_300" / "model.safetensors"))
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6)


def test_wandb_offline_logs_the_run(tmp_path):
    from tests.integration.conftest import train_tiny

    run_dir = train_tiny(tmp_path / "run", "train.max_steps=10", "train.log_every=5", "wandb.mode=offline", "data.val=null")
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert any(f.suffix == ".wandb" and f.stat().st_size > 0 for f in runs[0].iterdir())

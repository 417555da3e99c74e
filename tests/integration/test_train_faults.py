"""Training loses nothing to preemption, concurrent runs, corrupt files or a reused run_dir."""

import json
import os
import signal
import socket
import time

import pytest

from blockdraft.errors import ConfigError, DataError
from blockdraft.train.checkpoint import complete_checkpoints
from tests.integration.conftest import train_tiny
from tests.integration.test_train_tiny import _launch, _train_rows


def _wait_for(predicate, proc, seconds=240):
    deadline = time.time() + seconds
    while not predicate():
        assert proc.poll() is None and time.time() < deadline, "the run ended or stalled"
        time.sleep(0.02)


# Slow (make test-slow): make test's fault suite sends SIGTERM at a fault point, checks the checkpoint and
# the exit status 143, and resumes to the uninterrupted run's result (tests/faults/test_kills.py).
@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_resume_continues(tmp_path):
    run = tmp_path / "run"
    proc = _launch(["train.max_steps=100000", "train.log_every=5", "data.val=null"], run)
    _wait_for(lambda: (run / "metrics.jsonl").exists(), proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out.decode()[-2000:]
    saved = complete_checkpoints(run)
    assert len(saved) == 1
    step = int(saved[0].name.split("_")[1])
    assert step >= 5
    resumed = _launch([f"train.max_steps={step + 5}", "train.log_every=5", "data.val=null", "resume=must"], run)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out.decode()[-2000:]
    assert _train_rows(run)[-1]["step"] == step + 5


def test_second_run_on_the_same_run_dir_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": "now"}))
    with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()}"):
        train_tiny(run, "train.max_steps=2")


def test_stale_lock_is_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 12345, "since": "then"}))
    train_tiny(run, "train.max_steps=2", "data.val=null")
    assert not (run / ".lock").exists()


def test_reused_run_dir_needs_resume_or_overwrite(tmp_path):
    run = train_tiny(tmp_path / "run", "train.max_steps=2", "data.val=null")
    with pytest.raises(ConfigError, match="overwrite=true"):
        train_tiny(run, "train.max_steps=2", "data.val=null")
    train_tiny(run, "train.max_steps=3", "data.val=null", "overwrite=true")
    assert [r["step"] for r in _train_rows(run)] == [3]


def test_corrupt_checkpoint_is_named_on_resume(tmp_path):
    run = train_tiny(tmp_path / "run", "train.max_steps=2", "data.val=null")
    weights = run / "checkpoints" / "step_2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="model.safetensors is corrupt"):
        train_tiny(run, "train.max_steps=4", "data.val=null", "resume=auto")


def test_torn_metrics_line_is_dropped_on_resume(tmp_path):
    run = train_tiny(tmp_path / "run", "train.max_steps=2", "train.log_every=1", "data.val=null")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "loss": 1.')  # a kill in the middle of a write
    train_tiny(run, "train.max_steps=4", "train.log_every=1", "data.val=null", "resume=auto")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]

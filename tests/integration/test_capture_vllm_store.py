"""`python -m blockdraft.capture ... backend=vllm`: the tiny recipe's store captured through a real vLLM CPU server
(extract_hidden_states and the project's connector) holds the rows the transformers capture holds, training reads
it, and a capture killed mid-way leaves no server running and resumes with nothing lost or doubled."""

import json
import os
import shutil
import subprocess
import time

import pytest

from blockdraft.train.checkpoint import complete_checkpoints
from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON
from tests.integration.conftest import REPO, SHARD_ROWS, capture_tiny, python, train_tiny
from tests.integration.test_capture_by_shard import assert_same_rows

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not DEFAULT_VLLM_PYTHON.is_file(), reason="no vLLM serving environment: run `make setup-serve`"),
]

THROUGH_VLLM = ["backend=vllm", "storage_dtype=float32", "vllm.kv_cache_gib=1", "vllm.workers=8"]
ENGINES_DIFFER = ("backend",)


SOFT_LABELS = ["train.kl_weight=1.0", "train.teacher_top_k=8"]


def test_a_store_captured_through_vllm_is_the_transformers_store_and_trains(tmp_path):
    """With soft labels: the teacher's top-k from the engine's prompt logprobs (raw logits, one position on)."""
    store = capture_tiny(tmp_path / "store", *THROUGH_VLLM, *SOFT_LABELS)
    index = json.loads((store / "index.json").read_text())
    assert index["identity"]["backend"] == "vllm" and index["identity"]["teacher_top_k"] == 8
    assert_same_rows(store, capture_tiny(tmp_path / "by-transformers", "storage_dtype=float32", *SOFT_LABELS),
                     unlike=ENGINES_DIFFER)
    assert not (store / "vllm_scratch").exists()  # every request's file read and removed
    run = train_tiny(tmp_path / "run", f"data.features={store}", *SOFT_LABELS, "train.max_steps=2", "train.save_every=2")
    assert [c.name for c in complete_checkpoints(run)] == ["step_2"]


def servers_of(out) -> list:
    """The pids of processes whose command line names this store (the capture servers write into it)."""
    found = subprocess.run(["pgrep", "-f", f"capture_dir.*{out}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.slow
def test_a_capture_through_vllm_killed_mid_way_leaves_no_server_and_resumes(fp32_store, tmp_path):
    out = tmp_path / "store"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "BLOCKDRAFT_FAULT": "capture.after_shard@2:kill"}
    cmd = [python(), "-m", "blockdraft.capture", "experiment=tiny_cpu", *THROUGH_VLLM, f"rows_per_shard={SHARD_ROWS}",
           "train.progress=false", f"out={out}"]
    killed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0, killed.stdout[-2000:] + killed.stderr[-2000:]
    deadline = time.monotonic() + 60
    while servers_of(out) and time.monotonic() < deadline:  # the parent-death signal stops the server
        time.sleep(1)
    assert servers_of(out) == []
    finished = {p: p.stat().st_mtime_ns for p in (r.with_suffix(".safetensors") for r in (out / "train").glob("shard-*.json"))}
    assert len(finished) == 2

    resumed = subprocess.run([c for c in cmd], cwd=REPO, env={**env, "BLOCKDRAFT_FAULT": ""}, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "train: resuming after 2 finished shard(s) of 4" in resumed.stdout
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # not captured again
    assert_same_rows(out, fp32_store, unlike=ENGINES_DIFFER)
    shutil.rmtree(out)

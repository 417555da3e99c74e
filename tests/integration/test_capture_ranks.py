"""The capture over ranks: two gloo ranks under torchrun write the store one process writes, and a killed
two-rank capture resumes, on two ranks or on one, losing no shard and writing none twice."""

import json
import os
import re
import shutil
import subprocess

import torch

from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset
from tests.integration.conftest import REPO, SHARD_ROWS, capture_tiny, python

STORE_ARGS = ["experiment=tiny_cpu", "storage_dtype=float32", f"rows_per_shard={SHARD_ROWS}", "train.progress=false"]


def capture_on_ranks(out, nproc: int, fault: str = "", extra=()) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **({"BLOCKDRAFT_FAULT": fault} if fault else {})}
    cmd = [python(), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "blockdraft.capture", *STORE_ARGS, *extra, f"out={out}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def assert_same_store(got, want) -> None:
    """The same identity, shards and rows in the same order; every row's tensors equal."""
    a, b = json.loads((got / "index.json").read_text()), json.loads((want / "index.json").read_text())
    assert a["identity"] == b["identity"] and set(a["splits"]) == set(b["splits"])
    for split in b["splits"]:
        listed = [[(s["file"], s["rows"], s["tokens"]) for s in idx["splits"][split]["shards"]] for idx in (a, b)]
        assert a["splits"][split]["complete"] and listed[0] == listed[1]
        rows_a, rows_b = (FeatureStoreDataset(FeatureStore.open(root), split) for root in (got, want))
        assert len(rows_a) == len(rows_b) == b["splits"][split]["rows"]
        for i in range(len(rows_b)):
            ra, rb = rows_a[i], rows_b[i]
            assert ra.keys() == rb.keys()
            for name in rb:  # ids and masks exactly; features to float32 noise between processes
                torch.testing.assert_close(ra[name], rb[name], rtol=1e-5, atol=1e-6)
    # The journal of a capture in flight is gone once the store is listed.
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.suffix in (".json", ".tmp")) == ["index.json"]


def test_two_ranks_capture_the_store_one_process_captures(fp32_store, tmp_path):
    done = capture_on_ranks(tmp_path / "two", 2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    shares = {int(r): int(n) for r, n in re.findall(r"train on rank (\d) of 2: (\d+) shard", done.stdout)}
    assert shares == {0: 2, 1: 2}  # the tiny recipe's 4 training shards, shared out
    assert_same_store(tmp_path / "two", fp32_store)


def test_a_killed_two_rank_capture_resumes_losing_nothing_and_doubling_nothing(fp32_store, tmp_path):
    out = tmp_path / "store"
    killed = capture_on_ranks(out, 2, fault="capture.after_shard@1:kill")  # each rank, after its first shard
    assert killed.returncode != 0
    receipts = sorted((out / "train").glob("shard-*.json"))
    finished = {r.with_suffix(".safetensors"): r.with_suffix(".safetensors").stat().st_mtime_ns for r in receipts}
    assert 1 <= len(finished) <= 2
    aside = tmp_path / "aside"
    shutil.copytree(out, aside)  # the same killed store, for a resume on one process
    aside_finished = {aside / p.relative_to(out): (aside / p.relative_to(out)).stat().st_mtime_ns for p in finished}

    resumed = capture_on_ranks(out, 2)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"train: resuming after {len(finished)} finished shard(s) of 4" in resumed.stdout
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # finished shards not captured again
    assert_same_store(out, fp32_store)

    # Another world size resumes the same journal: the shards still missing are shared out anew.
    capture_tiny(aside, "storage_dtype=float32")
    assert {p: p.stat().st_mtime_ns for p in aside_finished} == aside_finished
    assert_same_store(aside, fp32_store)

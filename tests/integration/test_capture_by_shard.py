"""The capture with the target loaded by shard (distributed.target_sharding=fsdp), as online training loads it:
gloo ranks each holding a slice of every layer write the rows one process writes with the whole target, though
their shares of shards (and so of forwards) differ; a killed sharded capture resumes on another world size."""

import json
import re
import shutil

import pytest
import torch

from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset
from tests.integration.test_capture_ranks import capture_on_ranks

BY_SHARD = ["distributed.target_sharding=fsdp", "distributed.startup_timeout_s=60", "distributed.timeout_s=60"]
UNEVEN = "rows_per_shard=24"  # 64 training rows -> shards of 24, 24 and 16 rows: 2 ranks get 2 and 1 of them


def assert_same_rows(got, want, unlike=("rows_per_shard",)) -> None:
    """The same identity but for the keys `unlike` and, split by split, the same rows in the same order (whatever
    the shard size): ids and masks exactly, features to float32 noise between processes, shardings and engines."""
    a, b = json.loads((got / "index.json").read_text()), json.loads((want / "index.json").read_text())
    shardless = [{k: v for k, v in x["identity"].items() if k not in unlike} for x in (a, b)]
    assert shardless[0] == shardless[1] and set(a["splits"]) == set(b["splits"])
    for split in b["splits"]:
        assert a["splits"][split]["complete"]
        rows_a, rows_b = (FeatureStoreDataset(FeatureStore.open(root), split) for root in (got, want))
        assert len(rows_a) == len(rows_b) == b["splits"][split]["rows"]
        for i in range(len(rows_b)):
            ra, rb = rows_a[i], rows_b[i]
            assert ra.keys() == rb.keys()
            for name in rb:
                if rb[name].is_floating_point():
                    torch.testing.assert_close(ra[name], rb[name], rtol=1e-5, atol=1e-5)
                else:
                    assert torch.equal(ra[name], rb[name]), (split, i, name)


def shard_sizes(store, split="train"):
    index = json.loads((store / "index.json").read_text())
    return [s["rows"] for s in index["splits"][split]["shards"]]


def test_two_ranks_holding_the_target_by_shard_capture_what_one_process_does(fp32_store, tmp_path):
    done = capture_on_ranks(tmp_path / "sharded", 2, extra=[*BY_SHARD, UNEVEN])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    shares = {int(r): int(n) for r, n in re.findall(r"train on rank (\d) of 2: (\d+) shard", done.stdout)}
    assert shares == {0: 1, 1: 2} or shares == {0: 2, 1: 1}, shares  # unequal shares: stand-ins kept them in step
    assert "the target loaded by shard over 2 ranks" in done.stdout
    assert shard_sizes(tmp_path / "sharded") == [24, 24, 16]
    assert_same_rows(tmp_path / "sharded", fp32_store)


@pytest.mark.slow
def test_a_killed_sharded_capture_resumes_on_three_ranks(fp32_store, tmp_path):
    out = tmp_path / "store"
    killed = capture_on_ranks(out, 2, fault="capture.after_shard@1:kill", extra=[*BY_SHARD, UNEVEN])
    assert killed.returncode != 0
    finished = {p: p.stat().st_mtime_ns for p in (r.with_suffix(".safetensors") for r in (out / "train").glob("shard-*.json"))}
    assert 1 <= len(finished) <= 2
    aside = tmp_path / "aside"
    shutil.copytree(out, aside)

    # Three ranks share the one or two shards left: at least one has none and runs only stand-ins.
    resumed = capture_on_ranks(out, 3, extra=[*BY_SHARD, UNEVEN])
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"train: resuming after {len(finished)} finished shard(s) of 3" in resumed.stdout
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
    assert_same_rows(out, fp32_store)

    # One process (the whole target) finishes the same journal alike.
    again = capture_on_ranks(aside, 1, extra=[UNEVEN])
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert_same_rows(aside, fp32_store)

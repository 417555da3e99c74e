"""distributed.target_mesh: the target's layers sharded within each node (replicated across nodes) or over every
rank, on 4 gloo ranks started as two torchrun "nodes" of two ranks each, against one process with the whole
target; and the key's refusals."""

import json
import os
import socket
import subprocess
import sys

import pytest

from blockdraft.errors import ConfigError
from blockdraft.models.target_sharding import check_target_mesh
from tests.integration.conftest import REPO

NODES, PER_NODE = 2, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(every rank's report, the bytes of the target's decoder layers, q_proj's rows)."""
    import transformers

    from blockdraft.models.tiny_target import save_tiny_target

    tmp = tmp_path_factory.mktemp("target_mesh")
    target = save_tiny_target(tmp / "target", "qwen3", num_layers=4)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}
    port = _free_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--nproc_per_node={PER_NODE}",
         f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}",
         str(REPO / "tests/integration/target_mesh_worker.py"), str(target), str(tmp)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in range(NODES)]
    try:
        outputs = [agent.communicate(timeout=240)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for agent, output in zip(agents, outputs):
        assert agent.returncode == 0, output[-6000:]
    layers = transformers.AutoModelForCausalLM.from_pretrained(target).model.layers
    layer_bytes = sum(p.numel() * p.element_size() for p in layers.parameters())
    reports = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(NODES * PER_NODE)]
    return reports, layer_bytes, layers[0].self_attn.q_proj.weight.shape[0]


def test_node_mesh_holds_a_node_shard_and_computes_the_whole_target(run):
    reports, layer_bytes, q_rows = run
    for report in reports:
        rank, node = report["rank"], report["meshes"]["node"]
        assert report["group_rank"] == rank // PER_NODE  # torchrun numbers a node's ranks consecutively
        assert node["mesh_shape"] == [NODES, PER_NODE]
        assert node["placements"] == ["Replicate", "Shard"]  # replicated across nodes, sharded within one
        # Rank r holds the rows of its place in its node: the same rows as its counterpart on the other node.
        local = rank % PER_NODE
        assert node["q_rows"] == [local * q_rows // PER_NODE, (local + 1) * q_rows // PER_NODE]
        assert node["local_bytes"] == layer_bytes // PER_NODE  # every tensor of these layers has an even row count
        assert node["equal"]  # features, final hidden states and the early-stopped features of the whole target


def test_global_mesh_shards_over_every_rank(run):
    reports, layer_bytes, q_rows = run
    world = NODES * PER_NODE
    for report in reports:
        rank, flat = report["rank"], report["meshes"]["global"]
        assert flat["mesh_shape"] == [world]
        assert flat["placements"] == ["Shard"]
        assert flat["q_rows"] == [rank * q_rows // world, (rank + 1) * q_rows // world]
        assert flat["local_bytes"] == layer_bytes // world
        assert flat["equal"]


@pytest.mark.parametrize("mesh", ["node", "global"])
def test_layers_reshard_after_forward_and_the_next_one_is_prefetched(run, mesh):
    for report in run[0]:
        row = report["meshes"][mesh]
        # After forwards (whole, and stopped after a captured layer) every layer is a sharded DTensor again.
        assert row["sharded_after_forward"]
        assert row["local_bytes"] == run[0][0]["meshes"][mesh]["local_bytes"]
        # Layer i + 1's all-gather is issued before layer i's forward ends; but for the deepest captured layer's
        # (1) successor, which a features-only pass never runs.
        assert row["prefetched"] == [True, False, True]
        # Between forwards FSDP2 holds no gathered buffer and no half-finished forward, even after a features-only
        # pass stopped out of the layer loop; and, forward-only, its record of forwards (kept for a backward's
        # prefetch) does not grow run after run.
        idle = {"forward_records": 0, "gather_held": False, "mid_forward": False}
        assert row["after_stop"] == idle
        assert row["after_forwards"] == idle


def test_target_mesh_refusals():
    check_target_mesh("global", "none", {})
    check_target_mesh("node", "fsdp", {})  # one process, or a pipeline checking its stages before torchrun
    check_target_mesh("node", "fsdp", {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
    with pytest.raises(ConfigError, match="use one of \\['global', 'node'\\]"):
        check_target_mesh("nodes", "fsdp", {})
    with pytest.raises(ConfigError, match="set distributed.target_sharding=fsdp, or leave distributed.target_mesh=global"):
        check_target_mesh("node", "none", {})
    with pytest.raises(ConfigError, match="WORLD_SIZE=12 is not a whole number of nodes of LOCAL_WORLD_SIZE=8"):
        check_target_mesh("node", "fsdp", {"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"})
    with pytest.raises(ConfigError, match="launch with torchrun"):
        check_target_mesh("node", "fsdp", {"WORLD_SIZE": "4"})


def test_fsdp_refuses_a_torch_older_than_pyproject_allows(monkeypatch):
    import torch

    from blockdraft.models.target_sharding import MIN_TORCH, check_strategy

    assert f'"torch>={MIN_TORCH},' in (REPO / "pyproject.toml").read_text()  # the refusal is pyproject's floor
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")  # a GPU machine's own torch, installed outside pip
    check_strategy("none")
    with pytest.raises(ConfigError, match="needs torch >= 2.6 .* this is torch 2.5.1.*set distributed.target_sharding=none"):
        check_strategy("fsdp")

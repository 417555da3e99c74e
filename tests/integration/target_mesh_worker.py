"""One rank of tests/integration/test_target_mesh.py, started by one of two torchrun agents (two "nodes" of two
ranks): loads a target by shard over each target mesh, checks what each rank holds and what the sharded target
computes against the whole one, and writes a report for the test to assert on."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

LAYER_IDS = [0, 1]  # the deepest captured layer is not the last: a features-only pass stops before layer 3


def layer_report(layers) -> dict:
    from torch.distributed.tensor import DTensor

    from blockdraft.models.shard_reader import local_rows

    params = dict(layers.named_parameters())
    q = params["0.self_attn.q_proj.weight"]
    return {
        "all_sharded": all(isinstance(p, DTensor) for p in params.values()),
        "local_bytes": sum(p.to_local().numel() * p.element_size() for p in params.values()),
        "mesh_shape": list(q.device_mesh.shape),
        "placements": [type(p).__name__ for p in q.placements],
        "q_rows": list(local_rows(q)),
    }


def prefetched_while_running(target, ids) -> list:
    """For each layer i but the last, whether layer i + 1's all-gather starts before layer i's forward ends
    (FSDP2's own profiler labels: `FSDP::all_gather (layers.i)`, `FSDP::post_forward (layers.i)`)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        target.capture_with_final(ids)
    starts = {}
    for event in prof.events():
        starts.setdefault(event.name, event.time_range.start)
    n = len(target.decoder_layers)
    gathers = [starts.get(f"FSDP::all_gather (layers.{i})") for i in range(n)]
    ends = [starts.get(f"FSDP::post_forward (layers.{i})") for i in range(n)]
    if None in gathers or None in ends:
        raise AssertionError(f"FSDP2's profiler labels not found: {sorted(k for k in starts if k.startswith('FSDP'))}")
    return [gathers[i + 1] < ends[i] for i in range(n - 1)]


def fsdp_state(target) -> dict:
    """What FSDP2 (private state, shared by the units of one root) keeps between two forwards."""
    from torch.distributed.fsdp import fully_shard

    state = fully_shard.state(target.decoder_layers[0])
    return {
        "forward_records": len(state._comm_ctx.post_forward_order),  # kept for a backward that never comes
        "gather_held": state._comm_ctx.all_gather_state is not None,  # a layer's all-gather output
        "mid_forward": state._state_ctx.iter_forward_root is not None,  # a root whose post-forward never ran
    }


def main(path: str, out: str) -> None:
    from blockdraft.models.target import TargetModel, load_causal_lm
    from blockdraft.models.target_sharding import load_sharded_target
    from blockdraft.ranks.distributed import DistInfo

    dist.init_process_group("gloo")
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"]), torch.device("cpu"))
    whole = TargetModel(load_causal_lm(path), LAYER_IDS)
    x = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(info.rank))
    want_features, want_final = whole.capture_with_final(x)
    want_early = whole.capture(x)
    report = {"rank": info.rank, "group_rank": int(os.environ["GROUP_RANK"]), "meshes": {}}
    for mesh in ("node", "global"):
        target = TargetModel(load_sharded_target(path, LAYER_IDS, True, torch.float32, info, mesh=mesh), LAYER_IDS)
        row = layer_report(target.decoder_layers)
        got_features, got_final = target.capture_with_final(x)
        torch.testing.assert_close(got_features, want_features)
        torch.testing.assert_close(got_final, want_final)
        torch.testing.assert_close(target.capture(x), want_early)  # stops after layer 1, out of the layer loop
        row["after_stop"] = fsdp_state(target)
        torch.testing.assert_close(target.capture_with_final(x)[0], want_features)  # and the next pass is whole
        row["equal"] = True
        row["sharded_after_forward"] = layer_report(target.decoder_layers)["all_sharded"]
        row["prefetched"] = prefetched_while_running(target, x)
        row["after_forwards"] = fsdp_state(target)
        report["meshes"][mesh] = row
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

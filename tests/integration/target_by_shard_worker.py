"""One rank of tests/integration/test_target_by_shard.py: loads a target by shard, measuring its resident
memory, then checks what a sharded target computes against the whole one. Run under torchrun."""

import json
import resource
import sys
from pathlib import Path

import torch


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _import_what_loading_imports() -> None:
    """Code is not the target: modules a load imports lazily are imported before memory is measured."""
    import transformers
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    from torch.distributed.tensor import DTensor  # noqa: F401

    import blockdraft.models.shard_reader  # noqa: F401

    transformers.Qwen3ForCausalLM  # noqa: B018 (transformers imports a model's module on first access)


def main(big: str, families: list, out: str) -> None:
    from blockdraft.models.target import TargetModel, load_causal_lm
    from blockdraft.models.target_sharding import load_sharded_target
    from blockdraft.ranks.distributed import init_distributed, shutdown

    dist = init_distributed()
    _import_what_loading_imports()
    torch.distributed.barrier()
    before = resident_bytes()
    target = load_sharded_target(big, [0, 5], True, torch.float32, dist)
    layers = target.model.layers
    local = sum(p.to_local().numel() * p.element_size() for p in layers.parameters())
    ids = torch.arange(64)[None] % 200
    TargetModel(target, [0, 5]).capture_with_final(ids)  # a forward gathers the layers one at a time
    report = {"load_peak_growth": peak_bytes() - before, "local_layer_bytes": local}
    for path in families:  # the checkpoint names transformers converts: fused experts, renamed prefixes
        ids = [0, 2]
        sharded, whole = TargetModel(load_sharded_target(path, ids, True, torch.float32, dist), ids), TargetModel(load_causal_lm(path), ids)
        x = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(dist.rank))
        (a, fa), (b, fb) = sharded.capture_with_final(x), whole.capture_with_final(x)
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(fa, fb)
        torch.testing.assert_close(sharded.capture(x), whole.capture(x))
        report[Path(path).name] = "equal"
    Path(out, f"rank{dist.rank}.json").write_text(json.dumps(report))
    # As every launched command ends: the ranks meet, then the group goes. A rank that exits with its group
    # and rank watch alive can abort in their destructors ("terminate called without an active exception").
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:], sys.argv[2])

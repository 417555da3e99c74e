"""How the frozen target is spread over the data-parallel ranks.

none: every rank holds the whole target (fastest when it fits).
fsdp: each decoder layer is sharded with FSDP2 (`fully_shard`) across all ranks and
      gathered layer by layer during the forward; embeddings and head stay replicated,
      since the draft reads them directly. Memory per rank ~ (layers / world) + embeddings.
"""

from __future__ import annotations

from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.train.distributed import DistInfo

STRATEGIES = ("none", "fsdp")


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"distributed.target_sharding={strategy!r}; use one of {list(STRATEGIES)} "
            "(tensor parallelism of the target is not supported yet)."
        )


def shard_target(model: nn.Module, strategy: str, dist: DistInfo) -> nn.Module:
    check_strategy(strategy)
    if strategy == "none" or not dist.enabled:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    from blockdraft.models.target_families import backbone_of, family_of

    for layer in backbone_of(model, family_of(model.config.architectures)).layers:
        fully_shard(layer, mesh=mesh)
    return model
